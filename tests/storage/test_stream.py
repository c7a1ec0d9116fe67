"""The broker's commit stream: topics share object writes and metadata transactions, a
fenced topic fails alone, a new owner reads its part of a shared object by range."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest

from ballast.clock import FakeClock
from ballast.metadata import MemoryStore, keys
from ballast.metadata.etcd import EtcdStore
from ballast.metadata.store import MetadataStore, Put
from ballast.model import TopicName
from ballast.storage import (
    CommitStream,
    FsspecObjectStore,
    ObjectDescriptor,
    ReliableTopic,
    SealedState,
    StartSource,
    StorageConfig,
    StorageStats,
    Tier,
    TopicFencedError,
    load_catalog,
)
from ballast.storage.objects import ObjectNotFoundError
from ballast.storage.reservation import TopicClaim, claim_together, commit_together
from ballast.storage.uploader import Uploader
from tests.etcd_fixtures import EtcdServer, etcd_server

from .helpers import collect, eventually, make_topic, payload

__all__ = ["etcd_server"]


def stream_for(broker: str, kw: dict[str, Any], stats: StorageStats) -> CommitStream:
    return CommitStream(
        kw["objects"],
        kw["metadata"],
        broker_id=broker,
        clock=kw["clock"],
        config=kw["config"],
        stats=stats,
    )


async def claimed(store: MetadataStore, topic: str, broker: str, clock: FakeClock) -> TopicClaim:
    claim = TopicClaim(TopicName.parse(topic), store, broker_id=broker, clock=clock)
    current = await store.get(claim.key)
    state = SealedState(False, -1, broker, clock.now(), reserved_through=1000)
    await claim.claim(current.mod_revision if current else 0, state)
    return claim


async def test_topics_sent_to_together_share_objects_and_transactions_and_move_intact(
    tmp_path: Path, kw: dict[str, Any]
) -> None:
    stats = StorageStats()
    stream = stream_for("a", kw, stats)
    names = [f"/default/together-{i}" for i in range(8)]
    topics = [make_topic("a", tmp_path, **kw, topic=n, stats=stats, stream=stream) for n in names]
    for topic in topics:
        await topic.open()
    await asyncio.gather(*(t.append(payload(i)) for i in range(5) for t in topics))
    # 40 sends on 8 topics: objects and transactions carry several topics each.
    assert stats.stream_parts > stats.stream_objects
    assert stats.descriptor_commits < stats.stream_parts
    for topic in topics:
        await topic.close()  # not sealed: nothing but the catalog tells the next owner
    await stream.close()
    catalog = await load_catalog(kw["metadata"], TopicName.parse(names[3]), StorageStats())
    assert any(d.shared for d in catalog.objects)
    # Another broker (its own empty data directory) reads every topic from the shared
    # objects, each its own part by range, and continues its offsets.
    for name in names:
        async with make_topic("b", tmp_path, **kw, topic=name) as other:
            assert other.opened.source is StartSource.CATALOG
            items = await collect(other.read(0, live=False))
            assert [(i.offset, i.record.payload, i.tier) for i in items] == [
                (o, payload(o), Tier.OBJECT) for o in range(5)
            ]
            assert await other.append(b"more") == 5


async def three_small_objects_each(
    tmp_path: Path, kw: dict[str, Any], names: list[str]
) -> tuple[StorageStats, CommitStream, list[ReliableTopic]]:
    """Topics on one stream, opened, with three small objects each (one per send)."""
    stats = StorageStats()
    stream = stream_for("a", kw, stats)
    topics = [make_topic("a", tmp_path, **kw, topic=n, stats=stats, stream=stream) for n in names]
    for topic in topics:
        await topic.open()
    for offset in range(3):
        await asyncio.gather(*(t.append(payload(offset)) for t in topics))
    return stats, stream, topics


async def test_merges_of_many_topics_share_objects_and_transactions(
    tmp_path: Path, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small objects are merged through the stream too: topics merging at once write one
    object and commit in one transaction, not one each."""
    kw = {**kw, "config": dataclasses.replace(kw["config"], merge_objects=4)}
    names = [f"/default/merged-{i}" for i in range(8)]
    stats, stream, topics = await three_small_objects_each(tmp_path, kw, names)
    # Every object written and every transaction, from here on.
    calls = {"put": 0, "txn": 0}
    for name, owner in (("put", kw["objects"]), ("txn", kw["metadata"])):
        method = getattr(owner, name)

        async def counted(*args: Any, _name: str = name, _method: Any = method) -> Any:
            calls[_name] += 1
            return await _method(*args)

        monkeypatch.setattr(owner, name, counted)
    await asyncio.gather(*(t.append(payload(3)) for t in topics))  # the fourth: all merge
    await eventually(lambda: stats.objects_merged == 4 * len(topics))
    # The fourth sends and the eight merges: far fewer writes and transactions than topics.
    assert calls["put"] < len(topics)
    assert calls["txn"] < len(topics)
    for topic in topics:
        await topic.close()
    await stream.close()
    for name in names:
        catalog = await load_catalog(kw["metadata"], TopicName.parse(name), StorageStats())
        assert [(d.start, d.end) for d in catalog.objects] == [(0, 3)]
        async with make_topic("b", tmp_path, **kw, topic=name) as other:
            items = await collect(other.read(0, live=False))
            assert [(i.offset, i.record.payload) for i in items] == [
                (o, payload(o)) for o in range(4)
            ]


async def test_one_topic_reads_for_a_merge_at_a_time_and_none_holds_its_sends_back(
    tmp_path: Path, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Merging reads objects: topics due together take turns (32 topics moved together,
    each merging what it brought at once, held every send on the broker for 0.65 s). A
    topic waiting for its turn keeps writing its sends, and is woken for its turn."""
    kw = {**kw, "config": dataclasses.replace(kw["config"], merge_objects=4)}
    names = [f"/default/turns-{i}" for i in range(6)]
    stats, stream, topics = await three_small_objects_each(tmp_path, kw, names)
    reading: set[TopicName] = set()
    most = 0
    gate = asyncio.Event()
    records = Uploader._records

    async def counted(self: Uploader, group: list[ObjectDescriptor]) -> list[Any]:
        nonlocal most
        reading.add(self.topic)
        most = max(most, len(reading))
        try:
            await gate.wait()
            return await records(self, group)
        finally:
            reading.discard(self.topic)

    monkeypatch.setattr(Uploader, "_records", counted)
    await asyncio.gather(*(t.append(payload(3)) for t in topics))  # the fourth: all due
    await eventually(lambda: len(reading) == 1)
    # One topic holds the turn (its own sends wait for its merge, as they always did);
    # the others' sends are written and committed meanwhile.
    others = [t for t, n in zip(topics, names, strict=True) if TopicName.parse(n) not in reading]
    assert len(others) == len(topics) - 1
    sent = asyncio.gather(*(t.append(payload(4)) for t in others))
    assert await asyncio.wait_for(sent, 5) == [4] * len(others)
    gate.set()
    assert {await t.append(payload(4)) for t in topics if t not in others} == {4}
    await eventually(lambda: stats.objects_merged >= 4 * len(topics))
    assert most == 1
    for topic in topics:
        await topic.close()
    await stream.close()
    for name in names:
        async with make_topic("b", tmp_path, **kw, topic=name) as other:
            items = await collect(other.read(0, live=False))
            assert [(i.offset, i.record.payload) for i in items] == [
                (o, payload(o)) for o in range(5)
            ]


async def test_a_fenced_topic_fails_alone_inside_a_shared_commit(
    tmp_path: Path, kw: dict[str, Any]
) -> None:
    stats = StorageStats()
    stream = stream_for("a", kw, stats)
    mine, taken = "/default/stays", "/default/taken"
    async with (
        make_topic("a", tmp_path, **kw, topic=mine, stats=stats, stream=stream) as stays,
        make_topic("a", tmp_path, **kw, topic=taken, stats=stats, stream=stream) as lost,
    ):
        await asyncio.gather(stays.append(payload(0)), lost.append(payload(0)))
        # Another broker claims one of them (a move that did not wait for a seal).
        async with make_topic("b", tmp_path, **kw, topic=taken):
            kept, fenced = await asyncio.gather(
                stays.append(payload(1)), lost.append(payload(1)), return_exceptions=True
            )
            assert kept == 1
            assert isinstance(fenced, TopicFencedError)
            assert await stays.append(payload(2)) == 2
    await stream.close()


async def test_commit_together_fences_per_topic_in_one_transaction(
    metadata: MemoryStore, clock: FakeClock
) -> None:
    claims = [await claimed(metadata, f"/default/c{i}", "a", clock) for i in range(3)]
    # Broker b takes /default/c1 over.
    await claimed(metadata, "/default/c1", "b", clock)
    stats = StorageStats()
    results = await commit_together(
        metadata, [(c, [Put(f"/test/marks/{i}", i)]) for i, c in enumerate(claims)], stats
    )
    assert [type(r) for r in results] == [type(None), TopicFencedError, type(None)]
    assert (await metadata.get("/test/marks/0")) is not None
    assert (await metadata.get("/test/marks/1")) is None
    assert (await metadata.get("/test/marks/2")) is not None
    # One shared transaction (refused), then each topic alone.
    assert stats.descriptor_commits == 1 + 3
    # The claims that committed are at their new revision: their next commit holds.
    again = await commit_together(metadata, [(claims[0], []), (claims[2], [])], stats)
    assert again == [None, None] and stats.descriptor_commits == 5


async def test_commit_together_splits_under_etcds_limits(
    etcd_server: EtcdServer, clock: FakeClock
) -> None:
    run = uuid.uuid4().hex[:8]
    async with EtcdStore(etcd_server.client_url) as store:
        claims = [await claimed(store, f"/split{run}/t{i}", "a", clock) for i in range(150)]
        stats = StorageStats()
        results = await commit_together(
            store,
            [(c, [Put(f"/test/split{run}/{i}", i)]) for i, c in enumerate(claims)],
            stats,
        )
        assert results == [None] * 150
        assert 3 <= stats.descriptor_commits <= 4  # 2 ops a topic, at most 120 a transaction
        listing = await store.get_prefix(f"/test/split{run}/")
        assert len(listing.items) == 150
        states = await store.get_prefix(f"/storage/topics/split{run}/")
        assert len(states.items) == 150


async def test_a_topics_several_commits_go_in_one_transaction_unless_their_keys_meet(
    etcd_server: EtcdServer, clock: FakeClock
) -> None:
    """A topic's send and merge committed at once share its state's write (etcd refuses a
    key written twice in one transaction: such commits go one after the other, in order)."""
    run = uuid.uuid4().hex[:8]
    async with EtcdStore(etcd_server.client_url) as store:
        one, two = [await claimed(store, f"/twice{run}/t{i}", "a", clock) for i in range(2)]
        stats = StorageStats()
        results = await commit_together(
            store,
            [
                (one, [Put(f"/test/twice{run}/a", 1)]),
                (two, [Put(f"/test/twice{run}/b", 1)]),
                (one, [Put(f"/test/twice{run}/c", 1)]),
            ],
            stats,
        )
        assert results == [None, None, None] and stats.descriptor_commits == 1
        assert len((await store.get_prefix(f"/test/twice{run}/")).items) == 3

        results = await commit_together(
            store,
            [
                (one, [Put(f"/test/twice{run}/a", 2)]),
                (one, [Put(f"/test/twice{run}/a", 3)]),  # the same key: after the first
                (one, [Put(f"/test/twice{run}/d", 3)]),  # and so is what follows it
            ],
            stats,
        )
        assert results == [None, None, None] and stats.descriptor_commits == 1 + 3
        assert (await store.get(f"/test/twice{run}/a")).value == 3  # type: ignore[union-attr]


async def test_a_shared_object_goes_once_every_part_is_released(
    object_store: FsspecObjectStore, metadata: MemoryStore, clock: FakeClock
) -> None:
    stream = CommitStream(object_store, metadata, broker_id="a", clock=clock)
    one, two = TopicName.parse("/default/p1"), TopicName.parse("/default/p2")
    first, second = await asyncio.gather(
        stream.write(one, 0, 0, b"part-one"), stream.write(two, 0, 0, b"part-two")
    )
    if first.object_id != second.object_id:  # the first write went alone: share the next
        first, second = await asyncio.gather(
            stream.write(one, 1, 1, b"part-one"), stream.write(two, 1, 1, b"part-two")
        )
    assert first.object_id == second.object_id and first.shared and second.shared
    assert (first.base, second.base) == (0, len(b"part-one"))
    whole = await object_store.get(first.object_id)
    assert whole.startswith(b"part-onepart-two")  # then the manifest of its parts
    await stream.release(one, first)
    assert await object_store.get(first.object_id) == whole  # the other part still counts
    await stream.release(two, second)
    with pytest.raises(ObjectNotFoundError):
        await object_store.get(first.object_id)
    await stream.close()


@pytest.mark.parametrize(("linger", "shared"), [(0.5, True), (0.0, False)])
async def test_while_topics_send_together_the_next_object_waits_for_the_others(
    object_store: FsspecObjectStore,
    metadata: MemoryStore,
    clock: FakeClock,
    linger: float,
    shared: bool,
) -> None:
    # No pacing: a wait for the pacer's turn would stand in for the linger.
    config = StorageConfig(stream_linger_seconds=linger, max_object_writes_per_second=1e9)
    stream = CommitStream(object_store, metadata, broker_id="a", clock=clock, config=config)
    one, two = TopicName.parse("/default/l1"), TopicName.parse("/default/l2")
    offset = 0
    while True:  # until an object held both topics' parts: they send together
        first, second = await asyncio.gather(
            stream.write(one, offset, offset, b"1"), stream.write(two, offset, offset, b"2")
        )
        offset += 1
        if first.object_id == second.object_id:
            break
    waiting = asyncio.create_task(stream.write(one, offset, offset, b"1"))
    await asyncio.sleep(0.05)  # well inside the linger, if there is one
    later = await stream.write(two, offset, offset, b"2")
    assert ((await waiting).object_id == later.object_id) is shared
    await stream.close()


def test_a_descriptor_of_a_part_round_trips_and_a_whole_object_has_no_base() -> None:
    part = ObjectDescriptor(3, 9, "_streams/a/x.bobj", 120, 1.5, base=4096)
    assert ObjectDescriptor.from_dict(part.to_dict()) == part and part.shared
    whole = ObjectDescriptor(3, 9, "default/t/x.bobj", 120, 1.5)
    assert "base" not in whole.to_dict() and not whole.shared
    assert keys.storage_object("/default/t", 3).endswith("/objects/00000000000000000003")


async def test_a_sweep_deletes_old_shared_objects_no_topic_refers_to(
    object_store: FsspecObjectStore, metadata: MemoryStore, clock: FakeClock
) -> None:
    """After a restart (a new stream: it knows nothing of what it wrote) the sweep finds
    its shared objects by listing, reads their manifests and deletes those no topic's
    catalog names once they are older than the grace; referenced or young ones stay."""
    before = CommitStream(object_store, metadata, broker_id="a", clock=clock)
    one, two = TopicName.parse("/default/s1"), TopicName.parse("/default/s2")
    written = []
    for start in range(3):
        written += await asyncio.gather(
            before.write(one, start, start, b"part-one"), before.write(two, start, start, b"2")
        )
    await before.close()
    shared = sorted({d.object_id for d in written if d.shared})
    assert len(shared) >= 2
    kept = next(d for d in written if d.shared and d.object_id == shared[0])
    # One topic committed its part of the first shared object; nobody the others'.
    await metadata.put(
        keys.storage_object(one if kept.base == 0 else two, kept.start), kept.to_dict()
    )
    listed = {o.name: o for o in await object_store.list("_streams/a/")}
    assert set(shared) <= set(listed)
    after = CommitStream(object_store, metadata, broker_id="a", clock=clock)
    newest = max(o.modified for o in listed.values())
    assert await after.sweep(now=newest + 1) == 0  # younger than the grace: all stay
    grace = StorageConfig().shared_object_grace_seconds
    assert await after.sweep(now=newest + grace + 1) == len(shared) - 1
    assert [o.name for o in await object_store.list("_streams/a/")] == [shared[0]]
    assert await object_store.list("_streams/nobody/") == []
    await after.close()


async def test_claim_together_splits_under_etcds_limits_and_a_fenced_topic_fails_alone(
    etcd_server: EtcdServer, clock: FakeClock
) -> None:
    """Topics opened together (a failover opens thousands) claim in few transactions; one
    whose state changed meanwhile (another broker is taking it) fails alone."""
    run = uuid.uuid4().hex[:8]
    async with EtcdStore(etcd_server.client_url) as store:
        names = [TopicName.parse(f"/claims{run}/t{i}") for i in range(130)]
        await store.put(keys.storage_state(names[70]), {"taken": "meanwhile"})
        calls = 0
        txn = store.txn

        async def counted(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            return await txn(*args)

        store.txn = counted  # type: ignore[method-assign,assignment]
        claims = [TopicClaim(n, store, broker_id="a", clock=clock) for n in names]
        state = SealedState(False, -1, "a", clock.now(), reserved_through=1000)
        results = await claim_together(store, [(c, 0, state) for c in claims])
        assert [i for i, r in enumerate(results) if r is not None] == [70]
        assert isinstance(results[70], TopicFencedError)
        # Two transactions of 60 and one of 10, then the 60 of the fenced one alone.
        assert calls == 3 + 60
        states = await store.get_prefix(f"/storage/topics/claims{run}/")
        assert len(states.items) == 130
        # The claims that held are at their revision: their next commit holds.
        assert await commit_together(store, [(claims[0], []), (claims[129], [])]) == [None, None]


async def test_topics_opened_together_claim_together(
    tmp_path: Path, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = StorageStats()
    stream = stream_for("a", kw, stats)
    calls = 0
    txn = kw["metadata"].txn
    first_sent = asyncio.Event()
    in_first: list[int] = []

    async def counted(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            in_first.append(len(args[1]))  # a put per claim
            # The first claim's transaction takes its time: the other openings, which
            # recover their WALs in threads and so come at their own pace, queue meanwhile.
            await first_sent.wait()
        return await txn(*args)

    monkeypatch.setattr(kw["metadata"], "txn", counted)
    topics = [
        make_topic("a", tmp_path, **kw, topic=f"/default/opened-{i}", stats=stats, stream=stream)
        for i in range(20)
    ]
    opening = asyncio.gather(*(t.open() for t in topics))
    await eventually(lambda: bool(in_first) and in_first[0] + len(stream._claims) == 20)
    first_sent.set()
    await opening
    assert calls <= 3  # the first claim alone, then the others together (not 20)
    assert calls == 2
    assert await asyncio.gather(*(t.append(payload(0)) for t in topics)) == [0] * 20
    for topic in topics:
        await topic.close()
    await stream.close()


async def test_a_claim_given_up_before_it_is_sent_is_not_written(
    kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An opening abandoned while its claim waits for the stream (its topic was unloaded
    meanwhile) leaves the topic's state as it was."""
    metadata: MemoryStore = kw["metadata"]
    stream = stream_for("a", kw, StorageStats())
    gate = asyncio.Event()
    txn = metadata.txn

    async def held(*args: Any) -> Any:
        await gate.wait()
        return await txn(*args)

    monkeypatch.setattr(metadata, "txn", held)
    clock = kw["clock"]
    state = SealedState(False, -1, "a", clock.now(), reserved_through=1000)
    first, second = (
        TopicClaim(TopicName.parse(f"/default/given-up-{i}"), metadata, broker_id="a", clock=clock)
        for i in range(2)
    )
    sent = asyncio.ensure_future(stream.claim(first, 0, state))
    await asyncio.sleep(0.01)  # the first claim's transaction is on its way
    given_up = asyncio.ensure_future(stream.claim(second, 0, state))
    await asyncio.sleep(0.01)
    given_up.cancel()
    gate.set()
    await sent
    await asyncio.sleep(0.01)  # the claimer's next round, had the second stayed queued
    assert await metadata.get(first.key) is not None
    assert await metadata.get(second.key) is None
    await stream.close()
