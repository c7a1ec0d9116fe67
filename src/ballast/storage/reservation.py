"""The owner's claim on a topic's state key, and the offsets it has reserved.

Opening a topic claims it: the state key (``keys.storage_state(topic)``) gets an unsealed
record with the owner's id and `reserved_through`, fenced on the revision the owner read.
The owner's WAL assigns no offset beyond `reserved_through`; before it would, the
reservation is extended by another write to the key. Every write of the owner to the key
(extending, releasing on close, sealing) is fenced on the revision of its previous one, so
once another broker has claimed the topic, the deposed owner can neither extend its
reservation (its appends beyond it fail with `TopicFencedError`) nor seal.

Whoever opens the topic after a crash continues after the reservation, so it never reuses
an offset the crashed owner may have assigned, even when that owner's disk is gone.

The claim is also the fence of everything else the owner writes for the topic: a commit of
appended records (`commit`: the descriptor of an uploaded object, written together with a
fresh copy of the state, so that a new owner's claim, fenced on the state's revision, is
ordered after every commit it did not see) and the subscription cursors (`fenced_put`).
Once another broker has claimed the topic, every one of these writes fails, so a deposed
owner — stalled, partitioned or a zombie — can never acknowledge a send again.
Extensions happen early (when less than half a step is left) in the background, so
appends normally never wait for the metadata store: one write per
`offset_reservation_step` offsets. A graceful close releases the unused part.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Protocol, Self

from ballast.clock import Clock
from ballast.metadata import keys
from ballast.metadata.store import (
    MAX_TXN_OPS,
    Compare,
    Delete,
    MetadataError,
    MetadataStore,
    Put,
    TxnOp,
)
from ballast.model import TopicName
from ballast.storage.config import StorageConfig
from ballast.storage.seal import SealedState, StateError
from ballast.storage.stats import StorageStats

__all__ = [
    "Handoff",
    "ReservationError",
    "TopicClaim",
    "TopicFencedError",
    "commit_together",
]

log = logging.getLogger(__name__)

# After a failed background extension, wait this long before trying early again (an
# append that needs the extension still tries at once).
_EARLY_RETRY_SECONDS = 1.0
_EXTEND_ATTEMPTS = 2


class TopicFencedError(RuntimeError):
    """Another broker took the topic over: this owner's write to its state was refused."""


class ReservationError(RuntimeError):
    """The offset reservation could not be extended (metadata store failure); retryable."""


class Handoff(Protocol):
    """What a seal may write in the sealed state's own transaction: a move's marker made
    ready, so the next owner is chosen without another round trip after the seal."""

    async def writes(self) -> tuple[Sequence[Compare], Sequence[TxnOp]] | None:
        """The conditions and the writes, or None (nothing to hand off: seal alone)."""
        ...

    def written(self) -> None:
        """Called once they were written with the sealed state."""
        ...


class TopicClaim:
    """This broker's claim on a topic and its offset reservation (an `OffsetReserver`).

    ``async with claim:`` scopes the background extension task; the writes (`claim`,
    `ensure`, `release`, `write_sealed`) are serialized and each fenced on the previous.
    """

    def __init__(
        self,
        topic: TopicName,
        metadata: MetadataStore,
        *,
        broker_id: str,
        clock: Clock,
        config: StorageConfig | None = None,
        stats: StorageStats | None = None,
    ) -> None:
        self.topic = topic
        self.broker_id = broker_id
        self.key = keys.storage_state(topic)
        self._metadata = metadata
        self._clock = clock
        self._step = (config or StorageConfig()).offset_reservation_step
        self._stats = stats or StorageStats()
        self._state: SealedState | None = None  # what this owner wrote last
        self._revision = 0  # mod revision of that write
        self._limit = -1  # highest offset that may be assigned now
        self._lock = asyncio.Lock()
        self._inflight: asyncio.Task[None] | None = None
        self._uncertain: list[SealedState] = []  # writes whose outcome is unknown
        self._fenced = False
        self._done = False  # released or sealed: no more extensions
        self._early_retry_at = -math.inf
        self._name = f"claim{topic}"

    # -- state ---------------------------------------------------------------------------

    @property
    def state(self) -> SealedState:
        """The state this owner wrote last."""
        if self._state is None:
            raise RuntimeError(f"{self._name}: not claimed yet")
        return self._state

    @property
    def limit(self) -> int:
        """Highest offset that may be assigned now (-1 once fenced)."""
        return self._limit

    @property
    def reserved_through(self) -> int:
        """The reservation as written in the metadata store (-1 before the claim)."""
        state = self._state
        return -1 if state is None or state.reserved_through is None else state.reserved_through

    @property
    def fenced(self) -> bool:
        """True once a write was refused because another broker claimed the topic."""
        return self._fenced

    # -- service lifecycle -----------------------------------------------------------------

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._inflight = self._inflight, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    # -- writes ----------------------------------------------------------------------------

    async def claim(self, expected_revision: int, state: SealedState) -> None:
        """Write the owner's unsealed record if the key is still at `expected_revision`."""
        compares, ops = self._claim_txn(expected_revision, state)
        async with self._lock:
            # If this fails but got through, whoever opens next continues after it: safe.
            txn = await self._metadata.txn(compares, ops)
            if not txn.succeeded:
                raise TopicFencedError(
                    f"{self.topic}: the storage state changed while opening; another broker "
                    "is taking the topic over"
                )
            self._claimed(state, txn.revision)

    def _claim_txn(
        self, expected_revision: int, state: SealedState
    ) -> tuple[list[Compare], list[TxnOp]]:
        if state.sealed or state.reserved_through is None:
            raise ValueError(f"{self._name}: a claim is unsealed and has a reservation")
        return [Compare.mod_revision_equals(self.key, expected_revision)], [
            Put(self.key, state.to_dict())
        ]

    def _claimed(self, state: SealedState, revision: int) -> None:
        assert state.reserved_through is not None  # `_claim_txn` checked it
        self._state, self._revision = state, revision
        self._limit = state.reserved_through

    async def ensure(self, last_offset: int) -> None:
        """Return once offsets up to `last_offset` are reserved; extend if needed.

        Raises `TopicFencedError` if another broker claimed the topic, `ReservationError`
        if the metadata store failed (the next call tries again).
        """
        while self._limit < last_offset:
            if self._fenced:
                raise self._fenced_error()
            if self._done:
                raise ReservationError(f"{self._name}: the reservation was released")
            task = self._inflight
            own = task is None
            if task is None:
                task = self._start(max(self._limit, last_offset) + self._step)
            try:
                await asyncio.shield(task)
            except ReservationError:
                if own:
                    raise
                # A background extension failed; this append makes its own attempt.
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if task.cancelled() and not (current is not None and current.cancelling()):
                    raise ReservationError(f"{self._name}: stopped while extending") from None
                raise

    def note_next(self, next_offset: int) -> None:
        """Offsets below `next_offset` are assigned: extend in the background when less
        than half a step of the reservation is left."""
        if (
            self._inflight is None
            and (self._limit - next_offset + 1) * 2 <= self._step
            and not self._fenced
            and not self._done
            and self._state is not None
            and self._clock.now() >= self._early_retry_at
        ):
            self._start(self._limit + self._step)

    async def release(self, last_assigned: int) -> None:
        """Shrink the reservation to what was assigned (graceful close); best effort.

        Whoever opens next then continues right after `last_assigned`, without a gap. If
        the write fails, the reservation stays: the next owner skips it, which is safe.
        """
        async with self._lock:
            self._done = True
            state = self._state
            if self._fenced or state is None or self.reserved_through <= last_assigned:
                return
            released = dataclasses.replace(state, reserved_through=last_assigned)
            try:
                written = await self._write(released)
            except MetadataError as exc:
                log.warning(
                    "%s: could not release the reservation beyond %d (kept): %s",
                    self._name,
                    last_assigned,
                    exc,
                )
                return
            if not written:
                self._fence()
                log.info("%s: not releasing the reservation: another broker claimed it", self._name)
                return
            self._limit = last_assigned

    async def commit(self, ops: Sequence[TxnOp]) -> None:
        """Apply `ops` (an upload's descriptor) with a fresh copy of the state, fenced.

        Raises `TopicFencedError` once another broker claimed the topic, and lets metadata
        store errors through (the caller retries; a lost reply is adopted by `_write`).
        """
        async with self._lock:
            if self._fenced:
                raise self._fenced_error()
            refreshed = dataclasses.replace(self.state, timestamp=self._clock.now())
            if not await self._write(refreshed, ops):
                self._fence()
                raise self._fenced_error()

    # -- commits of many topics in one transaction (`commit_together`) --------------------

    async def _join(self) -> SealedState | None:
        """Take the claim's lock for a shared transaction if it is free (at once, without
        waiting: a busy claim commits on its own after); the state to write, or None."""
        if self._fenced or self._state is None or self._lock.locked():
            return None
        await self._lock.acquire()  # free: returns without suspending
        return dataclasses.replace(self._state, timestamp=self._clock.now())

    def _leave(
        self, written: tuple[SealedState, int] | None = None, unknown: SealedState | None = None
    ) -> None:
        """Release the lock `_join` took: the shared transaction wrote `written` (the state
        and its revision), or its outcome is `unknown`, or neither (its compares failed)."""
        if written is not None:
            self._state, self._revision = written
            self._uncertain.clear()
        if unknown is not None:
            self._uncertain.append(unknown)  # adopted by the next write if it got through
        self._lock.release()

    async def fenced_put(self, key: str, value: Any) -> None:
        """Put `key` only while this claim holds (a subscription cursor).

        Raises `TopicFencedError` once another broker claimed the topic.
        """
        async with self._lock:
            if self._fenced:
                raise self._fenced_error()
            txn = await self._metadata.txn(
                [Compare.mod_revision_equals(self.key, self._revision)], [Put(key, value)]
            )
            if txn.succeeded:
                return
            current = await self._metadata.get(self.key)
            found = None
            if current is not None:
                with contextlib.suppress(StateError):
                    found = SealedState.from_dict(current.value, self.key)
            if found is not None and found in self._uncertain:
                # Our own earlier write whose reply was lost: adopt it and try again.
                self._state, self._revision = found, current.mod_revision  # type: ignore[union-attr]
                self._uncertain.clear()
                txn = await self._metadata.txn(
                    [Compare.mod_revision_equals(self.key, self._revision)], [Put(key, value)]
                )
                if txn.succeeded:
                    return
            self._fence()
            raise self._fenced_error()

    async def write_sealed(
        self, sealed: SealedState, handoff: Handoff | None = None, extra: Sequence[Put] = ()
    ) -> bool:
        """Write the sealed state (and `extra`: the cursors) if this claim is still in
        place; False if fenced.

        With `handoff`, its writes go in the same transaction if its conditions hold;
        if they do not (or the claim was lost), the state is written without them (or not).
        Exceptions of the metadata store propagate (the seal fails, the topic stays open).
        """
        async with self._lock:
            if self._fenced:
                return False
            along = await handoff.writes() if handoff is not None else None
            if along is not None:
                compares, ops = along
                if await self._write(sealed, [*extra, *ops], compares):
                    assert handoff is not None
                    self._done = True
                    handoff.written()
                    return True
            written = await self._write(sealed, extra)
            if written:
                self._done = True
            else:
                self._fence()
            return written

    # -- internals -------------------------------------------------------------------------

    def _start(self, target: int) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(
            self._extend(target), name=f"{self._name}/extend"
        )
        self._inflight = task
        task.add_done_callback(self._extension_done)
        return task

    def _extension_done(self, task: asyncio.Task[None]) -> None:
        if self._inflight is task:
            self._inflight = None
        if task.cancelled():
            return
        exc = task.exception()  # retrieved here: nobody may be waiting for it
        if isinstance(exc, ReservationError) and not self._done:
            self._early_retry_at = self._clock.now() + _EARLY_RETRY_SECONDS
            log.warning("%s", exc)

    async def _extend(self, target: int) -> None:
        async with self._lock:
            if self._fenced:
                raise self._fenced_error()
            if self._done:
                raise ReservationError(f"{self._name}: the reservation was released")
            if self._limit >= target:
                return
            extended = dataclasses.replace(self.state, reserved_through=target)
            for attempt in range(_EXTEND_ATTEMPTS):
                try:
                    written = await self._write(extended)
                    break
                except MetadataError as exc:
                    # Once more at once: after a lost reply, the retry adopts the write.
                    if attempt + 1 == _EXTEND_ATTEMPTS:
                        raise ReservationError(
                            f"{self._name}: could not extend the offset reservation to "
                            f"{target}: {exc}"
                        ) from exc
            if not written:
                self._fence()
                raise self._fenced_error()
            self._limit = target
            self._early_retry_at = -math.inf
            self._stats.reservation_extensions += 1
            log.debug("%s: offsets reserved through %d", self._name, target)

    async def _write(
        self, state: SealedState, extra: Sequence[TxnOp] = (), also: Sequence[Compare] = ()
    ) -> bool:
        """Put `state` (and `extra`) if the key is at this owner's last revision (and the
        `also` conditions hold); False if not.

        A write whose reply was lost may still have been applied: if the key now holds
        exactly such a write of ours, it is adopted and the put is tried again. (A sealed
        state of this broker at the same offset also counts, as a seal retried after a
        lost reply.)
        """
        try:
            txn = await self._metadata.txn(
                [Compare.mod_revision_equals(self.key, self._revision), *also],
                [Put(self.key, state.to_dict()), *extra],
            )
        except BaseException:
            self._uncertain.append(state)
            raise
        if txn.succeeded:
            self._state, self._revision = state, txn.revision
            self._uncertain.clear()
            return True
        current = await self._metadata.get(self.key)
        if current is None:
            return False
        try:
            found = SealedState.from_dict(current.value, self.key)
        except StateError:
            return False
        if found in self._uncertain:
            self._state, self._revision = found, current.mod_revision
            self._uncertain.clear()
            return await self._write(state, extra, also)
        if (
            state.sealed
            and found.sealed
            and found.broker_id == self.broker_id
            and found.last_committed_offset == state.last_committed_offset
        ):
            self._state, self._revision = found, current.mod_revision
            return True
        return False

    def _fence(self) -> None:
        if not self._fenced:
            log.warning(
                "%s: another broker claimed the topic; %s stops assigning offsets",
                self._name,
                self.broker_id,
            )
        self._fenced = True
        self._limit = -1

    def _fenced_error(self) -> TopicFencedError:
        return TopicFencedError(
            f"{self.topic}: the storage state was changed by another broker; "
            f"{self.broker_id} no longer owns the topic: it commits and acknowledges nothing "
            f"more and cannot extend its offset reservation beyond {self.reserved_through}"
        )


# Below etcd's limit on a transaction's compares and operations, with room to spare.
_TXN_OPS = MAX_TXN_OPS - 8


def _keys_of(ops: Sequence[TxnOp]) -> set[str] | None:
    """The keys `ops` write, or None if one is a prefix deletion (never combined)."""
    if any(isinstance(op, Delete) and op.prefix for op in ops):
        return None
    return {op.key for op in ops}


async def claim_together(
    metadata: MetadataStore,
    claims: Sequence[tuple[TopicClaim, int, SealedState]],
) -> list[BaseException | None]:
    """`TopicClaim.claim` of topics opened together, in as few transactions as etcd
    allows (a failover opens thousands). When a transaction's compares fail (a topic is
    being taken over meanwhile), its topics claim one by one, so that one fails alone.
    Returns, per claim, None or the exception it failed with."""
    results: list[BaseException | None] = [None] * len(claims)
    per_txn = _TXN_OPS // 2  # a compare and a put each
    for first in range(0, len(claims), per_txn):
        chunk = claims[first : first + per_txn]
        compares: list[Compare] = []
        ops: list[TxnOp] = []
        try:
            for claim, revision, state in chunk:
                guard, write = claim._claim_txn(revision, state)
                compares += guard
                ops += write
            txn = await metadata.txn(compares, ops)
        except Exception as exc:  # claiming again is safe: the next open continues after
            results[first : first + len(chunk)] = [exc] * len(chunk)
            continue
        if txn.succeeded:
            for claim, _, state in chunk:
                claim._claimed(state, txn.revision)
            continue
        alone = await asyncio.gather(
            *(claim.claim(revision, state) for claim, revision, state in chunk),
            return_exceptions=True,
        )
        for i, outcome in enumerate(alone):
            if isinstance(outcome, BaseException):
                results[first + i] = outcome
    return results


async def commit_together(
    metadata: MetadataStore,
    commits: Sequence[tuple[TopicClaim, Sequence[TxnOp]]],
    stats: StorageStats | None = None,
) -> list[BaseException | None]:
    """`TopicClaim.commit` of many topics, in as few transactions as etcd allows.

    Each topic's operations go with a fresh copy of its state, fenced on its revision, as in
    `commit`; one transaction carries many topics, and a topic's several commits (its sends'
    and its merge's) go in as one when they write different keys. When a transaction's
    compares fail (a topic was claimed by another broker), its topics commit one by one, so
    a fenced topic fails alone and the others commit. A claim busy with a write of its own
    (an extension, a cursor) commits on its own too. Returns, per commit, None or the
    exception it failed with (`TopicFencedError`, a metadata error to retry).
    """
    results: list[BaseException | None] = [None] * len(commits)
    alone: list[int] = []
    # Per claim that joined: the commits it carries, their operations, the state to write.
    joined: list[tuple[list[int], list[TxnOp], SealedState]] = []
    carrying: dict[int, tuple[list[int], list[TxnOp], set[str]]] = {}
    spilled: set[int] = set()  # claims with a commit on its own: their later ones follow it
    for i, (claim, ops) in enumerate(commits):
        written = _keys_of(ops)
        carried = carrying.get(id(claim))
        if carried is not None and id(claim) not in spilled:
            indices, along, used = carried
            fits = len(along) + len(ops) < _TXN_OPS
            if written is not None and used.isdisjoint(written) and fits:
                indices.append(i)
                along.extend(ops)
                used |= written
                continue
        if carried is not None or id(claim) in spilled:
            spilled.add(id(claim))
            alone.append(i)
            continue
        state = await claim._join()
        if state is None or written is None:
            if state is not None:
                claim._leave()
            spilled.add(id(claim))
            alone.append(i)
            continue
        indices, along = [i], list(ops)
        carrying[id(claim)] = (indices, along, written)
        joined.append((indices, along, state))
    while joined:
        chunk: list[tuple[list[int], list[TxnOp], SealedState]] = []
        size = 0
        while joined and (not chunk or size + 1 + len(joined[0][1]) <= _TXN_OPS):
            chunk.append(joined.pop(0))
            size += 1 + len(chunk[-1][1])
        claims = [commits[indices[0]][0] for indices, _, _ in chunk]
        compares = [Compare.mod_revision_equals(c.key, c._revision) for c in claims]
        writes: list[TxnOp] = []
        for claim, (_, along, state) in zip(claims, chunk, strict=True):
            writes.append(Put(claim.key, state.to_dict()))
            writes.extend(along)
        if stats is not None:
            stats.descriptor_commits += 1
        try:
            txn = await metadata.txn(compares, writes)
        except Exception as exc:  # the outcome is unknown: the next attempt adopts it
            for claim, (indices, _, state) in zip(claims, chunk, strict=True):
                claim._leave(unknown=state)
                for i in indices:
                    results[i] = exc
            continue
        except BaseException:
            for indices, _, state in [*chunk, *joined]:
                commits[indices[0]][0]._leave(unknown=state)
            raise
        for claim, (indices, _, state) in zip(claims, chunk, strict=True):
            if txn.succeeded:
                claim._leave(written=(state, txn.revision))
            else:
                claim._leave()
                alone.extend(indices)
    if alone:
        if stats is not None:
            stats.descriptor_commits += len(alone)
        outcomes = await asyncio.gather(
            *(commits[i][0].commit(commits[i][1]) for i in sorted(alone)),
            return_exceptions=True,
        )
        for i, outcome in zip(sorted(alone), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                results[i] = outcome
    return results
