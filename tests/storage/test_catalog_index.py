"""A topic's descriptor keys stay few however long it runs: older descriptors move into an
index object (`Uploader._compact`), written before the fenced transaction that names it
and removes their keys. Checked on the MemoryStore for a day's worth of uploads, and on a
real etcd where one compaction must be split (128 operations per transaction)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from ballast.clock import FakeClock
from ballast.metadata import MemoryStore, keys
from ballast.metadata.etcd import EtcdStore
from ballast.metadata.store import Listing, MetadataStore
from ballast.storage import (
    FsspecObjectStore,
    StorageConfig,
    StorageStats,
    load_catalog,
    stored_size,
)
from tests.etcd_fixtures import EtcdServer, etcd_server

from .helpers import collect, make_topic, payload

__all__ = ["etcd_server"]

pytestmark = pytest.mark.timeout(120)


async def descriptor_keys(store: MetadataStore, topic: str) -> int:
    return len((await store.get_prefix(keys.storage_objects_prefix(topic))).items)


async def run_uploads(
    tmp_path: Path,
    store: MetadataStore,
    objects: FsspecObjectStore,
    config: StorageConfig,
    count: int,
    *,
    stats: StorageStats,
    broker: str = "a",
    start: int = 0,
) -> int:
    """Append `count` messages one by one (each is its own commit; two make a merge);
    returns the most descriptor keys the topic had at any point."""
    most = 0
    async with make_topic(
        broker, tmp_path, objects=objects, metadata=store, clock=FakeClock(), config=config,
        stats=stats,
    ) as topic:  # fmt: skip
        for offset in range(start, start + count):
            assert await topic.append(payload(offset)) == offset
            if offset % 50 == 0:
                most = max(most, await descriptor_keys(store, topic.topic))
    return most


async def test_a_days_uploads_keep_the_keys_bounded_and_every_record_readable(
    tmp_path: Path, object_store: FsspecObjectStore, config: StorageConfig
) -> None:
    # One merged object per two sends: 2 880 merged objects, a day of 30 s merges.
    config = replace(config, merge_objects=2, catalog_keys=16, max_object_bytes=1 << 20)
    stats = StorageStats()
    async with MemoryStore(FakeClock()) as store:
        began = time.monotonic()
        most = await run_uploads(tmp_path, store, object_store, config, 5760, stats=stats)
        assert stats.objects_merged >= 5000
        assert most <= 16 + 2, most  # never more than the budget (and what just arrived)
        assert stats.descriptors_indexed > 2700
        topic = "/default/reliable_topic"
        assert await descriptor_keys(store, topic) <= 16
        # A new owner (another broker, another disk) reads all of it through the index.
        b = make_topic("b", tmp_path, objects=object_store, metadata=store, clock=FakeClock(),
                       config=config)  # fmt: skip
        async with b:
            items = await collect(b.read(0, live=False))
            assert [i.offset for i in items] == list(range(5760))
            assert [i.record.payload for i in items[:3]] == [payload(o) for o in range(3)]
            # What `admin topics describe` and the metrics report agree with the catalog.
            catalog = await load_catalog(store, b.topic, objects=object_store)
            assert catalog.index is not None and catalog.indexed == catalog.index.count
            assert catalog.end == 5759 and catalog.size > 0
            size = await stored_size(store, b.topic)
            assert (size.objects, size.bytes) == (len(catalog.objects), catalog.size)
            assert (size.first_offset, size.last_offset) == (0, 5759)
            assert size.descriptor_keys == len(catalog.keyed) <= 16
            assert b.stored == (size.objects, size.bytes)
        assert time.monotonic() - began < 60


async def test_an_old_catalog_is_compacted_in_transactions_etcd_accepts(
    tmp_path: Path, object_store: FsspecObjectStore, config: StorageConfig,
    etcd_server: EtcdServer,
) -> None:  # fmt: skip
    """300 descriptor keys left by an owner with a large budget: the next owner moves them
    into the index in chunks that fit etcd's limits, and serves every record."""
    # Objects of a few records count as full (a new owner does not merge them again).
    config = replace(config, merge_objects=2, max_object_bytes=400)
    topic = "/default/reliable_topic"
    async with EtcdStore(etcd_server.client_url) as store:
        await store.delete_prefix(keys.storage_topic_prefix(topic))
        stats = StorageStats()
        loose = replace(config, catalog_keys=10_000)
        await run_uploads(tmp_path, store, object_store, loose, 600, stats=stats)
        # Two records per object, or one where a busy machine cut an upload short: far
        # more keys than one etcd transaction may delete (128 operations) either way.
        assert 300 <= await descriptor_keys(store, topic) <= 600
        tight = replace(config, catalog_keys=64)
        await run_uploads(tmp_path, store, object_store, tight, 2, stats=stats, broker="b",
                          start=600)  # fmt: skip
        assert await descriptor_keys(store, topic) <= 64
        catalog = await load_catalog(store, topic, objects=object_store)
        assert catalog.index is not None and catalog.indexed >= 250
        async with make_topic("c", tmp_path, objects=object_store, metadata=store,
                              clock=FakeClock(), config=tight) as c:  # fmt: skip
            items = await collect(c.read(0, live=False))
            assert [i.offset for i in items] == list(range(602))
        await store.delete_prefix(keys.storage_topic_prefix(topic))


async def test_a_new_owner_never_merges_what_the_index_holds(
    tmp_path: Path, object_store: FsspecObjectStore, config: StorageConfig
) -> None:
    """The next owner merges the small objects its predecessor left as keys, never those
    in the index object: merging an index entry again wrote a key that the index shadowed,
    and the small objects it replaced were deleted (found by the fault suite)."""
    config = replace(config, merge_objects=2, catalog_keys=8, max_object_bytes=1 << 20)
    stats = StorageStats()
    async with MemoryStore(FakeClock()) as store:
        await run_uploads(tmp_path, store, object_store, config, 40, stats=stats)
        catalog = await load_catalog(store, "/default/reliable_topic", objects=object_store)
        assert catalog.indexed > 0  # small objects (by size) in the index
        await run_uploads(tmp_path, store, object_store, replace(config, merge_grace_seconds=1e-6),
                          10, stats=stats, broker="b", start=40)  # fmt: skip
        async with make_topic("c", tmp_path, objects=object_store, metadata=store,
                              clock=FakeClock(), config=config) as c:  # fmt: skip
            items = await collect(c.read(0, live=False))
            assert [i.offset for i in items] == list(range(50))


class ListingCounter(MemoryStore):
    """Counts listings of one prefix (each is a round trip to etcd in production)."""

    def __init__(self, prefix: str) -> None:
        super().__init__(FakeClock())
        self.prefix = prefix
        self.listings = 0

    async def get_prefix(self, prefix: str) -> Listing:
        if prefix == self.prefix:
            self.listings += 1
        return await super().get_prefix(prefix)


async def test_keys_waiting_to_be_merged_do_not_make_the_catalog_listed_again(
    tmp_path: Path, object_store: FsspecObjectStore, config: StorageConfig
) -> None:
    """More small objects wait for their merge (`merge_objects`) than `catalog_keys`: a
    compaction could move none of them, so none runs (it listed the catalog after every
    commit while they waited: a metadata round trip per send)."""
    config = replace(config, merge_objects=100, catalog_keys=64, max_object_bytes=1 << 20)
    topic = "/default/reliable_topic"
    async with ListingCounter(keys.storage_topic_prefix(topic)) as store:
        await run_uploads(tmp_path, store, object_store, config, 99, stats=StorageStats())
        assert await descriptor_keys(store, topic) == 99  # all waiting for the merge
        assert store.listings <= 2  # the open's (and the close's)
