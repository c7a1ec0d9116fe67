"""ReliableTopic end to end: the reference move timeline, crash recovery, fencing, lifecycle."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ballast.clock import FakeClock
from ballast.metadata import MemoryStore, ValueDecodeError, keys
from ballast.metadata.etcd import EtcdStore
from ballast.storage import (
    AckMode,
    CommitStream,
    DurabilityTimeoutError,
    FsspecObjectStore,
    InitialPosition,
    Message,
    SealedState,
    StartSource,
    StorageConfig,
    StorageStats,
    Tier,
    TopicFencedError,
    TopicStateError,
    TopicStatus,
    WritePacer,
    load_catalog,
)
from ballast.storage.cursor import FOLD_MAX_CURSORS
from tests.etcd_fixtures import EtcdServer, etcd_server

from .helpers import FlakyObjectStore, advancing, collect, eventually, make_topic, payload

__all__ = ["etcd_server"]


async def append_range(topic: Any, start: int, stop: int) -> None:
    for offset in range(start, stop):
        assert await topic.append(payload(offset)) == offset


async def test_reference_timeline_move_from_a_to_b(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    """Danube's document, T1-T10: 0-21 on A (uploaded), cursor 13, seal; B continues."""
    async with make_topic("broker-a", tmp_path, **kw) as a:
        assert a.opened.source is StartSource.EMPTY
        sub = await a.subscribe("subs_reliable", initial=InitialPosition.EARLIEST)
        await append_range(a, 0, 22)
        assert await a.upload_now() == 21
        consumed = []
        async for item in sub:
            consumed.append(item.offset)
            if item.offset == 13:
                break
        assert consumed == list(range(14))
        await sub.ack(13)
        sealed = await a.seal()
    assert sealed == SealedState(True, 21, "broker-a", kw["clock"].now())
    assert a.status is TopicStatus.SEALED
    assert not a.directory.exists()  # local files released
    state = await metadata.get(keys.storage_state("/default/reliable_topic"))
    assert state is not None and state.value["sealed"] is True
    assert state.value["last_committed_offset"] == 21
    cursor = await metadata.get(
        keys.subscription_cursor("/default/reliable_topic", "subs_reliable")
    )
    assert cursor is not None and cursor.value["last_acked_offset"] == 13

    async with make_topic("broker-b", tmp_path, **kw) as b:
        opened = b.opened
        assert (opened.next_offset, opened.source) == (22, StartSource.SEALED)
        assert opened.previous_state is not None and opened.previous_state.broker_id == "broker-a"
        assert b.uploaded_offset == 21  # the uploader's checkpoint, from the catalog
        await append_range(b, 22, 28)
        sub = await b.subscribe("subs_reliable")
        assert sub.start_offset == 14
        items = await collect(b.read(sub.start_offset, live=False))
        assert [i.offset for i in items] == list(range(14, 28))
        assert [i.record.payload for i in items] == [payload(o) for o in range(14, 28)]
        assert [i.tier for i in items] == [Tier.OBJECT] * 8 + [Tier.WAL] * 6
        await sub.ack(27)
        assert await b.upload_now() == 27
    catalog = await load_catalog(metadata, b.topic)
    # Every acknowledged append was committed as it came (merging is tested elsewhere).
    assert [o for d in catalog.objects for o in range(d.start, d.end + 1)] == list(range(28))
    cursor = await metadata.get(
        keys.subscription_cursor("/default/reliable_topic", "subs_reliable")
    )
    assert cursor is not None and cursor.value["last_acked_offset"] == 27  # flushed on close


@pytest.mark.parametrize("subscriptions", [FOLD_MAX_CURSORS, FOLD_MAX_CURSORS + 1])
async def test_the_seal_writes_the_cursors_in_its_own_transaction_on_etcd(
    tmp_path: Path,
    object_store: FsspecObjectStore,
    clock: FakeClock,
    config: StorageConfig,
    etcd_server: EtcdServer,
    subscriptions: int,
) -> None:
    """Up to FOLD_MAX_CURSORS changed cursors ride in the sealed state's transaction (one
    round trip less on a move's path, within etcd's 128 operations); more are written
    first, one by one. Either way every cursor is stored and the next owner starts there."""
    topic = f"/default/fold-{subscriptions}"
    async with EtcdStore(etcd_server.client_url) as store:
        kw: dict[str, Any] = {
            "objects": object_store,
            "metadata": store,
            "clock": clock,
            "config": config,
        }
        async with make_topic("b1", tmp_path, topic=topic, **kw) as a:
            subs = [
                await a.subscribe(f"s{i}", initial=InitialPosition.EARLIEST)
                for i in range(subscriptions)
            ]
            await append_range(a, 0, 4)
            for i, sub in enumerate(subs):
                await sub.ack(i % 4)
            await a.seal()
        state = await store.get(keys.storage_state(topic))
        assert state is not None and state.value["sealed"] is True
        cursors = [
            await store.get(keys.subscription_cursor(topic, f"s{i}")) for i in range(subscriptions)
        ]
        assert all(kv is not None for kv in cursors)
        assert [kv.value["last_acked_offset"] for kv in cursors if kv] == [
            i % 4 for i in range(subscriptions)
        ]
        revisions = {kv.mod_revision for kv in cursors if kv}
        if subscriptions <= FOLD_MAX_CURSORS:
            assert revisions == {state.mod_revision}  # the very same transaction
        else:
            assert max(revisions) < state.mod_revision  # written before it
        async with make_topic("b2", tmp_path, topic=topic, **kw) as b:
            assert (await b.subscribe("s3")).start_offset == 4
            assert (await b.subscribe("s2")).start_offset == 3


async def test_danube_anchor_ack_0_to_4_unload_produce_8_more(
    tmp_path: Path, kw: dict[str, Any]
) -> None:
    """Produce 0-9, ack 0-4, unload, produce 8 more: the consumer sees exactly 5..17."""
    async with make_topic("b1", tmp_path, **kw) as first:
        sub = await first.subscribe("s", initial=InitialPosition.EARLIEST)
        await append_range(first, 0, 10)
        await sub.ack(4)
        await first.seal()  # nothing uploaded before: the seal drains the uploader
    async with make_topic("b2", tmp_path, **kw) as second:
        await append_range(second, 10, 18)
        sub = await second.subscribe("s")
        seen = [item.offset for item in await collect(second.read(sub.start_offset, live=False))]
    assert seen == list(range(5, 18))


async def test_live_subscriber_receives_appends_and_ends_on_seal(
    tmp_path: Path, kw: dict[str, Any]
) -> None:
    async with make_topic("b1", tmp_path, **kw) as topic:
        sub = await topic.subscribe("live")  # latest: starts at the next offset
        received: list[tuple[int, Tier]] = []

        async def consume() -> None:
            async for item in sub:
                received.append((item.offset, item.tier))

        consumer = asyncio.ensure_future(consume())
        await asyncio.sleep(0)
        await append_range(topic, 0, 5)
        await eventually(lambda: len(received) == 5)
        assert [o for o, _ in received] == [0, 1, 2, 3, 4]
        assert received[0][1] is Tier.LIVE
        await topic.seal()
        await asyncio.wait_for(consumer, 5)  # the stream ended with the topic


async def test_crash_without_seal_same_broker_continues_after_its_wal(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    async with make_topic("b1", tmp_path, **kw) as topic:
        await append_range(topic, 0, 30)  # acknowledged: committed to object storage
    # `async with` left without a seal: like a crash after the appends were acknowledged.
    stats = StorageStats()
    async with make_topic("b1", tmp_path, **kw, stats=stats) as again:
        opened = again.opened
        assert (opened.next_offset, opened.source, opened.local_end) == (
            30,
            StartSource.LOCAL_WAL,
            29,
        )
        assert opened.catalog_end == 29 and opened.discarded_segments == 0
        assert stats.opens_by_source == {"local_wal": 1}
        assert again.uploaded_offset == 29
        assert await again.upload_now() == 29  # nothing uploaded twice
        await append_range(again, 30, 33)
        items = await collect(again.read(0, live=False))
    assert [i.offset for i in items] == list(range(33))
    catalog = await load_catalog(metadata, again.topic)
    flat = [o for d in catalog.objects for o in range(d.start, d.end + 1)]
    assert flat == list(range(33))  # every offset exactly once


async def test_close_without_seal_other_broker_serves_everything_acknowledged(
    tmp_path: Path, kw: dict[str, Any]
) -> None:
    # Before acknowledgements waited for object storage, 22..25 were acknowledged while
    # only on b1's disk, and b2 (another host) had to skip them.
    async with make_topic("b1", tmp_path, **kw) as topic:
        await append_range(topic, 0, 26)
    async with make_topic("b2", tmp_path, **kw) as other:
        opened = other.opened
        assert (opened.next_offset, opened.source) == (26, StartSource.CATALOG)
        assert opened.local_end is None and opened.gap is None and other.gaps == ()
        await append_range(other, 26, 28)
        items = await collect(other.read(0, live=False))
    assert [i.offset for i in items] == list(range(28))


async def test_a_used_seal_is_not_trusted_after_the_next_owner_crashes(
    tmp_path: Path, kw: dict[str, Any]
) -> None:
    async with make_topic("a", tmp_path, **kw) as a:
        await append_range(a, 0, 22)
        await a.seal()
    async with make_topic("b", tmp_path, **kw) as b:
        await append_range(b, 22, 30)
    # b stopped without a seal. The state still mentions a's seal at 21 only if b never
    # claimed the topic; it did, so c does not continue at 22 but after b's commits.
    async with make_topic("c", tmp_path, **kw) as c:
        assert (c.opened.next_offset, c.opened.source) == (30, StartSource.CATALOG)
        assert c.opened.gap is None
        prev = c.opened.previous_state
        assert prev is not None and (prev.sealed, prev.broker_id) == (False, "b")
        # And if b comes back later, its stale segments are discarded after c's seal.
        await append_range(c, 30, 33)
        await c.seal()
    async with make_topic("b", tmp_path, **kw) as b_again:
        assert b_again.opened.source is StartSource.SEALED
        assert b_again.opened.next_offset == 33 and b_again.opened.discarded_segments >= 1
        assert b_again.gaps == ()
        items = await collect(b_again.read(0, live=False))
    expected = list(range(33))
    assert [i.offset for i in items] == expected
    assert [i.record.payload for i in items] == [payload(o) for o in expected]


async def test_seal_is_fenced_when_another_broker_claimed_the_topic(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    a = make_topic("a", tmp_path, **kw)
    await a.open()
    await append_range(a, 0, 3)
    async with make_topic("b", tmp_path, **kw) as b:
        # Split brain (the leader never assigns two owners; this test forces it): b sees
        # a's claim but nothing uploaded, and claims the topic in turn.
        prev = b.opened.previous_state
        assert prev is not None and (prev.sealed, prev.broker_id) == (False, "a")
        with pytest.raises(TopicFencedError, match="no longer owns"):
            await a.seal()
        assert a.status is TopicStatus.CLOSED
        assert a.directory.exists()  # a fenced owner deletes nothing
        state = await metadata.get(keys.storage_state(b.topic))
        assert state is not None and state.value["broker_id"] == "b"


async def test_appends_wait_through_failed_uploads_without_losing_or_duplicating(
    tmp_path: Path,
    object_store: FsspecObjectStore,
    metadata: MemoryStore,
    clock: FakeClock,
    config: StorageConfig,
) -> None:
    flaky = FlakyObjectStore(object_store, fail_puts=4)
    stats = StorageStats()
    topic = make_topic(
        "a",
        tmp_path,
        objects=flaky,
        metadata=metadata,
        clock=clock,
        config=replace(config, max_object_bytes=300),
        stats=stats,
    )
    async with topic:
        # The backoff sleeps on the fake clock: move time until the appends get through.
        await advancing(clock, append_range(topic, 0, 40))
        sealed = await topic.seal()
    assert sealed.last_committed_offset == 39
    assert stats.upload_failures == 4 and flaky.failed == 4
    catalog = await load_catalog(metadata, topic.topic)
    flat = [o for d in catalog.objects for o in range(d.start, d.end + 1)]
    assert flat == list(range(40))


async def test_nothing_is_acknowledged_while_object_storage_is_down_and_the_seal_waits(
    tmp_path: Path,
    object_store: FsspecObjectStore,
    metadata: MemoryStore,
    clock: FakeClock,
    config: StorageConfig,
) -> None:
    flaky = FlakyObjectStore(object_store, fail_puts=10**6)  # object storage is down
    config = replace(config, ack_timeout_seconds=0.2)
    topic = make_topic("a", tmp_path, objects=flaky, metadata=metadata, clock=clock, config=config)
    async with topic:
        with pytest.raises(DurabilityTimeoutError, match="offset 0 not committed"):
            await topic.append(payload(0))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await topic.seal()
        assert topic.status is TopicStatus.OPEN and topic.uploaded_offset == -1
        state = await metadata.get(keys.storage_state(topic.topic))
        assert state is not None and state.value["sealed"] is False
        flaky.fail_puts = 0  # storage is back: what was written is committed, then sealed
        sealed = await advancing(clock, topic.seal(), step=30)
        assert sealed.last_committed_offset == 0
    catalog = await load_catalog(metadata, topic.topic)
    assert [(d.start, d.end) for d in catalog.objects] == [(0, 0)]


async def test_lifecycle_refuses_illegal_operations(tmp_path: Path, kw: dict[str, Any]) -> None:
    topic = make_topic("a", tmp_path, **kw)
    with pytest.raises(TopicStateError, match="cannot append while new"):
        await topic.append(b"x")
    async with topic:
        with pytest.raises(TopicStateError, match="cannot open"):
            await topic.open()
        await topic.seal()
        with pytest.raises(TopicStateError, match="cannot append while sealed"):
            await topic.append(b"x")
        with pytest.raises(TopicStateError, match="cannot seal while sealed"):
            await topic.seal()
        with pytest.raises(TopicStateError, match="cannot read"):
            topic.read(0)
        with pytest.raises(ValueError, match="invalid topic name"):
            make_topic("a", tmp_path, **kw, topic="no-slash")


async def test_ack_beyond_the_end_is_refused(tmp_path: Path, kw: dict[str, Any]) -> None:
    async with make_topic("a", tmp_path, **kw) as topic:
        await append_range(topic, 0, 3)
        with pytest.raises(ValueError, match="ends at 2"):
            await topic.ack("s", 3)


async def test_each_append_is_committed_before_it_returns_and_small_objects_are_merged(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore, object_store: FsspecObjectStore
) -> None:
    config = replace(kw["config"], upload_interval_seconds=30, merge_grace_seconds=10)
    stats = StorageStats()
    async with make_topic("a", tmp_path, **{**kw, "config": config}, stats=stats) as topic:
        for offset in range(5):
            assert await topic.append(payload(offset)) == offset
            assert topic.uploaded_offset == offset  # the acknowledgement is the commit
        catalog = await load_catalog(metadata, topic.topic)
        assert [(d.start, d.end) for d in catalog.objects] == [(o, o) for o in range(5)]
        small = [d.object_id for d in catalog.objects]
        await kw["clock"].advance(30)  # the merge interval
        await eventually(lambda: stats.objects_merged == 5)
        catalog = await load_catalog(metadata, topic.topic)
        assert [(d.start, d.end) for d in catalog.objects] == [(0, 4)]
        assert await object_store.get(small[0])  # readers may still be on their way
        await kw["clock"].advance(30)  # past the grace: the merged objects are deleted
        await eventually(lambda: not (tmp_path / "objects" / small[0]).exists())
        items = await collect(topic.read(0, live=False))
        assert [i.offset for i in items] == list(range(5))
    # Once `merge_objects` small ones wait, they are merged without waiting for the clock.
    config = replace(config, merge_objects=4)
    async with make_topic("a", tmp_path, **{**kw, "config": config}, stats=stats) as topic:
        await append_range(topic, 5, 9)
        await eventually(lambda: stats.objects_merged == 9)
        catalog = await load_catalog(metadata, topic.topic)
        assert [(d.start, d.end) for d in catalog.objects] == [(0, 4), (5, 8)]


async def test_retention_then_tiered_read_has_no_gap_and_no_duplicate(
    tmp_path: Path, kw: dict[str, Any]
) -> None:
    config = replace(kw["config"], retention_seconds=10)
    async with make_topic("a", tmp_path, **{**kw, "config": config}) as topic:
        for start in range(0, 120, 10):
            await topic.append_batch([Message(payload(o)) for o in range(start, start + 10)])
        await kw["clock"].advance(11)
        await topic.upload_now()  # uploads, then applies retention
        wal_first = topic._wal.first_offset if topic._wal else 0
        assert wal_first > 0
        items = await collect(topic.read(0, live=False))
    assert [i.offset for i in items] == list(range(120))
    tiers = [i.tier for i in items]
    assert tiers[:wal_first] == [Tier.OBJECT] * wal_first
    assert set(tiers[wal_first:]) == {Tier.WAL}


class BuggyObjectStore(FlakyObjectStore):
    """Fails the next put with an unexpected error (a bug, not an outage)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.bugs = 1

    async def put(self, name: str, data: bytes) -> None:
        if self.bugs > 0:
            self.bugs -= 1
            raise RuntimeError("injected: unexpected failure")
        await super().put(name, data)


async def test_the_uploader_loop_survives_an_unexpected_error(
    tmp_path: Path, kw: dict[str, Any], object_store: FsspecObjectStore
) -> None:
    buggy = BuggyObjectStore(object_store)
    stats = StorageStats()
    async with make_topic("a", tmp_path, **{**kw, "objects": buggy}, stats=stats) as topic:
        await advancing(kw["clock"], append_range(topic, 0, 3))
        assert buggy.bugs == 0 and stats.upload_failures == 1
        assert topic.uploaded_offset == 2


async def test_a_non_live_reader_survives_the_seal_through_object_storage(
    tmp_path: Path, kw: dict[str, Any]
) -> None:
    async with make_topic("a", tmp_path, **kw) as topic:
        await append_range(topic, 0, 40)
        stream = topic.read(0, live=False)
        first = [await anext(stream) for _ in range(5)]
        await topic.seal()  # local files are gone now
        rest = [item async for item in stream]
    assert [i.offset for i in first + rest] == list(range(40))
    # The batch already read from the WAL is delivered, then object storage takes over.
    assert rest[-1].tier is Tier.OBJECT


async def test_local_ack_mode_acknowledges_from_the_wal_and_uploads_in_the_background(
    tmp_path: Path,
    object_store: FsspecObjectStore,
    metadata: MemoryStore,
    clock: FakeClock,
    config: StorageConfig,
) -> None:
    """`ack: local` answers before the object store has the record (it is down here); the
    upload follows. A fenced owner's locally acknowledged records are never committed: one
    writer still holds, and that loss is what the mode gives up (documented)."""
    flaky = FlakyObjectStore(object_store, fail_puts=10**6)
    config = replace(config, ack=AckMode.LOCAL, ack_timeout_seconds=0.2)
    a = make_topic("a", tmp_path, objects=flaky, metadata=metadata, clock=clock, config=config)
    async with a:
        await append_range(a, 0, 3)  # acknowledged with the object store down
        assert a.uploaded_offset == -1
        flaky.fail_puts = 0
        await advancing(clock, eventually(lambda: a.uploaded_offset == 2), step=1)
        flaky.fail_puts = 10**6
        assert await a.append(payload(3)) == 3  # acknowledged locally, not yet committed
        b = make_topic("b", tmp_path, objects=object_store, metadata=metadata, clock=clock,
                       config=replace(config, ack=AckMode.DURABLE))  # fmt: skip
        async with b:  # takes the topic over without a seal (a stalled owner)
            flaky.fail_puts = 0
            with pytest.raises(TopicFencedError):
                await advancing(clock, a.upload_now(), step=1)
            records = await collect(b.read(0, live=False))
            assert [r.record.payload for r in records] == [payload(o) for o in range(3)]


async def test_a_brokers_object_writes_are_bounded_across_its_topics(
    tmp_path: Path, kw: dict[str, Any]
) -> None:
    """Topics sharing one `WritePacer` write at most its rate together: their sends wait
    their turn and go into fuller objects, and every one is still committed."""
    stats = StorageStats()
    stream = CommitStream(
        kw["objects"],
        kw["metadata"],
        broker_id="a",
        clock=kw["clock"],
        config=kw["config"],
        stats=stats,
        pacer=WritePacer(per_second=20),
    )
    names = [f"/default/paced-{i}" for i in range(4)]
    topics = [
        make_topic("a", tmp_path, **kw, topic=name, stats=stats, stream=stream) for name in names
    ]
    for topic in topics:
        await topic.open()
    began = asyncio.get_running_loop().time()
    offsets = await asyncio.gather(
        *(topic.append(payload(i)) for topic in topics for i in range(10))
    )
    elapsed = asyncio.get_running_loop().time() - began
    assert sorted(offsets) == sorted(list(range(10)) * 4)
    # 40 sends on 4 topics: one object per turn, turns 50 ms apart (plus the first),
    # each object carrying several topics' parts.
    assert stats.stream_objects <= elapsed * 20 + 1
    assert stats.stream_objects < 40 and stats.object_write_waits > 0
    assert stats.stream_parts > stats.stream_objects
    for topic in topics:
        items = await collect(topic.read(0, live=False))
        assert [i.offset for i in items] == list(range(10))
        await topic.close()
    await stream.close()


async def test_the_write_pacer_spaces_turns_and_refuses_a_bad_rate() -> None:
    pacer = WritePacer(per_second=50)
    began = asyncio.get_running_loop().time()
    waited = [await pacer.turn() for _ in range(6)]
    assert waited == [False] + [True] * 5
    assert asyncio.get_running_loop().time() - began >= 5 * 0.02 - 0.005
    with pytest.raises(ValueError, match="object writes per second"):
        WritePacer(per_second=0)


async def test_a_state_that_is_not_a_state_is_not_trusted_and_the_claim_replaces_it(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    """JSON that is no state: opened from the other evidence (the objects), claimed over it."""
    async with make_topic("broker-a", tmp_path, **kw) as a:
        await append_range(a, 0, 5)
        assert await a.upload_now() == 4
        await a.seal()
    key = keys.storage_state("/default/reliable_topic")
    await metadata.put(key, {"sealed": "perhaps"})
    async with make_topic("broker-b", tmp_path, **kw) as b:
        assert (b.opened.next_offset, b.opened.source) == (5, StartSource.CATALOG)
        assert b.opened.previous_state is None
        state = await metadata.get(key)
        assert state is not None and state.value["broker_id"] == "broker-b"


async def test_a_state_that_is_not_json_stops_the_open_and_names_its_key(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    """Not JSON at all: refused as a read of the key refuses it (an operator fixes it)."""
    key = keys.storage_state("/default/reliable_topic")
    await metadata.put_raw(key, b"{not json")
    topic = make_topic("broker-b", tmp_path, **kw)
    with pytest.raises(ValueDecodeError, match="/state"):
        await topic.open()
    assert topic.status is not TopicStatus.OPEN
    assert (await metadata.get_prefix(keys.storage_topic_prefix(topic.topic))).undecodable
