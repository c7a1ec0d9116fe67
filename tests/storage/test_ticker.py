"""The broker's ticker: periodic storage work without a timer per topic; an idle topic is
never woken."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ballast.clock import FakeClock
from ballast.metadata import keys
from ballast.storage import (
    CommitStream,
    InitialPosition,
    StorageConfig,
    StorageStats,
)
from ballast.storage.retention import RetentionPolicies
from ballast.storage.ticker import Ticker

from .helpers import eventually, make_topic, payload


async def test_the_ticker_wakes_what_asked_once_at_its_next_tick(clock: FakeClock) -> None:
    ticker = Ticker(clock)
    asked, idle = asyncio.Event(), asyncio.Event()
    ticker.start(5.0)
    await asyncio.sleep(0)  # the timer is asleep on the clock
    ticker.soon(5.0, asked)
    assert ticker.pending == 1
    await clock.advance(5.0)
    await eventually(asked.is_set)
    assert not idle.is_set() and ticker.pending == 0
    asked.clear()
    await clock.advance(5.0)
    await asyncio.sleep(0.01)
    assert not asked.is_set()  # once per request, not a period of its own
    ticker.soon(5.0, asked)
    ticker.forget(asked)
    await clock.advance(5.0)
    await asyncio.sleep(0.01)
    assert not asked.is_set()
    await ticker.close()


async def test_idle_topics_ask_the_broker_for_nothing_and_acks_are_written_at_the_tick(
    tmp_path: Path, kw: dict[str, Any], clock: FakeClock, config: StorageConfig
) -> None:
    stats = StorageStats()
    ticker = Ticker(clock)
    stream = CommitStream(
        kw["objects"], kw["metadata"], broker_id="a", clock=clock, config=config, stats=stats
    )
    policies = RetentionPolicies(kw["metadata"], clock, config.upload_interval_seconds)
    shared = {"stats": stats, "stream": stream, "ticker": ticker, "policies": policies}
    topics = [
        make_topic("a", tmp_path, **kw, **shared, topic=f"/default/idle-{i}") for i in range(20)
    ]
    for topic in topics:
        await topic.open()
    for topic in topics:
        assert await topic.append(payload(0)) == 0
    # Every topic committed its one object: nothing periodic is left to do.
    await eventually(lambda: ticker.pending == 0)
    timers = [t for t in asyncio.all_tasks() if t.get_name().endswith("/timer")]
    assert timers == []  # no timer of a topic's own
    subscription = await topics[0].subscribe("s", initial=InitialPosition.EARLIEST)
    await subscription.ack(0)
    assert ticker.pending == 1  # the cursor asks for the next tick
    flushed = stats.cursor_flushes
    await clock.advance(config.cursor_flush_seconds)
    await eventually(lambda: stats.cursor_flushes > flushed)
    stored = await kw["metadata"].get(keys.subscription_cursor("/default/idle-0", "s"))
    assert stored is not None and stored.value["last_acked_offset"] == 0
    assert ticker.pending == 0
    for topic in topics:
        await topic.close()
    await stream.close()
    await ticker.close()
