"""`MemoryStore`: the embedded, in-process metadata store with etcd's semantics.

It keeps what etcd keeps, in memory: a global revision counter, per-key create/mod revision
and version, an event log for watching from a past revision (with compaction), leases that
expire on the injected `Clock`, and atomic transactions. Every operation runs without an
`await` between reading and writing state, so operations are atomic with respect to other
asyncio tasks without a lock.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ballast.aio import cancel_and_wait
from ballast.clock import Clock, SystemClock
from ballast.metadata import _codec
from ballast.metadata.store import (
    CompactedError,
    Compare,
    Delete,
    KeyValue,
    Lease,
    LeaseNotFoundError,
    Listing,
    MetadataError,
    Put,
    TxnHelpers,
    TxnResult,
    ValueDecodeError,
    Watch,
    WatchEvent,
)

log = logging.getLogger(__name__)

DEFAULT_HISTORY_LIMIT = 100_000


@dataclass
class _Entry:
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int | None


@dataclass
class _LeaseState:
    id: int
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class _Event:
    kind: Literal["put", "delete"]
    key: str
    value: bytes | None
    revision: int


def _to_watch_event(event: _Event) -> WatchEvent:
    if event.kind == "delete" or event.value is None:
        return WatchEvent("delete", event.key, None, event.revision)
    try:
        value = _codec.decode(event.value)
    except ValueError as exc:
        return WatchEvent(
            "error", event.key, None, event.revision, f"value at {event.key!r} is not JSON: {exc}"
        )
    return WatchEvent("put", event.key, value, event.revision)


class MemoryStore(TxnHelpers):
    """In-process `MetadataStore`; leases expire on `clock` (default: the system clock).

    `history_limit` bounds the event log kept for watching from past revisions: when it is
    exceeded the oldest half is compacted away, and a watch asking for a compacted revision
    gets a ``compacted`` event, as with etcd.
    """

    def __init__(
        self, clock: Clock | None = None, *, history_limit: int = DEFAULT_HISTORY_LIMIT
    ) -> None:
        if history_limit < 1:
            raise ValueError(f"history_limit must be >= 1, got {history_limit}")
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._history_limit = history_limit
        self._revision = 1  # etcd's first revision: an empty store reads at revision 1
        self._compact_revision = 0
        self._kvs: dict[str, _Entry] = {}
        self._sorted_keys: list[str] = []
        self._log: list[_Event] = []
        self._watches: set[tuple[str, Watch]] = set()
        self._leases: dict[int, _LeaseState] = {}
        # The Lease handles given out, so close/revoke can stop their keep-alive tasks.
        self._handles: dict[int, Lease] = {}
        self._lease_ids = itertools.count(1)
        self._lease_changed = asyncio.Event()
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"MemoryStore(revision={self._revision}, keys={len(self._kvs)})"

    # -- lifecycle ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop keep-alives and the lease reaper, end every open watch. Idempotent."""
        self._closed = True
        for handle in list(self._handles.values()):
            await handle.stop_keep_alive()
        self._handles.clear()
        for _, watch in list(self._watches):
            watch.finish()
        self._watches.clear()
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            await cancel_and_wait(reaper)

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataError("metadata store is closed; open a new one")
        self._expire_due()

    # -- reads -------------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """The current store revision."""
        return self._revision

    async def get(self, key: str) -> KeyValue | None:
        """The key, or None if absent. Raises `ValueDecodeError` if its value is not JSON."""
        _codec.check_key(key)
        self._check_open()
        entry = self._kvs.get(key)
        return None if entry is None else self._key_value(key, entry)

    async def get_prefix(self, prefix: str) -> Listing:
        """Every key starting with `prefix`, sorted by key, at the current revision."""
        _codec.check_prefix(prefix)
        self._check_open()
        items: list[KeyValue] = []
        undecodable: list[ValueDecodeError] = []
        for key in self._keys_with_prefix(prefix):
            try:
                items.append(self._key_value(key, self._kvs[key]))
            except ValueDecodeError as exc:
                undecodable.append(exc)
        return Listing(items, self._revision, undecodable)

    def _key_value(self, key: str, entry: _Entry) -> KeyValue:
        try:
            value = _codec.decode(entry.value)
        except ValueError as exc:
            raise ValueDecodeError(key, str(exc)) from exc
        return KeyValue(
            key, value, entry.create_revision, entry.mod_revision, entry.version, entry.lease
        )

    def _keys_with_prefix(self, prefix: str) -> list[str]:
        start = bisect.bisect_left(self._sorted_keys, prefix)
        out: list[str] = []
        for key in itertools.islice(self._sorted_keys, start, None):
            if not key.startswith(prefix):
                break
            out.append(key)
        return out

    # -- writes ------------------------------------------------------------------------------

    async def put(self, key: str, value: Any, lease: int | None = None) -> int:
        """Write `value` (JSON) at `key`; returns the new revision."""
        return await self.put_raw(key, _codec.encode(key, value), lease)

    async def put_raw(self, key: str, data: bytes, lease: int | None = None) -> int:
        """Write raw bytes (possibly not JSON). For tools and tests of bad input."""
        _codec.check_key(key)
        self._check_open()
        self._check_lease(lease)
        events: list[_Event] = []
        self._apply_put(key, data, lease, self._revision + 1, events)
        return self._commit(events)

    async def delete(self, key: str) -> bool:
        """Delete `key`; True if it existed."""
        _codec.check_key(key)
        self._check_open()
        events: list[_Event] = []
        self._apply_delete(key, self._revision + 1, events)
        self._commit(events)
        return bool(events)

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with `prefix` at one revision; returns the count."""
        _codec.check_prefix(prefix)
        self._check_open()
        events: list[_Event] = []
        revision = self._revision + 1
        for key in self._keys_with_prefix(prefix):
            self._apply_delete(key, revision, events)
        self._commit(events)
        return len(events)

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult:
        """Atomically apply `success` if every compare holds, else `failure`."""
        for c in compare:
            _codec.check_compare(c)
        _codec.check_ops(success)
        _codec.check_ops(failure)
        self._check_open()
        succeeded = all(self._holds(c) for c in compare)
        ops = success if succeeded else failure
        # Encode and check leases before touching state, so a bad op changes nothing.
        encoded = [
            (op, _codec.encode(op.key, op.value) if isinstance(op, Put) else b"") for op in ops
        ]
        for op, _ in encoded:
            if isinstance(op, Put):
                self._check_lease(op.lease)
        events: list[_Event] = []
        revision = self._revision + 1
        for op, data in encoded:
            if isinstance(op, Put):
                self._apply_put(op.key, data, op.lease, revision, events)
            elif op.prefix:
                for key in self._keys_with_prefix(op.key):
                    self._apply_delete(key, revision, events)
            else:
                self._apply_delete(op.key, revision, events)
        return TxnResult(succeeded, self._commit(events))

    def _holds(self, compare: Compare) -> bool:
        entry = self._kvs.get(compare.key)
        if compare.target == "value":
            if entry is None:
                return False  # as in etcd: a value compare on a missing key is false
            operand = _codec.encode(compare.key, compare.operand)
            return _codec.compare_values(entry.value, compare.op, operand)
        actual = 0
        if entry is not None:
            actual = {
                "version": entry.version,
                "create_revision": entry.create_revision,
                "mod_revision": entry.mod_revision,
            }[compare.target]
        return _codec.compare_values(actual, compare.op, compare.operand)

    def _apply_put(
        self, key: str, data: bytes, lease: int | None, revision: int, events: list[_Event]
    ) -> None:
        old = self._kvs.get(key)
        if old is None:
            bisect.insort(self._sorted_keys, key)
            entry = _Entry(data, revision, revision, 1, lease)
        else:
            self._unbind(key, old.lease)
            entry = _Entry(data, old.create_revision, revision, old.version + 1, lease)
        self._kvs[key] = entry
        if lease is not None:
            self._leases[lease].keys.add(key)
        events.append(_Event("put", key, data, revision))

    def _apply_delete(self, key: str, revision: int, events: list[_Event]) -> None:
        old = self._kvs.pop(key, None)
        if old is None:
            return
        del self._sorted_keys[bisect.bisect_left(self._sorted_keys, key)]
        self._unbind(key, old.lease)
        events.append(_Event("delete", key, None, revision))

    def _unbind(self, key: str, lease: int | None) -> None:
        if lease is not None and lease in self._leases:
            self._leases[lease].keys.discard(key)

    def _commit(self, events: list[_Event]) -> int:
        """Advance the revision if anything changed, log the events and notify watchers."""
        if not events:
            return self._revision
        self._revision = events[0].revision
        self._log.extend(events)
        for prefix, watch in list(self._watches):
            for event in events:
                if event.key.startswith(prefix):
                    watch.deliver_nowait(_to_watch_event(event))
        if len(self._log) > self._history_limit:
            # Keep the newer half; cut on a revision boundary so no revision is split.
            self._compact_to(self._log[len(self._log) // 2].revision)
        return self._revision

    # -- history -----------------------------------------------------------------------------

    async def compact(self, revision: int) -> None:
        """Forget history before `revision`; watching from an earlier revision then fails."""
        self._check_open()
        if revision > self._revision:
            raise MetadataError(
                f"cannot compact to revision {revision}: the store is at {self._revision}"
            )
        if revision <= self._compact_revision:
            raise CompactedError(revision, self._compact_revision)
        self._compact_to(revision)

    def _compact_to(self, revision: int) -> None:
        cut = bisect.bisect_left(self._log, revision, key=lambda e: e.revision)
        del self._log[:cut]
        self._compact_revision = revision

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        """Watch `prefix` from `start_revision` (None: changes after this call).

        Past events still in the log are replayed first; if `start_revision` was compacted
        the watch yields one ``compacted`` event and ends.
        """
        _codec.check_prefix(prefix)
        if self._closed:
            raise MetadataError("metadata store is closed; open a new one")
        watch = Watch(prefix, on_close=self._forget_watch)
        start = self._revision + 1 if start_revision is None else max(start_revision, 1)
        if start < self._compact_revision:
            watch.deliver_nowait(
                WatchEvent(
                    "compacted",
                    prefix,
                    None,
                    self._compact_revision,
                    str(CompactedError(start, self._compact_revision)),
                )
            )
            watch.finish()
            return watch
        first = bisect.bisect_left(self._log, start, key=lambda e: e.revision)
        for event in itertools.islice(self._log, first, None):
            if event.key.startswith(prefix):
                watch.deliver_nowait(_to_watch_event(event))
        self._watches.add((prefix, watch))
        return watch

    def _forget_watch(self, watch: Watch) -> None:
        self._watches.discard((watch.prefix, watch))

    # -- leases ------------------------------------------------------------------------------

    async def grant_lease(self, ttl: float) -> Lease:
        """Grant a lease of `ttl` seconds on the store's clock."""
        if not ttl > 0:
            raise MetadataError(f"lease ttl must be > 0 seconds, got {ttl!r}")
        self._check_open()
        lease_id = next(self._lease_ids)
        self._leases[lease_id] = _LeaseState(lease_id, ttl, self._clock.now() + ttl)
        self._lease_changed.set()
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap(), name="metadata/memory-lease-reaper")
        lease = Lease(
            lease_id, ttl, refresh=self.refresh_lease, revoke=self.revoke_lease, clock=self._clock
        )
        self._handles[lease_id] = lease
        return lease

    async def refresh_lease(self, lease_id: int) -> None:
        """Reset the lease's deadline to now + ttl; raises `LeaseNotFoundError` if gone."""
        self._check_open()
        state = self._leases.get(lease_id)
        if state is None:
            self._handles.pop(lease_id, None)
            raise LeaseNotFoundError(lease_id)
        state.deadline = self._clock.now() + state.ttl

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease and delete its keys at one revision (unknown ids are ignored)."""
        self._check_open()
        handle = self._handles.pop(lease_id, None)
        if handle is not None:
            await handle.stop_keep_alive()
        self._revoke(lease_id)

    async def lease_time_to_live(self, lease_id: int) -> float | None:
        """Seconds left before the lease expires, or None if it does not exist."""
        self._check_open()
        state = self._leases.get(lease_id)
        return None if state is None else max(0.0, state.deadline - self._clock.now())

    def _check_lease(self, lease: int | None) -> None:
        if lease is not None and lease not in self._leases:
            raise LeaseNotFoundError(lease)

    def _revoke(self, lease_id: int) -> None:
        state = self._leases.pop(lease_id, None)
        if state is None:
            return
        events: list[_Event] = []
        revision = self._revision + 1
        for key in sorted(state.keys):
            self._apply_delete(key, revision, events)
        self._commit(events)

    def _expire_due(self) -> None:
        now = self._clock.now()
        for lease_id in [i for i, s in self._leases.items() if s.deadline <= now]:
            log.info("lease %d expired", lease_id)
            self._revoke(lease_id)

    async def _reap(self) -> None:
        """Expire leases at their deadlines on the injected clock."""
        while True:
            self._expire_due()
            self._lease_changed.clear()
            waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._lease_changed.wait())]
            if self._leases:
                wait = min(s.deadline for s in self._leases.values()) - self._clock.now()
                waiters.append(asyncio.ensure_future(self._clock.sleep(wait)))
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
