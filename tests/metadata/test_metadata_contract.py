"""The `MetadataStore` contract: every test runs against `MemoryStore`, its synchronous core
(`StoreCore`, the simulator's store) and `EtcdStore`."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from core_store import CoreStore
from metadata_helpers import assert_quiet, eventually, next_event, take

from ballast.metadata import (
    Compare,
    Delete,
    EtcdStore,
    LeaseNotFoundError,
    MemoryStore,
    MetadataError,
    MetadataStore,
    Put,
    ValueDecodeError,
    ValueEncodeError,
    WatchEvent,
)

pytestmark = pytest.mark.timeout(30)

Store = MemoryStore | CoreStore | EtcdStore


def test_both_stores_satisfy_the_protocol(store: Store) -> None:
    assert isinstance(store, MetadataStore)


# -- put / get ---------------------------------------------------------------------------------


async def test_put_get_roundtrip_tracks_revisions_and_versions(store: Store, prefix: str) -> None:
    key = prefix + "k"
    assert await store.get(key) is None

    rev1 = await store.put(key, {"a": 1, "nested": [1, "x", None, True, 2.5]})
    kv = await store.get(key)
    assert kv is not None
    assert kv.key == key
    assert kv.value == {"a": 1, "nested": [1, "x", None, True, 2.5]}
    assert (kv.create_revision, kv.mod_revision, kv.version, kv.lease) == (rev1, rev1, 1, None)

    rev2 = await store.put(key, "second")
    assert rev2 > rev1
    kv = await store.get(key)
    assert kv is not None
    assert (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (
        "second",
        rev1,
        rev2,
        2,
    )


@pytest.mark.parametrize("value", [None, 0, -3, 1.5, "", "ü ✓", [], {}, {"k": {"n": [1]}}, True])
async def test_every_json_value_roundtrips(store: Store, prefix: str, value: object) -> None:
    await store.put(prefix + "v", value)
    kv = await store.get(prefix + "v")
    assert kv is not None and kv.value == value


async def test_unencodable_value_is_rejected_and_nothing_written(store: Store, prefix: str) -> None:
    with pytest.raises(ValueEncodeError, match=prefix + "bad"):
        await store.put(prefix + "bad", {"when": object()})
    with pytest.raises(ValueEncodeError):
        await store.put(prefix + "nan", float("nan"))
    assert await store.get(prefix + "bad") is None


async def test_empty_key_is_rejected(store: Store) -> None:
    with pytest.raises(MetadataError, match="non-empty"):
        await store.put("", 1)
    with pytest.raises(MetadataError, match="non-empty"):
        await store.get_prefix("")


async def test_get_on_non_json_value_names_the_key(store: Store, prefix: str) -> None:
    await store.put_raw(prefix + "raw", b"\x00not json")
    with pytest.raises(ValueDecodeError, match=prefix + "raw") as info:
        await store.get(prefix + "raw")
    assert info.value.key == prefix + "raw"


async def test_get_many_reads_each_key_or_none_in_order(store: Store, prefix: str) -> None:
    first = await store.put(prefix + "a", 1)
    await store.put(prefix + "c", {"c": 3})
    found = await store.get_many([prefix + "c", prefix + "b", prefix + "a"])
    assert [kv.value if kv else None for kv in found] == [{"c": 3}, None, 1]
    assert found[2] is not None and found[2].mod_revision == first
    assert await store.get_many([]) == []


async def test_get_and_list_reads_a_key_and_a_prefix_at_one_revision(
    store: Store, prefix: str
) -> None:
    meta = await store.put(prefix + "meta", {"m": 1})
    for i in range(3):
        await store.put(f"{prefix}s/{i}", i)
    await store.put_raw(prefix + "s/raw", b"\x00not json")
    kv, listing = await store.get_and_list(prefix + "meta", prefix + "s/")
    assert kv is not None and (kv.value, kv.mod_revision) == ({"m": 1}, meta)
    assert [item.value for item in listing.items] == [0, 1, 2]
    assert [e.key for e in listing.undecodable] == [prefix + "s/raw"]
    assert listing.revision == (await store.get_prefix(prefix + "s/")).revision
    absent, empty = await store.get_and_list(prefix + "none", prefix + "nothing/")
    assert (absent, empty.items) == (None, [])


async def test_get_many_names_a_non_json_value_and_refuses_too_many_keys(
    store: Store, prefix: str
) -> None:
    await store.put_raw(prefix + "raw", b"\x00not json")
    with pytest.raises(ValueDecodeError, match=prefix + "raw"):
        await store.get_many([prefix + "ok", prefix + "raw"])
    with pytest.raises(MetadataError, match="129 keys in one read: at most 128"):
        await store.get_many([f"{prefix}k{i}" for i in range(129)])
    assert len(await store.get_many([f"{prefix}k{i}" for i in range(128)])) == 128


# -- prefixes ----------------------------------------------------------------------------------


async def test_get_prefix_is_sorted_scoped_and_carries_the_read_revision(
    store: Store, prefix: str
) -> None:
    for name in ("b", "a", "c/d"):
        await store.put(prefix + "in/" + name, name)
    await store.put(prefix + "in", "not under in/")
    last = await store.put(prefix + "inx", "sibling")

    listing = await store.get_prefix(prefix + "in/")
    assert [kv.key for kv in listing.items] == [prefix + "in/a", prefix + "in/b", prefix + "in/c/d"]
    assert [kv.value for kv in listing.items] == ["a", "b", "c/d"]
    assert listing.revision >= last
    assert listing.undecodable == []
    assert (await store.get_prefix(prefix + "none/")).items == []


async def test_get_prefix_reports_undecodable_values_without_hiding_the_rest(
    store: Store, prefix: str
) -> None:
    await store.put(prefix + "a", 1)
    await store.put_raw(prefix + "b", b"{broken")
    await store.put(prefix + "c", 3)
    listing = await store.get_prefix(prefix)
    assert [kv.value for kv in listing.items] == [1, 3]
    assert [e.key for e in listing.undecodable] == [prefix + "b"]


async def test_large_prefix_is_listed_completely(store: Store, prefix: str) -> None:
    # More keys than one etcd page in the paginated test below, and enough to matter here.
    await asyncio.gather(*(store.put(f"{prefix}{i:04d}", i) for i in range(300)))
    listing = await store.get_prefix(prefix)
    assert [kv.value for kv in listing.items] == list(range(300))


# -- deletes -----------------------------------------------------------------------------------


async def test_delete_reports_whether_the_key_existed(store: Store, prefix: str) -> None:
    await store.put(prefix + "k", 1)
    assert await store.delete(prefix + "k") is True
    assert await store.get(prefix + "k") is None
    assert await store.delete(prefix + "k") is False

    # A re-created key starts a new life: version 1, new create revision.
    rev = await store.put(prefix + "k", 2)
    kv = await store.get(prefix + "k")
    assert kv is not None and (kv.version, kv.create_revision) == (1, rev)


async def test_delete_prefix_counts_and_leaves_siblings(store: Store, prefix: str) -> None:
    for i in range(5):
        await store.put(f"{prefix}d/{i}", i)
    await store.put(prefix + "dx", "sibling")
    assert await store.delete_prefix(prefix + "d/") == 5
    assert (await store.get_prefix(prefix + "d/")).items == []
    assert await store.get(prefix + "dx") is not None
    assert await store.delete_prefix(prefix + "d/") == 0


# -- transactions ------------------------------------------------------------------------------


async def test_txn_success_branch_applies_all_ops_at_one_revision(
    store: Store, prefix: str
) -> None:
    await store.put(prefix + "old/1", 1)
    await store.put(prefix + "old/2", 2)
    await store.put(prefix + "gone", 0)
    result = await store.txn(
        [Compare.absent(prefix + "a")],
        [
            Put(prefix + "a", "A"),
            Put(prefix + "b", "B"),
            Delete(prefix + "old/", prefix=True),
            Delete(prefix + "gone"),
        ],
        [Put(prefix + "failed", True)],
    )
    assert result.succeeded
    a, b = await store.get(prefix + "a"), await store.get(prefix + "b")
    assert a is not None and b is not None
    assert a.mod_revision == b.mod_revision == result.revision
    assert (await store.get_prefix(prefix + "old/")).items == []
    assert await store.get(prefix + "gone") is None
    assert await store.get(prefix + "failed") is None


async def test_txn_failure_branch_runs_when_a_compare_fails(store: Store, prefix: str) -> None:
    await store.put(prefix + "a", 1)
    result = await store.txn(
        [Compare.absent(prefix + "b"), Compare.absent(prefix + "a")],
        [Put(prefix + "success", 1)],
        [Put(prefix + "failure", 1)],
    )
    assert not result.succeeded
    assert await store.get(prefix + "success") is None
    failure = await store.get(prefix + "failure")
    assert failure is not None and failure.mod_revision == result.revision


async def test_txn_without_writes_does_not_change_anything(store: Store, prefix: str) -> None:
    rev = await store.put(prefix + "a", 1)
    result = await store.txn([Compare.value_equals(prefix + "a", 2)], [Put(prefix + "a", 3)])
    assert not result.succeeded
    assert result.revision >= rev
    kv = await store.get(prefix + "a")
    assert kv is not None and (kv.value, kv.mod_revision) == (1, rev)


async def test_compare_targets_and_operators(store: Store, prefix: str) -> None:
    key = prefix + "c"
    created = await store.put(key, {"x": [1, 2]})
    modified = await store.put(key, {"x": [1, 2]})
    cases: list[tuple[Compare, bool]] = [
        (Compare(key, "value", "==", {"x": [1, 2]}), True),
        (Compare(key, "value", "!=", {"x": [1, 2]}), False),
        (Compare(key, "value", "==", {"x": [2, 1]}), False),
        (Compare(key, "value", "<", {"x": [1, 3]}), True),  # byte order of the JSON
        (Compare(key, "version", "==", 2), True),
        (Compare(key, "version", ">", 1), True),
        (Compare(key, "version", "<", 2), False),
        (Compare(key, "create_revision", "==", created), True),
        (Compare(key, "create_revision", "<", modified), True),
        (Compare(key, "mod_revision", "==", modified), True),
        (Compare(key, "mod_revision", "!=", modified), False),
        (Compare(key, "mod_revision", ">", created), True),
    ]
    outcomes = [(await store.txn([c], [])).succeeded for c, _ in cases]
    assert outcomes == [expected for _, expected in cases]
    # Several compares: all must hold.
    both = [cases[0][0], cases[2][0]]
    assert not (await store.txn(both, [])).succeeded


async def test_value_compare_uses_canonical_json(store: Store, prefix: str) -> None:
    # Dict key order must not matter: both stores encode with sorted keys.
    await store.put(prefix + "c", {"b": 1, "a": 2})
    assert (await store.txn([Compare.value_equals(prefix + "c", {"a": 2, "b": 1})], [])).succeeded


async def test_compares_on_a_missing_key(store: Store, prefix: str) -> None:
    missing = prefix + "missing"
    assert (await store.txn([Compare.absent(missing)], [])).succeeded
    assert (await store.txn([Compare.mod_revision_equals(missing, 0)], [])).succeeded
    assert not (await store.txn([Compare.present(missing)], [])).succeeded
    # As in etcd, a value compare against a missing key is false whatever the operator.
    assert not (await store.txn([Compare(missing, "value", "!=", 1)], [])).succeeded


async def test_txn_rejects_a_branch_that_writes_a_key_twice(store: Store, prefix: str) -> None:
    with pytest.raises(MetadataError, match="twice"):
        await store.txn([], [Put(prefix + "a", 1), Put(prefix + "a", 2)])
    with pytest.raises(MetadataError, match="both deletes and puts"):
        await store.txn([], [Delete(prefix, prefix=True), Put(prefix + "a", 2)])
    with pytest.raises(MetadataError, match="must be an int"):
        await store.txn([Compare(prefix + "a", "version", "==", "1")], [])
    assert await store.get(prefix + "a") is None


async def test_create_if_absent(store: Store, prefix: str) -> None:
    assert await store.create_if_absent(prefix + "leader", {"broker_id": "b1"})
    assert not await store.create_if_absent(prefix + "leader", {"broker_id": "b2"})
    kv = await store.get(prefix + "leader")
    assert kv is not None and kv.value == {"broker_id": "b1"}


async def test_compare_and_swap_and_delete_are_fenced_by_mod_revision(
    store: Store, prefix: str
) -> None:
    key = prefix + "fenced"
    rev = await store.put(key, 1)
    assert await store.compare_and_swap(key, rev, 2)
    assert not await store.compare_and_swap(key, rev, 3), "a stale revision must not win"
    kv = await store.get(key)
    assert kv is not None and kv.value == 2

    assert not await store.compare_and_delete(key, rev)
    assert await store.compare_and_delete(key, kv.mod_revision)
    assert await store.get(key) is None
    assert not await store.compare_and_delete(key, 0)
    # mod_revision 0 means "absent": compare-and-swap creates.
    assert await store.compare_and_swap(key, 0, "created")


async def test_concurrent_create_if_absent_has_exactly_one_winner(
    store: Store, prefix: str
) -> None:
    results = await asyncio.gather(
        *(store.create_if_absent(prefix + "leader", i) for i in range(64))
    )
    assert sum(results) == 1
    kv = await store.get(prefix + "leader")
    assert kv is not None and results[kv.value]


async def test_concurrent_cas_increments_lose_no_update(store: Store, prefix: str) -> None:
    key = prefix + "counter"
    await store.put(key, 0)

    async def increment() -> None:
        while True:
            kv = await store.get(key)
            assert kv is not None
            if await store.compare_and_swap(key, kv.mod_revision, kv.value + 1):
                return

    await asyncio.gather(*(increment() for _ in range(20)))
    kv = await store.get(key)
    assert kv is not None and kv.value == 20 and kv.version == 21


# -- watches -----------------------------------------------------------------------------------


async def test_watch_replays_from_a_revision_then_streams_live(store: Store, prefix: str) -> None:
    r1 = await store.put(prefix + "a", 1)
    r2 = await store.put(prefix + "b", 2)
    await store.put(prefix.rstrip("/") + "-outside", "x")  # a sibling, not under the prefix
    async with store.watch_prefix(prefix, r1) as watch:
        assert await take(watch, 2) == [
            WatchEvent("put", prefix + "a", 1, r1),
            WatchEvent("put", prefix + "b", 2, r2),
        ]
        r3 = (await store.txn([], [Delete(prefix + "a")])).revision
        r4 = await store.put(prefix + "c", {"v": 3})
        assert await take(watch, 2) == [
            WatchEvent("delete", prefix + "a", None, r3),
            WatchEvent("put", prefix + "c", {"v": 3}, r4),
        ]
        await assert_quiet(watch)


async def test_watch_from_listing_revision_misses_nothing(store: Store, prefix: str) -> None:
    await store.put(prefix + "a", 1)
    listing = await store.get_prefix(prefix)
    rev = await store.put(prefix + "b", 2)  # between the listing and the watch
    async with store.watch_prefix(prefix, listing.revision + 1) as watch:
        assert await next_event(watch) == WatchEvent("put", prefix + "b", 2, rev)
        await assert_quiet(watch)


async def test_watch_without_start_sees_changes_after_it_is_ready(
    store: Store, prefix: str
) -> None:
    await store.put(prefix + "before", 0)
    async with store.watch_prefix(prefix) as watch:
        await watch.ready()
        rev = await store.put(prefix + "after", 1)
        assert await next_event(watch) == WatchEvent("put", prefix + "after", 1, rev)
        await assert_quiet(watch)


async def test_watch_is_scoped_to_its_prefix(store: Store, prefix: str) -> None:
    async with store.watch_prefix(prefix + "ab/") as watch:
        await watch.ready()
        await store.put(prefix + "abc", "sibling, not under ab/")
        await store.put(prefix + "a", "parent")
        rev = await store.put(prefix + "ab/x", "in")
        assert await next_event(watch) == WatchEvent("put", prefix + "ab/x", "in", rev)
        await assert_quiet(watch)


async def test_txn_events_share_one_revision_in_op_order(store: Store, prefix: str) -> None:
    await store.put(prefix + "z", 0)
    async with store.watch_prefix(prefix) as watch:
        await watch.ready()
        result = await store.txn(
            [], [Put(prefix + "x", 1), Delete(prefix + "z"), Put(prefix + "y", 2)]
        )
        events = await take(watch, 3)
        assert {e.revision for e in events} == {result.revision}
        assert [(e.kind, e.key) for e in events] == [
            ("put", prefix + "x"),
            ("delete", prefix + "z"),
            ("put", prefix + "y"),
        ]


async def test_delete_prefix_emits_one_delete_per_key(store: Store, prefix: str) -> None:
    for i in range(3):
        await store.put(f"{prefix}{i}", i)
    async with store.watch_prefix(prefix) as watch:
        await watch.ready()
        await store.delete_prefix(prefix)
        events = await take(watch, 3)
        assert sorted(e.key for e in events) == [f"{prefix}{i}" for i in range(3)]
        assert all(e.kind == "delete" and e.value is None for e in events)
        assert len({e.revision for e in events}) == 1


async def test_non_json_value_yields_error_event_and_the_watch_keeps_going(
    store: Store, prefix: str
) -> None:
    async with store.watch_prefix(prefix) as watch:
        await watch.ready()
        bad_rev = await store.put_raw(prefix + "bad", b"{oops")
        await store.put_raw(prefix + "bad-utf8", b"\xff\xfe")
        good_rev = await store.put(prefix + "good", {"ok": True})
        bad, bad_utf8, good = await take(watch, 3)
        assert (bad.kind, bad.key, bad.revision, bad.value) == (
            "error",
            prefix + "bad",
            bad_rev,
            None,
        )
        assert bad.error is not None and prefix + "bad" in bad.error
        assert (bad_utf8.kind, bad_utf8.key) == ("error", prefix + "bad-utf8")
        assert good == WatchEvent("put", prefix + "good", {"ok": True}, good_rev)


async def test_many_watchers_each_see_every_event(store: Store, prefix: str) -> None:
    watches = [store.watch_prefix(prefix) for _ in range(10)]
    try:
        await asyncio.gather(*(w.ready() for w in watches))
        revs = [await store.put(f"{prefix}{i}", i) for i in range(20)]
        for w in watches:
            assert [e.revision for e in await take(w, 20)] == revs
    finally:
        for w in watches:
            await w.aclose()


async def test_closing_a_watch_ends_iteration(store: Store, prefix: str) -> None:
    watch = store.watch_prefix(prefix)
    await watch.ready()

    received: list[WatchEvent] = []

    async def consume() -> None:
        async for event in watch:
            received.append(event)

    consumer = asyncio.create_task(consume())
    rev = await store.put(prefix + "a", 1)

    async def got_it() -> bool:
        return bool(received)

    await eventually(got_it, 5)
    await watch.aclose()
    await asyncio.wait_for(consumer, 5)
    assert received == [WatchEvent("put", prefix + "a", 1, rev)]
    with pytest.raises(StopAsyncIteration):
        await anext(watch)


async def test_closing_the_store_ends_open_watches(store: Store, prefix: str) -> None:
    watch = store.watch_prefix(prefix)
    await watch.ready()
    await store.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(watch), 5)
    with pytest.raises(MetadataError, match="closed"):
        await store.get(prefix + "a")


async def test_watch_from_a_compacted_revision_yields_compacted_then_ends(
    store: Store, prefix: str
) -> None:
    old = await store.put(prefix + "a", 1)
    await store.put(prefix + "a", 2)
    latest = await store.put(prefix + "a", 3)
    await store.compact(latest)
    async with store.watch_prefix(prefix, old) as watch:
        event = await next_event(watch)
        assert event.kind == "compacted"
        assert event.revision == latest  # the compaction point
        assert event.error is not None and "re-list" in event.error
        with pytest.raises(StopAsyncIteration):
            await next_event(watch)
    # Watching from the compaction point itself still works.
    async with store.watch_prefix(prefix, latest) as watch:
        assert await next_event(watch) == WatchEvent("put", prefix + "a", 3, latest)


# -- leases ------------------------------------------------------------------------------------


async def test_lease_binds_keys_and_revoke_deletes_them(store: Store, prefix: str) -> None:
    lease = await store.grant_lease(5)
    assert lease.ttl >= 5
    await store.put(prefix + "reg/1", {"url": "x"}, lease=lease.id)
    assert await store.create_if_absent(prefix + "leader", "b1", lease=lease.id)
    kv = await store.get(prefix + "reg/1")
    assert kv is not None and kv.lease == lease.id

    async with store.watch_prefix(prefix) as watch:
        await watch.ready()
        await lease.revoke()
        events = await take(watch, 2)
        assert sorted((e.kind, e.key) for e in events) == [
            ("delete", prefix + "leader"),
            ("delete", prefix + "reg/1"),
        ]
    assert await store.get(prefix + "reg/1") is None
    # Revoking again (or an unknown lease) is not an error.
    await store.revoke_lease(lease.id)


async def test_put_without_lease_detaches_the_key(store: Store, prefix: str) -> None:
    lease = await store.grant_lease(5)
    await store.put(prefix + "k", 1, lease=lease.id)
    await store.put(prefix + "k", 2)
    await store.revoke_lease(lease.id)
    kv = await store.get(prefix + "k")
    assert kv is not None and kv.value == 2 and kv.lease is None


async def test_put_with_unknown_lease_is_rejected(store: Store, prefix: str) -> None:
    lease = await store.grant_lease(5)
    await lease.revoke()
    with pytest.raises(LeaseNotFoundError, match=str(lease.id)):
        await store.put(prefix + "k", 1, lease=lease.id)
    with pytest.raises(LeaseNotFoundError):
        await store.txn([], [Put(prefix + "k", 1, lease=lease.id)])
    assert await store.get(prefix + "k") is None


async def test_kept_alive_lease_outlives_its_ttl_and_expires_once_stopped(
    store: Store, prefix: str
) -> None:
    lease = await store.grant_lease(1)
    await store.put(prefix + "alive", 1, lease=lease.id)
    lease.start_keep_alive()
    assert lease.keeping_alive
    await asyncio.sleep(2.5)  # > 2 TTLs
    assert await store.get(prefix + "alive") is not None

    async with store.watch_prefix(prefix) as watch:
        await watch.ready()
        await lease.stop_keep_alive()
        assert not lease.keeping_alive

        async def gone() -> bool:
            return await store.get(prefix + "alive") is None

        # etcd checks expiry every 500 ms; the contract is: gone within TTL + 1 s.
        assert await eventually(gone, lease.ttl + 1.0) <= lease.ttl + 1.0
        event = await next_event(watch)
        assert (event.kind, event.key) == ("delete", prefix + "alive")

    with pytest.raises(LeaseNotFoundError):
        await lease.refresh()
    # A keep-alive started on a dead lease stops and signals `lost`.
    lease.start_keep_alive()
    await asyncio.wait_for(lease.lost.wait(), 5)
    assert isinstance(lease.error, LeaseNotFoundError)


async def test_lease_as_context_manager_keeps_alive_then_revokes(store: Store, prefix: str) -> None:
    async with await store.grant_lease(2) as lease:
        assert lease.keeping_alive
        await store.put(prefix + "k", 1, lease=lease.id)
    assert not lease.keeping_alive
    assert await store.get(prefix + "k") is None


async def test_invalid_lease_ttl_is_rejected(store: Store) -> None:
    with pytest.raises(MetadataError, match="ttl"):
        await store.grant_lease(0)


async def test_store_is_an_async_context_manager(store: Store) -> None:
    async with store as entered:
        assert entered is store
    with pytest.raises(MetadataError, match="closed"):
        await store.put("/x", 1)
    with contextlib.suppress(MetadataError):
        await store.close()  # idempotent
