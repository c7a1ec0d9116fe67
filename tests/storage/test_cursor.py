"""Subscription cursors: flushed every N acks or every T seconds, and on close."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from dataclasses import replace

import pytest

from ballast.clock import FakeClock
from ballast.metadata import MemoryStore, keys
from ballast.metadata.etcd import EtcdStore
from ballast.metadata.store import Put
from ballast.model import TopicName
from ballast.storage import (
    AckRanges,
    CursorPosition,
    StorageConfig,
    StorageStats,
    SubscriptionCursors,
)
from ballast.storage.cursor import _size_bound
from tests.etcd_fixtures import EtcdServer, etcd_server

from .helpers import eventually

__all__ = ["etcd_server"]

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
    assert await fresh.load("s") == CursorPosition(7)
    assert await fresh.load("other") is None


async def test_bare_integer_and_malformed_values(
    metadata: MemoryStore, clock: FakeClock, config: StorageConfig
) -> None:
    await metadata.put(KEY, 13)  # as Danube writes it
    assert await cursors(metadata, clock, config).load("s") == CursorPosition(13)
    await metadata.put(KEY, {"last_acked_offset": "thirteen"})
    assert await cursors(metadata, clock, config).load("s") is None  # starts over
    # Bad ranges: the cursor holds, what was acked above it comes again (never skipped).
    for bad in ([[5, 3]], [[20]], "20-30", [[20, "30"]], [[True, 30]]):
        await metadata.put(KEY, {"last_acked_offset": 13, "acked_above": bad})
        assert await cursors(metadata, clock, config).load("s") == CursorPosition(13)
    # Ranges the cursor passed since are dropped; overlapping ones merge.
    await metadata.put(
        KEY, {"last_acked_offset": 13, "acked_above": [[10, 15], [17, 18], [18, 20]]}
    )
    assert await cursors(metadata, clock, config).load("s") == CursorPosition(
        13, ((14, 15), (17, 20))
    )


async def test_acks_above_the_cursor_are_written_as_ranges_and_loaded_again(
    metadata: MemoryStore, clock: FakeClock, config: StorageConfig
) -> None:
    async with cursors(metadata, clock, config) as book:
        book.ack("s", 0)
        for offset in (2, 3, 4, 6, 9, 8, 3):
            book.ack_above("s", offset)
        assert not book.ack_above("s", 0)  # at the cursor: nothing to add
        assert not book.ack_above("unknown", 5)  # no cursor here: ignored
    kv = await metadata.get(KEY)
    assert kv is not None
    assert kv.value["last_acked_offset"] == 0
    assert kv.value["acked_above"] == [[2, 4], [6, 6], [8, 9]]
    async with cursors(metadata, clock, config) as book:
        assert await book.load("s") == CursorPosition(0, ((2, 4), (6, 6), (8, 9)))
        book.ack("s", 6)  # the cursor passes two ranges: only [8, 9] stays
        book.ack_above("s", 11)
    kv = await metadata.get(KEY)
    assert kv is not None and kv.value["acked_above"] == [[8, 9], [11, 11]]


async def test_past_the_range_cap_the_lowest_ranges_are_kept_and_the_rest_counted(
    metadata: MemoryStore, clock: FakeClock, config: StorageConfig
) -> None:
    stats = StorageStats()
    cfg = replace(config, cursor_ack_ranges=3)
    async with SubscriptionCursors(TOPIC, metadata, clock=clock, config=cfg, stats=stats) as book:
        book.ack("s", -1)
        for offset in range(1, 20, 2):  # 10 single-offset ranges: 1, 3, ..., 19
            book.ack_above("s", offset)
    kv = await metadata.get(KEY)
    assert kv is not None
    assert kv.value["acked_above"] == [[1, 1], [3, 3], [5, 5]]
    assert kv.value["acked_above_dropped"] == 7  # 7..19: delivered again, never skipped
    assert stats.ack_ranges_dropped == 7


async def test_a_cap_sized_value_is_written_to_etcd_far_below_its_request_limit(
    clock: FakeClock, config: StorageConfig, etcd_server: EtcdServer
) -> None:
    """The worst case at the default cap: 4 096 ranges of 19-digit offsets, on real etcd
    (through a transaction, as the claim's fenced write does)."""
    async with EtcdStore(etcd_server.client_url) as store:

        async def fenced_like(key: str, value: object) -> None:
            assert (await store.txn([], [Put(key, value)])).succeeded

        book = SubscriptionCursors(TOPIC, store, clock=clock, config=config, writer=fenced_like)
        base = 10**18
        book.ack("s", base)
        for i in range(config.cursor_ack_ranges + 100):
            book.ack_above("s", base + 2 + 2 * i)
        assert await book.flush() == 1
        kv = await store.get(KEY)
        assert kv is not None and len(kv.value["acked_above"]) == config.cursor_ack_ranges
        assert len(json.dumps(kv.value)) < 256 * 1024
        # What the seal's transaction counts for it (without encoding) is never below.
        assert _size_bound(kv.value) >= len(json.dumps(kv.value))
        loaded = await SubscriptionCursors(TOPIC, store, clock=clock, config=config).load("s")
        assert loaded is not None and loaded.acked_above[0] == (base + 2, base + 2)
        await store.delete(KEY)


async def test_invalid_subscription_name_is_refused(
    metadata: MemoryStore, clock: FakeClock, config: StorageConfig
) -> None:
    book = cursors(metadata, clock, config)
    with pytest.raises(ValueError, match="subscription name"):
        book.ack("bad/name", 1)


def test_ack_ranges_match_a_plain_set() -> None:
    """Random adds and trims against a set of offsets: same members, ranges disjoint,
    sorted and not touching."""
    rng = random.Random(20)
    for _ in range(200):
        ranges, model, cursor = AckRanges(), set(), -1
        for _ in range(60):
            if rng.random() < 0.15:
                cursor += rng.randint(0, 8)
                ranges.trim(cursor)
                model = {o for o in model if o > cursor}
            else:
                offset = cursor + 1 + rng.randint(0, 40)
                assert ranges.add(offset) is (offset not in model)
                model.add(offset)
        pairs = ranges.ranges()
        assert {o for a, b in pairs for o in range(a, b + 1)} == model
        assert all(a <= b for a, b in pairs)
        assert all(b1 + 1 < a2 for (_, b1), (a2, _) in itertools.pairwise(pairs))
        assert ranges.count_from(1) == sum(b - a + 1 for a, b in pairs[1:])
