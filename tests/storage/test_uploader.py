"""The uploader: objects then descriptors, retries, idempotence, checkpoint from the catalog."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ballast.clock import FakeClock
from ballast.metadata import MemoryStore, keys
from ballast.metadata.store import MetadataUnavailableError
from ballast.model import TopicName
from ballast.storage import (
    FsspecObjectStore,
    Message,
    ObjectDescriptor,
    StorageConfig,
    StorageStats,
    UploadConflictError,
    Uploader,
    WriteAheadLog,
    load_catalog,
    read_object,
)
from ballast.storage.log import BrokerLog

from .helpers import FlakyObjectStore, payload

TOPIC = TopicName("default", "t")


class FlakyMetadata:
    """Fails the next `failures` descriptor writes *after* applying them (a lost reply)."""

    def __init__(self, inner: MemoryStore, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    async def create_if_absent(self, key: str, value: Any, lease: int | None = None) -> bool:
        created = await self.inner.create_if_absent(key, value, lease)
        if self.failures > 0:
            self.failures -= 1
            raise MetadataUnavailableError(f"injected: reply for {key} lost")
        return created

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
async def wal(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> AsyncIterator[WriteAheadLog]:
    async with BrokerLog(tmp_path / "wal", clock=clock, config=config) as broker_log:
        log = WriteAheadLog(broker_log, str(TOPIC), clock=clock, config=config)
        await log.recover()
        await log.open(0)
        async with log:
            await log.append_batch([Message(payload(o)) for o in range(60)])
            yield log


async def offsets_in_objects(metadata: MemoryStore, store: FsspecObjectStore) -> list[int]:
    catalog = await load_catalog(metadata, TOPIC)
    out: list[int] = []
    for d in catalog.objects:
        records = [r async for r in read_object(store, d.object_id, d.size, d.start)]
        assert [r.offset for r in records] == list(range(d.start, d.end + 1))
        assert all(r.payload == payload(r.offset) for r in records)
        out += [r.offset for r in records]
    return out


def uploader(
    wal: WriteAheadLog,
    objects: Any,
    metadata: Any,
    clock: FakeClock,
    config: StorageConfig,
    checkpoint: int = -1,
    stats: StorageStats | None = None,
) -> Uploader:
    return Uploader(
        TOPIC,
        wal,
        objects,
        metadata,
        clock=clock,
        config=config,
        stats=stats,
        checkpoint=checkpoint,
    )


async def test_uploads_the_committed_range_in_bounded_objects(
    wal: WriteAheadLog,
    object_store: FsspecObjectStore,
    metadata: MemoryStore,
    clock: FakeClock,
    config: StorageConfig,
) -> None:
    stats = StorageStats()
    up = uploader(wal, object_store, metadata, clock, config, stats=stats)
    assert await up.drain() == 59
    catalog = await load_catalog(metadata, TOPIC)
    assert len(catalog.objects) == stats.objects_uploaded > 1
    assert all(d.size <= config.max_object_bytes + 200 for d in catalog.objects)
    assert await offsets_in_objects(metadata, object_store) == list(range(60))
    assert await up.drain() == 59  # nothing new: nothing written
    assert stats.objects_uploaded == len(catalog.objects)


async def test_checkpoint_comes_back_from_the_catalog(
    wal: WriteAheadLog,
    object_store: FsspecObjectStore,
    metadata: MemoryStore,
    clock: FakeClock,
    config: StorageConfig,
) -> None:
    await uploader(wal, object_store, metadata, clock, config).drain()
    await wal.append_batch([Message(payload(o)) for o in range(60, 70)])
    catalog = await load_catalog(metadata, TOPIC)
    restarted = uploader(wal, object_store, metadata, clock, config, checkpoint=catalog.end or -1)
    assert restarted.checkpoint == 59
    assert await restarted.drain() == 69
    assert await offsets_in_objects(metadata, object_store) == list(range(70))


async def test_object_store_failures_are_retried_with_backoff(
    wal: WriteAheadLog,
    object_store: FsspecObjectStore,
    metadata: MemoryStore,
    clock: FakeClock,
    config: StorageConfig,
) -> None:
    import asyncio

    flaky = FlakyObjectStore(object_store, fail_puts=3)
    stats = StorageStats()
    up = uploader(wal, flaky, metadata, clock, config, stats=stats)
    task = asyncio.ensure_future(up.drain())
    while not task.done():
        await clock.advance(0.01)  # the backoff sleeps on the fake clock
        await asyncio.sleep(0.001)
    assert task.result() == 59
    assert stats.upload_failures == 3
    assert await offsets_in_objects(metadata, object_store) == list(range(60))


async def test_lost_descriptor_reply_does_not_duplicate_the_range(
    wal: WriteAheadLog,
    object_store: FsspecObjectStore,
    metadata: MemoryStore,
    clock: FakeClock,
    config: StorageConfig,
) -> None:
    import asyncio

    flaky = FlakyMetadata(metadata, failures=2)
    up = uploader(wal, object_store, flaky, clock, config)
    task = asyncio.ensure_future(up.drain())
    while not task.done():
        await clock.advance(0.01)
        await asyncio.sleep(0.001)
    assert task.result() == 59
    assert await offsets_in_objects(metadata, object_store) == list(range(60))


async def test_existing_shorter_range_is_adopted_and_the_rest_uploaded(
    wal: WriteAheadLog,
    object_store: FsspecObjectStore,
    metadata: MemoryStore,
    clock: FakeClock,
    config: StorageConfig,
) -> None:
    # An earlier owner's attempt uploaded 0..4 (its reply lost, its checkpoint never moved).
    first = uploader(wal, object_store, metadata, clock, config)
    from ballast.storage.objects import ObjectBuilder

    builder = ObjectBuilder()
    for record in await wal.read(0, 5):
        builder.add(record)
    data = builder.finish()
    await object_store.put("default/t/early.bobj", data)
    descriptor = ObjectDescriptor(0, 4, "default/t/early.bobj", len(data), clock.now())
    await metadata.put(keys.storage_object(TOPIC, 0), descriptor.to_dict())
    assert await first.drain() == 59
    assert await offsets_in_objects(metadata, object_store) == list(range(60))


async def test_malformed_descriptor_in_the_way_surfaces(
    wal: WriteAheadLog,
    object_store: FsspecObjectStore,
    metadata: MemoryStore,
    clock: FakeClock,
    config: StorageConfig,
) -> None:
    await metadata.put(keys.storage_object(TOPIC, 0), {"start": "zero"})
    with pytest.raises(UploadConflictError, match="malformed"):
        await uploader(wal, object_store, metadata, clock, config).drain()


async def test_catalog_skips_bad_and_overlapping_descriptors(
    metadata: MemoryStore, clock: FakeClock
) -> None:
    stats = StorageStats()
    good = ObjectDescriptor(0, 9, "a", 10, 1.0)
    await metadata.put(keys.storage_object(TOPIC, 0), good.to_dict())
    await metadata.put(keys.storage_object(TOPIC, 5), ObjectDescriptor(5, 12, "b", 1, 1).to_dict())
    await metadata.put(keys.storage_object(TOPIC, 10), {"nonsense": True})
    await metadata.put_raw(keys.storage_object(TOPIC, 20), b"{not json")
    catalog = await load_catalog(metadata, TOPIC, stats)
    assert catalog.objects == (good,)
    assert stats.descriptors_skipped == 3
    assert catalog.find(3) == good and catalog.find(10) is None
