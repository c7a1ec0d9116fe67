"""Subscription cursors: flushed every N acks or every T seconds, and on close."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from ballast.clock import FakeClock
from ballast.metadata import MemoryStore, keys
from ballast.model import TopicName
from ballast.storage import StorageConfig, StorageStats, SubscriptionCursors

from .helpers import eventually

TOPIC = TopicName("default", "t")
KEY = keys.subscription_cursor(TOPIC, "s")


def cursors(
    metadata: MemoryStore, clock: FakeClock, config: StorageConfig, **overrides: object
) -> SubscriptionCursors:
    cfg = replace(config, cursor_flush_seconds=5.0, cursor_flush_acks=10, **overrides)
    return SubscriptionCursors(TOPIC, metadata, clock=clock, config=cfg, stats=StorageStats())


async def stored(metadata: MemoryStore) -> int | None:
    kv = await metadata.get(KEY)
    return None if kv is None else int(kv.value["last_acked_offset"])


async def test_flushes_after_n_acks_without_waiting_for_time(
    metadata: MemoryStore, clock: FakeClock, config: StorageConfig
) -> None:
    async with cursors(metadata, clock, config) as book:
        for offset in range(9):
            book.ack("s", offset)
        await asyncio.sleep(0.01)
        assert await stored(metadata) is None  # 9 acks: not yet
        book.ack("s", 9)
        await eventually(lambda: metadata.revision > 1)
        assert await stored(metadata) == 9


async def test_flushes_at_most_every_interval(
    metadata: MemoryStore, clock: FakeClock, config: StorageConfig
) -> None:
    async with cursors(metadata, clock, config) as book:
        book.ack("s", 3)
        await clock.advance(4.9)
        assert await stored(metadata) is None
        await clock.advance(0.2)
        assert await stored(metadata) == 3
        revision = metadata.revision
        await clock.advance(5)  # nothing moved: nothing written
        assert metadata.revision == revision


async def test_flushed_on_close_and_loaded_again(
    metadata: MemoryStore, clock: FakeClock, config: StorageConfig
) -> None:
    async with cursors(metadata, clock, config) as book:
        assert book.ack("s", 7)
        assert not book.ack("s", 5)  # cumulative: never moves back
        assert book.get("s") == 7
    assert await stored(metadata) == 7
    fresh = cursors(metadata, clock, config)
    assert await fresh.load("s") == 7
    assert await fresh.load("other") is None


async def test_bare_integer_and_malformed_values(
    metadata: MemoryStore, clock: FakeClock, config: StorageConfig
) -> None:
    await metadata.put(KEY, 13)  # as Danube writes it
    assert await cursors(metadata, clock, config).load("s") == 13
    await metadata.put(KEY, {"last_acked_offset": "thirteen"})
    assert await cursors(metadata, clock, config).load("s") is None  # starts over


async def test_invalid_subscription_name_is_refused(
    metadata: MemoryStore, clock: FakeClock, config: StorageConfig
) -> None:
    book = cursors(metadata, clock, config)
    with pytest.raises(ValueError, match="subscription name"):
        book.ack("bad/name", 1)
