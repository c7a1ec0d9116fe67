"""`MemoryStore`: the embedded, in-process metadata store with etcd's semantics.

An asyncio shell around `StoreCore` (which keeps the keys, revisions, event log, leases
and transactions): it adds what needs the event loop — watches fed from the core's
changes, lease handles with keep-alive, and a reaper that expires leases at their
deadlines on the injected `Clock` even while nobody calls the store. No operation awaits
between reading and writing state, so operations are atomic with respect to other asyncio
tasks without a lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ballast.aio import cancel_and_wait
from ballast.clock import Clock, SystemClock
from ballast.metadata import _codec
from ballast.metadata.core import DEFAULT_HISTORY_LIMIT, LogEvent, StoreCore
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
    Watch,
    WatchEvent,
)

__all__ = ["DEFAULT_HISTORY_LIMIT", "MemoryStore"]


def replay_into(watch: Watch, core: StoreCore, start_revision: int | None) -> bool:
    """Deliver `core`'s events for `watch.prefix` from `start_revision` (None: none, only
    what comes next); False when that revision was compacted (`watch` then yields one
    ``compacted`` event and ends)."""
    start = core.revision + 1 if start_revision is None else max(start_revision, 1)
    try:
        past = core.replay(watch.prefix, start)
    except CompactedError as exc:
        watch.deliver_nowait(
            WatchEvent("compacted", watch.prefix, None, exc.compact_revision, str(exc))
        )
        watch.finish()
        return False
    for event in past:
        watch.deliver_nowait(event.watch_event())
    return True


class MemoryStore(TxnHelpers):
    """In-process `MetadataStore`; leases expire on `clock` (default: the system clock).

    `history_limit` bounds the event log kept for watching from past revisions: when it is
    exceeded the oldest half is compacted away, and a watch asking for a compacted revision
    gets a ``compacted`` event, as with etcd. `core` is the `StoreCore` underneath: a
    synchronous driver (the simulator) may share it, and this store's watches see its
    changes.
    """

    def __init__(
        self, clock: Clock | None = None, *, history_limit: int = DEFAULT_HISTORY_LIMIT
    ) -> None:
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.core = StoreCore(self._clock.now, history_limit=history_limit)
        self.core.listen(self._notify)
        self._watches: set[tuple[str, Watch]] = set()
        # The Lease handles given out, so close/revoke can stop their keep-alive tasks.
        self._handles: dict[int, Lease] = {}
        self._lease_changed = asyncio.Event()
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"MemoryStore(revision={self.core.revision})"

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

    # -- reads and writes: the core's, once the store is open ---------------------------------

    @property
    def revision(self) -> int:
        """The current store revision."""
        return self.core.revision

    async def get(self, key: str) -> KeyValue | None:
        """The key, or None if absent. Raises `ValueDecodeError` if its value is not JSON."""
        self._check_open()
        return self.core.get(key)

    async def get_many(self, keys: Sequence[str]) -> list[KeyValue | None]:
        """Each key or None, at the current revision: `get` of each (nothing runs between
        them), so that a store built on this one changes reads in one place."""
        _codec.check_keys(keys)
        return [await self.get(key) for key in keys]

    async def get_prefix(self, prefix: str) -> Listing:
        """Every key starting with `prefix`, sorted by key, at the current revision."""
        self._check_open()
        return self.core.get_prefix(prefix)

    async def get_and_list(self, key: str, prefix: str) -> tuple[KeyValue | None, Listing]:
        """`get` and `get_prefix` at the current revision (nothing runs between them)."""
        return await self.get(key), await self.get_prefix(prefix)

    async def put(self, key: str, value: Any, lease: int | None = None) -> int:
        """Write `value` (JSON) at `key`; returns the new revision."""
        self._check_open()
        return self.core.put(key, value, lease)

    async def put_raw(self, key: str, data: bytes, lease: int | None = None) -> int:
        """Write raw bytes (possibly not JSON). For tools and tests of bad input."""
        self._check_open()
        return self.core.put_raw(key, data, lease)

    async def delete(self, key: str) -> bool:
        """Delete `key`; True if it existed."""
        self._check_open()
        return self.core.delete(key)

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with `prefix` at one revision; returns the count."""
        self._check_open()
        return self.core.delete_prefix(prefix)

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult:
        """Atomically apply `success` if every compare holds, else `failure`."""
        self._check_open()
        return self.core.txn(compare, success, failure)

    async def compact(self, revision: int) -> None:
        """Forget history before `revision`; watching from an earlier revision then fails."""
        self._check_open()
        self.core.compact(revision)

    # -- watches -----------------------------------------------------------------------------

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        """Watch `prefix` from `start_revision` (None: changes after this call).

        Past events still in the log are replayed first; if `start_revision` was compacted
        the watch yields one ``compacted`` event and ends.
        """
        self._check_open()
        watch = Watch(prefix, on_close=self._forget_watch)
        if replay_into(watch, self.core, start_revision):
            self._watches.add((prefix, watch))
        return watch

    def _notify(self, events: Sequence[LogEvent]) -> None:
        for prefix, watch in list(self._watches):
            for event in events:
                if event.key.startswith(prefix):
                    watch.deliver_nowait(event.watch_event())

    def _forget_watch(self, watch: Watch) -> None:
        self._watches.discard((watch.prefix, watch))

    # -- leases ------------------------------------------------------------------------------

    async def grant_lease(self, ttl: float) -> Lease:
        """Grant a lease of `ttl` seconds on the store's clock."""
        self._check_open()
        lease_id = self.core.grant_lease(ttl)
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
        try:
            self.core.refresh_lease(lease_id)
        except LeaseNotFoundError:
            self._handles.pop(lease_id, None)
            raise

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease and delete its keys at one revision (unknown ids are ignored)."""
        self._check_open()
        handle = self._handles.pop(lease_id, None)
        if handle is not None:
            await handle.stop_keep_alive()
        self.core.revoke_lease(lease_id)

    async def lease_time_to_live(self, lease_id: int) -> float | None:
        """Seconds left before the lease expires, or None if it does not exist."""
        self._check_open()
        return self.core.lease_time_to_live(lease_id)

    async def _reap(self) -> None:
        """Expire leases at their deadlines on the injected clock."""
        while True:
            self.core.expire_due()
            self._lease_changed.clear()
            waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._lease_changed.wait())]
            deadline = self.core.next_deadline()
            if deadline is not None:
                waiters.append(
                    asyncio.ensure_future(self._clock.sleep(deadline - self._clock.now()))
                )
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
