"""`CoreStore`: the contract's async methods on a bare `StoreCore`, for the contract suite.

Every call goes straight to the synchronous core, as the simulator drives it: no lease
reaper (an expired lease is revoked by the next operation, which is all the contract
asks), watches fed by the core's listener. It holds the core itself to the contract
`MemoryStore` and `EtcdStore` meet, not only the shell around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ballast.clock import SystemClock
from ballast.metadata import (
    Compare,
    Delete,
    KeyValue,
    Lease,
    Listing,
    MetadataError,
    Put,
    TxnResult,
    Watch,
)
from ballast.metadata.core import LogEvent, StoreCore
from ballast.metadata.memory import replay_into
from ballast.metadata.store import TxnHelpers


class CoreStore(TxnHelpers):
    def __init__(self) -> None:
        self.clock = SystemClock()
        self.core = StoreCore(self.clock.now)
        self.core.listen(self._deliver)
        self.watches: set[Watch] = set()
        self.leases: list[Lease] = []
        self.closed = False

    def _open(self) -> StoreCore:
        if self.closed:
            raise MetadataError("metadata store is closed")
        return self.core

    async def close(self) -> None:
        self.closed = True
        for lease in self.leases:
            await lease.stop_keep_alive()
        for watch in list(self.watches):
            watch.finish()

    async def get(self, key: str) -> KeyValue | None:
        return self._open().get(key)

    async def get_many(self, keys: Sequence[str]) -> list[KeyValue | None]:
        return self._open().get_many(keys)

    async def get_prefix(self, prefix: str) -> Listing:
        return self._open().get_prefix(prefix)

    async def get_and_list(self, key: str, prefix: str) -> tuple[KeyValue | None, Listing]:
        return self._open().get(key), self._open().get_prefix(prefix)

    async def put(self, key: str, value: Any, lease: int | None = None) -> int:
        return self._open().put(key, value, lease)

    async def put_raw(self, key: str, data: bytes, lease: int | None = None) -> int:
        return self._open().put_raw(key, data, lease)

    async def delete(self, key: str) -> bool:
        return self._open().delete(key)

    async def delete_prefix(self, prefix: str) -> int:
        return self._open().delete_prefix(prefix)

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult:
        return self._open().txn(compare, success, failure)

    async def compact(self, revision: int) -> None:
        self._open().compact(revision)

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        watch = Watch(prefix, on_close=self.watches.discard)
        if replay_into(watch, self._open(), start_revision):
            self.watches.add(watch)
        return watch

    def _deliver(self, events: Sequence[LogEvent]) -> None:
        for watch in list(self.watches):
            for event in events:
                if event.key.startswith(watch.prefix):
                    watch.deliver_nowait(event.watch_event())

    async def grant_lease(self, ttl: float) -> Lease:
        lease_id = self._open().grant_lease(ttl)
        lease = Lease(
            lease_id, ttl, refresh=self.refresh_lease, revoke=self.revoke_lease, clock=self.clock
        )
        self.leases.append(lease)
        return lease

    async def refresh_lease(self, lease_id: int) -> None:
        self._open().refresh_lease(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        self._open().revoke_lease(lease_id)

    async def lease_time_to_live(self, lease_id: int) -> float | None:
        return self._open().lease_time_to_live(lease_id)
