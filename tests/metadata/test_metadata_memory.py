"""`MemoryStore` beyond the contract: leases on a fake clock, history limits, concurrency."""

from __future__ import annotations

import asyncio
import random

import pytest
from metadata_helpers import assert_quiet, next_event, take

from ballast.clock import FakeClock
from ballast.metadata import (
    CompactedError,
    Compare,
    Delete,
    EtcdStore,
    MemoryStore,
    MetadataError,
    Put,
    WatchEvent,
    open_store,
)

pytestmark = pytest.mark.timeout(30)


async def test_lease_expires_on_the_injected_clock() -> None:
    clock = FakeClock()
    async with MemoryStore(clock) as store:
        lease = await store.grant_lease(10)
        await store.put("/reg/b1", {"url": "x"}, lease=lease.id)
        await store.put("/reg/b2", {"url": "y"})  # no lease: must survive
        async with store.watch_prefix("/reg/") as watch:
            await clock.advance(9.5)
            assert await store.get("/reg/b1") is not None
            assert await store.lease_time_to_live(lease.id) == pytest.approx(0.5)

            await clock.advance(1.5)  # past the TTL, no keep-alive
            assert await store.get("/reg/b1") is None
            assert await store.get("/reg/b2") is not None
            event = await next_event(watch, timeout=1)
            assert (event.kind, event.key) == ("delete", "/reg/b1")
            await assert_quiet(watch, 0.05)
        assert await store.lease_time_to_live(lease.id) is None


async def test_expiry_happens_without_any_store_call() -> None:
    # The reaper task alone must expire the lease: a watcher learns of it with no reads.
    clock = FakeClock()
    async with MemoryStore(clock) as store:
        long = await store.grant_lease(100)
        short = await store.grant_lease(5)  # granted later, expires first
        await store.put("/k/long", 1, lease=long.id)
        await store.put("/k/short", 1, lease=short.id)
        async with store.watch_prefix("/k/") as watch:
            await clock.advance(6)
            event = await next_event(watch, timeout=1)
            assert (event.kind, event.key) == ("delete", "/k/short")
            await clock.advance(100)
            event = await next_event(watch, timeout=1)
            assert (event.kind, event.key) == ("delete", "/k/long")


async def test_keep_alive_on_the_fake_clock_keeps_the_lease_until_stopped() -> None:
    clock = FakeClock()
    async with MemoryStore(clock) as store:
        lease = await store.grant_lease(3)
        await store.put("/leader", "b1", lease=lease.id)
        lease.start_keep_alive()
        await clock.advance(30)  # ten TTLs; the keep-alive ticks every second of fake time
        assert await store.get("/leader") is not None
        await lease.stop_keep_alive()
        await clock.advance(3.5)
        assert await store.get("/leader") is None
        with pytest.raises(MetadataError):
            await lease.refresh()


async def test_history_limit_compacts_old_events() -> None:
    async with MemoryStore(history_limit=10) as store:
        first = await store.put("/h/0", 0)
        revisions = [first] + [await store.put(f"/h/{i}", i) for i in range(1, 30)]
        async with store.watch_prefix("/h/", first) as watch:
            event = await next_event(watch)
            assert event.kind == "compacted"
            with pytest.raises(StopAsyncIteration):
                await next_event(watch)
        # Recent history is still there.
        async with store.watch_prefix("/h/", revisions[-3]) as watch:
            assert [e.value for e in await take(watch, 3)] == [27, 28, 29]


async def test_compact_rejects_future_and_already_compacted_revisions() -> None:
    async with MemoryStore() as store:
        rev = await store.put("/a", 1)
        with pytest.raises(MetadataError, match="store is at"):
            await store.compact(rev + 5)
        await store.compact(rev)
        with pytest.raises(CompactedError, match="re-list"):
            await store.compact(rev)


async def test_revisions_start_like_etcd_and_skip_no_op_writes() -> None:
    async with MemoryStore() as store:
        assert (await store.get_prefix("/")).revision == 1
        assert await store.put("/a", 1) == 2
        assert not await store.delete("/missing")
        assert await store.delete_prefix("/missing/") == 0
        assert (await store.txn([Compare.absent("/a")], [Put("/b", 1)])).revision == 2
        assert store.revision == 2


async def test_many_tasks_interleaving_keep_the_event_log_consistent() -> None:
    # 50 tasks doing random writes; a watcher from revision 1 must rebuild exactly the
    # final state, with strictly ordered revisions.
    async with MemoryStore() as store:
        watch = store.watch_prefix("/c/", 1)
        rng = random.Random(7)

        async def worker(n: int) -> None:
            for i in range(40):
                key = f"/c/{rng.randrange(20)}"
                roll = rng.random()
                if roll < 0.5:
                    await store.put(key, [n, i])
                elif roll < 0.7:
                    await store.delete(key)
                elif roll < 0.9:
                    kv = await store.get(key)
                    await store.compare_and_swap(key, kv.mod_revision if kv else 0, [n, i])
                else:
                    await store.txn([], [Put(key, n), Delete(key + "/child")])
                await asyncio.sleep(0)

        await asyncio.gather(*(worker(n) for n in range(50)))
        final = await store.get_prefix("/c/")
        await watch.aclose()
        rebuilt: dict[str, object] = {}
        last = 0
        async for event in watch:
            assert event.revision >= last
            last = event.revision
            if event.kind == "put":
                rebuilt[event.key] = event.value
            else:
                rebuilt.pop(event.key, None)
        assert last == final.revision
        assert rebuilt == {kv.key: kv.value for kv in final.items}


async def test_watch_after_close_is_refused() -> None:
    store = MemoryStore()
    await store.close()
    with pytest.raises(MetadataError, match="closed"):
        store.watch_prefix("/a/")


def test_history_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="history_limit"):
        MemoryStore(history_limit=0)


# -- open_store ---------------------------------------------------------------------------------


async def test_open_store_picks_the_implementation() -> None:
    clock = FakeClock()
    for url in (None, "memory", " MEMORY:// "):
        store = open_store(url, clock)
        assert isinstance(store, MemoryStore)
        # The memory store runs on the clock it was given.
        lease = await store.grant_lease(1)
        await store.put("/k", 1, lease=lease.id)
        await clock.advance(2)
        assert await store.get("/k") is None
        await store.close()

    etcd = open_store("http://10.0.0.1:2379,http://10.0.0.2:2379", clock, timeout=3)
    assert isinstance(etcd, EtcdStore)
    assert etcd.endpoints == ["10.0.0.1:2379", "10.0.0.2:2379"]
    await etcd.close()


def test_open_store_rejects_unknown_urls() -> None:
    with pytest.raises(ValueError, match="expected 'memory' or etcd endpoints"):
        open_store("redis://localhost:6379", None)


async def test_watch_events_are_values() -> None:
    async with MemoryStore() as store, store.watch_prefix("/v/") as watch:
        rev = await store.put("/v/a", {"x": 1})
        event = await next_event(watch)
        assert event == WatchEvent("put", "/v/a", {"x": 1}, rev)
        with pytest.raises(AttributeError):
            setattr(event, "kind", "delete")  # noqa: B010 (frozen: must raise)


async def test_close_and_revoke_stop_keep_alive_tasks() -> None:
    clock = FakeClock()
    store = MemoryStore(clock)
    revoked, kept = await store.grant_lease(3), await store.grant_lease(3)
    revoked.start_keep_alive()
    kept.start_keep_alive()
    await store.revoke_lease(revoked.id)  # by id, not through the handle
    assert not revoked.keeping_alive
    assert kept.keeping_alive
    await store.close()
    assert not kept.keeping_alive  # no task left refreshing against a closed store
