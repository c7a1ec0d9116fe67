"""`ReliableTopic`: the storage of one reliable topic on its owning broker.

It ties the pieces together: on `open()` it decides where offsets continue (sealed
state, object catalog, local WAL, the previous owner's offset reservation), claims the
topic with a reservation of its own (see `reservation`), then runs the WAL, the uploader
and the subscription cursors, each a service owning its tasks. `append`, `read`,
`subscribe` and `ack` serve producers and consumers; `seal()` hands the topic over: flush
the WAL, drain the uploader, flush the cursors, write the sealed state (fenced on this
owner's claim), and release the local files. `close()` stops without a seal and releases
the unused part of the reservation.

After a crash, the topic continues past the crashed owner's reservation; the offsets
skipped (`gaps`) hold no message and readers step over them.

The lifecycle is one transition table; an illegal event raises before anything changes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Self

from ballast.aio import both
from ballast.clock import Clock, SystemClock
from ballast.metadata import keys
from ballast.metadata.store import Listing, MetadataStore
from ballast.model import TopicName
from ballast.storage.catalog import load_catalog
from ballast.storage.codec import Headers, Message
from ballast.storage.config import AckMode, StorageConfig
from ballast.storage.cursor import SubscriptionCursors
from ballast.storage.log import BrokerLog
from ballast.storage.objects import ObjectStore
from ballast.storage.reader import TieredRecord, read_tiered
from ballast.storage.reservation import Handoff, TopicClaim, TopicFencedError
from ballast.storage.retention import RetentionPolicies
from ballast.storage.seal import (
    Gap,
    SealedState,
    StartSource,
    StateError,
    choose_start,
    merge_gaps,
)
from ballast.storage.stats import StorageStats
from ballast.storage.stream import CommitStream
from ballast.storage.ticker import Ticker
from ballast.storage.uploader import Uploader
from ballast.storage.wal import WalRecovery, WriteAheadLog

__all__ = [
    "InitialPosition",
    "OpenResult",
    "ReliableTopic",
    "SealError",
    "Subscription",
    "TopicFencedError",
    "TopicStateError",
    "TopicStatus",
]

log = logging.getLogger(__name__)


class TopicStatus(StrEnum):
    """Lifecycle of a topic's storage on one broker."""

    NEW = "new"
    OPENING = "opening"
    OPEN = "open"
    SEALING = "sealing"
    SEALED = "sealed"
    CLOSED = "closed"


# (status, event) -> next status. Anything missing is illegal.
_TRANSITIONS: dict[tuple[TopicStatus, str], TopicStatus] = {
    (TopicStatus.NEW, "open"): TopicStatus.OPENING,
    (TopicStatus.OPENING, "opened"): TopicStatus.OPEN,
    (TopicStatus.OPENING, "open_failed"): TopicStatus.CLOSED,
    (TopicStatus.OPEN, "seal"): TopicStatus.SEALING,
    (TopicStatus.SEALING, "sealed"): TopicStatus.SEALED,
    (TopicStatus.SEALING, "seal_failed"): TopicStatus.OPEN,
    (TopicStatus.SEALING, "fenced"): TopicStatus.CLOSED,
    (TopicStatus.OPEN, "close"): TopicStatus.CLOSED,
    (TopicStatus.NEW, "close"): TopicStatus.CLOSED,
}


class TopicStateError(RuntimeError):
    """An operation that the topic's lifecycle state does not allow."""


class SealError(RuntimeError):
    """The seal could not make everything durable in object storage."""


class InitialPosition(StrEnum):
    """Where a subscription without a cursor starts."""

    EARLIEST = "earliest"
    LATEST = "latest"


@dataclass(frozen=True)
class OpenResult:
    """How `open()` resumed the topic: where, from which evidence, and what it found."""

    topic: TopicName
    next_offset: int
    source: StartSource
    reason: str
    previous_state: SealedState | None
    catalog_end: int | None
    local_end: int | None
    recovery: WalRecovery
    discarded_segments: int
    gap: Gap | None = None  # offsets skipped by this open (held nowhere), if any
    reserved_through: int = -1  # the reservation claimed on open


class ReliableTopic:
    """Storage of one reliable topic; use ``async with ReliableTopic(...) as topic:``.

    `data_dir` is this broker's local directory for WALs (the topic uses
    ``data_dir/{namespace}/{topic}``); `objects` and `metadata` are shared by all brokers.
    """

    def __init__(
        self,
        topic: TopicName | str,
        *,
        broker_id: str,
        data_dir: Path | str,
        objects: ObjectStore,
        metadata: MetadataStore,
        clock: Clock | None = None,
        config: StorageConfig | None = None,
        stats: StorageStats | None = None,
        stream: CommitStream | None = None,
        ticker: Ticker | None = None,
        policies: RetentionPolicies | None = None,
        log: BrokerLog | None = None,
    ) -> None:
        """`stats`, `stream` (object writes and commits), `ticker` (periodic work) and
        `policies` (retention) are shared by the topics of one broker (the topic's own
        otherwise)."""
        self.topic = TopicName.parse(topic)
        self.broker_id = broker_id
        self.directory = Path(data_dir) / self.topic.namespace / self.topic.name
        self._objects = objects
        self._metadata = metadata
        self._clock: Clock = clock or SystemClock()
        self._config = config or StorageConfig()
        self.stats = stats or StorageStats()
        self._stream = stream
        self._ticker = ticker
        self._policies = policies
        # The broker's write-ahead log, shared by its topics (None: a private one, made on
        # open in `directory`).
        self._log = log
        self._status = TopicStatus.NEW
        self._stack: contextlib.AsyncExitStack | None = None
        self._wal: WriteAheadLog | None = None
        self._uploader: Uploader | None = None
        self._cursors: SubscriptionCursors | None = None
        self._claim: TopicClaim | None = None
        self._gaps: tuple[Gap, ...] = ()
        self._opened: OpenResult | None = None

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def status(self) -> TopicStatus:
        """Current lifecycle state."""
        return self._status

    def _transition(self, event: str) -> None:
        target = _TRANSITIONS.get((self._status, event))
        if target is None:
            raise TopicStateError(
                f"[lifecycle] {self.topic}: cannot {event.replace('_', ' ')} while {self._status}"
            )
        self._status = target

    def _require_open(self, action: str) -> WriteAheadLog:
        if self._status is not TopicStatus.OPEN or self._wal is None:
            raise TopicStateError(f"[lifecycle] {self.topic}: cannot {action} while {self._status}")
        return self._wal

    @property
    def opened(self) -> OpenResult:
        """What `open()` found and decided."""
        if self._opened is None:
            raise TopicStateError(f"[lifecycle] {self.topic}: not opened yet")
        return self._opened

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._status is TopicStatus.OPEN:
            await self.close()

    async def open(self, listing: Listing | None = None) -> OpenResult:
        """Recover local state, choose the next offset, start the services. `listing`: the
        topic's storage prefix (`keys.storage_topic_prefix`) as the caller read it already
        (with the topic's metadata, in one round trip); by default it is read here, while
        the WAL recovers."""
        self._transition("open")
        stack = contextlib.AsyncExitStack()
        try:
            result = await self._open(stack, listing)
        except BaseException:
            try:
                await stack.aclose()
            finally:
                self._transition("open_failed")
            raise
        self._stack = stack
        self._opened = result
        self._transition("opened")
        return result

    async def _open(self, stack: contextlib.AsyncExitStack, listed: Listing | None) -> OpenResult:
        broker_log = self._log
        if broker_log is None:  # a topic of its own (tests, tools): its own log
            broker_log = BrokerLog(
                self.directory,
                clock=self._clock,
                config=self._config,
                stats=self.stats,
                name=f"log{self.topic}",
                private=True,
            )
            stack.push_async_callback(broker_log.close)  # after the WAL's close_files
        wal = WriteAheadLog(
            broker_log,
            str(self.topic),
            clock=self._clock,
            config=self._config,
            stats=self.stats,
            name=f"wal{self.topic}",
        )
        # The state and the catalog in one listing (one revision): the caller's (read with
        # the metadata), or read here while the WAL recovers (a retry must not recover the
        # directory while this recovery still runs: `both` waits for both).
        if listed is None:
            prefix = keys.storage_topic_prefix(self.topic)
            listing, recovery = await both(self._metadata.get_prefix(prefix), wal.recover())
        else:
            listing, recovery = listed, await wal.recover()
        state_key = keys.storage_state(self.topic)
        for undecodable in listing.undecodable:
            if undecodable.key == state_key:
                raise undecodable  # as a read of the key alone would (not a state to trust)
        kv = next((item for item in listing.items if item.key == state_key), None)
        previous: SealedState | None = None
        if kv is not None:
            try:
                previous = SealedState.from_dict(kv.value, state_key)
            except StateError as exc:
                # Without a trustworthy seal, fall back to the evidence: never reuse offsets.
                log.error("storage %s: ignoring malformed state: %s", self.topic, exc)
        catalog = await load_catalog(
            self._metadata, self.topic, self.stats, objects=self._objects, listing=listing
        )
        decision = choose_start(previous, catalog.end, recovery.last_offset)
        discarded = await wal.discard() if decision.discard_local else 0
        await wal.open(decision.next_offset, allow_gap=True)
        stack.push_async_callback(wal.close_files)  # also if the open fails from here on
        gaps = merge_gaps(
            [
                *(previous.gaps if previous is not None else ()),
                *(recovery.gaps if not decision.discard_local else ()),
                decision.gap,
            ]
        )
        # Claim the topic: overwrite the state (fenced on what we read) with an unsealed
        # record and a reservation, so the seal we just used is never trusted again after
        # we crash, and whoever continues then starts after every offset we may assign.
        reserved = decision.next_offset - 1 + self._config.offset_reservation_step
        claim = TopicClaim(
            self.topic,
            self._metadata,
            broker_id=self.broker_id,
            clock=self._clock,
            config=self._config,
            stats=self.stats,
        )
        owner_record = SealedState(
            False,
            decision.next_offset - 1,
            self.broker_id,
            self._clock.now(),
            reserved_through=reserved,
            gaps=gaps,
        )
        # The first segment is created while the claim is written (both on a move's path);
        # a broker's topics opened together claim together, through its stream.
        revision = kv.mod_revision if kv else 0
        claiming = (
            claim.claim(revision, owner_record)
            if self._stream is None
            else self._stream.claim(claim, revision, owner_record)
        )
        await both(claiming, wal.start_segment())
        wal.set_reserver(claim)
        stream = self._stream
        if stream is None:  # a topic of its own (tests, tools): its own stream
            stream = CommitStream(
                self._objects,
                self._metadata,
                broker_id=self.broker_id,
                clock=self._clock,
                config=self._config,
                stats=self.stats,
            )
            stack.push_async_callback(stream.close)  # after the uploader stops
        checkpoint = catalog.end if catalog.end is not None else -1
        uploader = Uploader(
            self.topic,
            wal,
            self._objects,
            self._metadata,
            clock=self._clock,
            config=self._config,
            stats=self.stats,
            checkpoint=checkpoint,
            gaps=gaps,
            claim=claim,
            catalog=catalog,
            stream=stream,
            ticker=self._ticker,
            policies=self._policies,
        )
        cursors = SubscriptionCursors(
            self.topic,
            self._metadata,
            clock=self._clock,
            config=self._config,
            stats=self.stats,
            writer=claim.fenced_put,
            ticker=self._ticker,
        )
        await stack.enter_async_context(claim)  # first in, last out: after the WAL stops
        await stack.enter_async_context(wal)
        await stack.enter_async_context(uploader)
        await stack.enter_async_context(cursors)
        self._wal, self._uploader, self._cursors = wal, uploader, cursors
        self._claim, self._gaps = claim, gaps
        self.stats.opens_by_source[decision.source.value] += 1
        if decision.gap is not None:
            # Expected after every crash, on every topic the crashed owner had: a failover
            # of 10 000 topics logged 10 000 warnings, 5 % of the heir's CPU while opening
            # them. Counted as ballast_storage_opens_total{source="reservation"}.
            log.info(
                "storage %s: offsets %d..%d are skipped: the previous owner (%s) may have "
                "assigned them, and they are neither in object storage nor here",
                self.topic,
                decision.gap[0],
                decision.gap[1],
                previous.broker_id if previous is not None else "unknown",
            )
        log.info(
            "storage %s: opened on %s at offset %d from %s (%s)%s; reserved through %d",
            self.topic,
            self.broker_id,
            decision.next_offset,
            decision.source.value,
            decision.reason,
            f"; discarded {discarded} local segment(s)" if discarded else "",
            reserved,
        )
        return OpenResult(
            topic=self.topic,
            next_offset=decision.next_offset,
            source=decision.source,
            reason=decision.reason,
            previous_state=previous,
            catalog_end=catalog.end,
            local_end=recovery.last_offset,
            recovery=recovery,
            discarded_segments=discarded,
            gap=decision.gap,
            reserved_through=reserved,
        )

    async def close(self, *, release_reservation: bool = True) -> None:
        """Stop without sealing (broker shutdown): flush, keep the local WAL for a restart.

        The unused part of the offset reservation is released, so the next open continues
        right after the last offset. With ``release_reservation=False`` it stays, as after
        a crash (for a broker that lost its metadata session; tests use it to crash): the
        next owner then continues after the reservation, skipping the rest of it.
        """
        self._transition("close")
        await self._stop()
        claim, wal = self._claim, self._wal
        if release_reservation and claim is not None and wal is not None:
            await claim.release(wal.next_offset - 1)

    async def _stop(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def seal(self, handoff: Handoff | None = None) -> SealedState:
        """Hand the topic over: everything durable in object storage, sealed state written
        (with `handoff`'s writes in the same transaction, when their conditions hold).

        On failure (object storage unreachable, cancelled) the topic stays open and
        serving; the caller may retry. If another broker has claimed the topic, raises
        `TopicFencedError` and stops without writing anything.
        """
        self._transition("seal")
        assert self._wal is not None and self._uploader is not None
        assert self._cursors is not None
        # Appends still waiting for a reservation extension must not get an offset now.
        self._wal.set_accepting_appends(False)
        try:
            # Written is enough: the seal succeeds only once object storage holds it all
            # and the WAL is deleted then (an fsync here cost a move 3-25 ms).
            last = await self._wal.settle()
            checkpoint = await self._uploader.drain()
            if checkpoint < last:
                raise SealError(
                    f"{self.topic}: object storage holds offsets up to {checkpoint}, "
                    f"the WAL up to {last}"
                )
            sealed = SealedState(True, last, self.broker_id, self._clock.now(), gaps=self._gaps)
            claim = self._claim
            assert claim is not None
            # The cursors go in the sealed state's transaction (fenced by the same claim).
            written = await self._cursors.flush_with(
                lambda cursors: claim.write_sealed(sealed, handoff, cursors)
            )
        except TopicFencedError:
            written = False
        except BaseException:
            self._wal.set_accepting_appends(True)
            self._transition("seal_failed")
            raise
        if not written:
            self._transition("fenced")
            await self._stop()
            raise TopicFencedError(
                f"{self.topic}: the storage state was changed by another broker; "
                f"{self.broker_id} no longer owns the topic and did not seal it"
            )
        await self._stop()
        await self._wal.destroy()
        self._transition("sealed")
        self.stats.seals += 1
        log.info("storage %s: sealed by %s at offset %d", self.topic, self.broker_id, last)
        return sealed

    # -- producers -----------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """Offset the next append gets."""
        if self._wal is None:
            raise TopicStateError(f"[lifecycle] {self.topic}: not opened yet")
        return self._wal.next_offset

    @property
    def last_committed_offset(self) -> int:
        """Last durable offset (next_offset - 1 when nothing is pending)."""
        if self._wal is None:
            raise TopicStateError(f"[lifecycle] {self.topic}: not opened yet")
        return self._wal.committed_offset

    @property
    def reserved_through(self) -> int:
        """Highest offset this owner may assign before extending its reservation."""
        if self._claim is None:
            raise TopicStateError(f"[lifecycle] {self.topic}: not opened yet")
        return self._claim.reserved_through

    @property
    def gaps(self) -> tuple[Gap, ...]:
        """Offset ranges skipped after crashes: they hold no message (sorted, disjoint)."""
        return self._gaps

    @property
    def stored(self) -> tuple[int, int]:
        """(objects, bytes) this topic keeps in the object store; (0, 0) before open."""
        if self._uploader is None:
            return 0, 0
        return self._uploader.stored_objects, self._uploader.stored_bytes

    @property
    def uploaded_offset(self) -> int:
        """Highest offset in object storage."""
        if self._uploader is None:
            raise TopicStateError(f"[lifecycle] {self.topic}: not opened yet")
        return self._uploader.checkpoint

    async def append(
        self, payload: bytes, *, key: bytes | None = None, headers: Headers = ()
    ) -> int:
        """Append a message; returns its offset once acknowledged.

        With `AckMode.DURABLE` (the default) that is once committed to object storage:
        raises `TopicFencedError` if another broker took the topic over first,
        `DurabilityTimeoutError` if the commit does not happen within `ack_timeout_seconds`
        (the record may still be committed later: a duplicate if the producer sends it
        again, never a loss). With `AckMode.LOCAL`, once the local WAL has it.
        """
        offset = await self._require_open("append").append(payload, key=key, headers=headers)
        await self._committed(offset)
        return offset

    async def append_batch(self, messages: Sequence[Message]) -> range:
        """Append messages with consecutive offsets; returns them once committed."""
        offsets = await self._require_open("append").append_batch(messages)
        if offsets:
            await self._committed(offsets[-1])
        return offsets

    async def _committed(self, offset: int) -> None:
        if self._config.ack is AckMode.LOCAL:
            return  # the WAL has it (per the fsync policy); the upload follows
        uploader = self._uploader
        if uploader is None:
            raise TopicStateError(f"[lifecycle] {self.topic}: stopped before {offset} committed")
        await uploader.wait_committed(offset, self._config.ack_timeout_seconds)

    async def flush(self) -> int:
        """Wait for pending appends and fsync; returns the last committed offset."""
        return await self._require_open("flush").flush()

    async def upload_now(self) -> int:
        """Upload everything committed so far; returns the uploaded offset."""
        self._require_open("upload")
        assert self._uploader is not None
        return await self._uploader.drain()

    # -- consumers -----------------------------------------------------------------------

    def read(
        self, from_offset: int | None = None, *, live: bool = True
    ) -> AsyncIterator[TieredRecord]:
        """Records from `from_offset` (default: the next offset) on, in order, exactly once.

        Older offsets come from object storage, then the WAL, then live appends; offsets
        in `gaps` are stepped over. With `live=False` the stream ends when caught up;
        otherwise when the topic stops.
        """
        if self._status not in (TopicStatus.OPEN, TopicStatus.SEALING) or self._wal is None:
            raise TopicStateError(f"[lifecycle] {self.topic}: cannot read while {self._status}")
        start = self._wal.next_offset if from_offset is None else from_offset
        return read_tiered(
            self.topic,
            self._wal,
            self._objects,
            self._metadata,
            start,
            live=live,
            stats=self.stats,
            gaps=self._gaps,
        )

    async def subscribe(
        self,
        subscription: str,
        *,
        initial: InitialPosition = InitialPosition.LATEST,
        live: bool = True,
    ) -> Subscription:
        """A subscription resuming at its cursor + 1 (or at `initial` when it has none);
        `Subscription.acked_above` names what was acked beyond the cursor (to skip)."""
        wal = self._require_open("subscribe")
        assert self._cursors is not None
        position = await self._cursors.load(subscription)
        if position is None:
            start = wal.next_offset if initial is InitialPosition.LATEST else 0
            # Remember the starting point, so a reconnect resumes here and not at "latest";
            # write it now: after a crash, a cursor not yet flushed would be "latest" again
            # on the next owner, and the messages in between would never be delivered.
            self._cursors.ack(subscription, start - 1)
            await self._cursors.flush()
            return Subscription(self, subscription, start, live)
        return Subscription(self, subscription, position.last_acked + 1, live, position.acked_above)

    async def ack(self, subscription: str, offset: int) -> None:
        """Acknowledge everything up to `offset` for `subscription` (cumulative)."""
        self._ackable(offset).ack(subscription, offset)

    async def ack_above(self, subscription: str, offset: int) -> None:
        """Acknowledge `offset` alone (out of order, above the cursor): it is persisted
        with the cursor and the next owner does not deliver it again."""
        self._ackable(offset).ack_above(subscription, offset)

    def _ackable(self, offset: int) -> SubscriptionCursors:
        """The cursors, once `offset` is known to exist (an ack past the end is refused)."""
        wal = self._require_open("ack")
        assert self._cursors is not None
        if offset >= wal.next_offset:
            raise ValueError(
                f"{self.topic}: cannot ack offset {offset}, the topic ends at {wal.next_offset - 1}"
            )
        return self._cursors

    async def unsubscribe(self, subscription: str) -> None:
        """Forget the subscription: its cursor (and what else is kept under its key)."""
        self._require_open("unsubscribe")
        assert self._cursors is not None
        await self._cursors.forget(subscription)

    def cursor(self, subscription: str) -> int | None:
        """The subscription's last acked offset as known in memory."""
        return self._cursors.get(subscription) if self._cursors is not None else None

    async def flush_cursors(self) -> int:
        """Write moved cursors now; returns how many were written."""
        self._require_open("flush cursors")
        assert self._cursors is not None
        return await self._cursors.flush()


class Subscription:
    """A named consumer position on a topic: iterate to receive, `ack` to advance."""

    def __init__(
        self,
        topic: ReliableTopic,
        name: str,
        start_offset: int,
        live: bool,
        acked_above: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self.topic = topic
        self.name = name
        self.start_offset = start_offset
        self.acked_above = acked_above  # acked out of order beyond the cursor (to skip)
        self._live = live

    def __aiter__(self) -> AsyncIterator[TieredRecord]:
        cursor = self.cursor
        start = self.start_offset if cursor is None else max(self.start_offset, cursor + 1)
        return self.topic.read(start, live=self._live)

    async def ack(self, offset: int) -> None:
        """Acknowledge everything up to `offset`."""
        await self.topic.ack(self.name, offset)

    @property
    def cursor(self) -> int | None:
        """Last acked offset, or None before the first ack."""
        return self.topic.cursor(self.name)
