"""Property: any interleaving of appends, uploads, seals, reopens and reads from any offset
returns every acknowledged message exactly once, in offset order."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ballast.clock import FakeClock
from ballast.metadata import MemoryStore
from ballast.storage import (
    FsspecObjectStore,
    Message,
    ReliableTopic,
    StartSource,
    StorageConfig,
    Tier,
)

CONFIG = StorageConfig(
    segment_bytes=256,
    cache_messages=4,
    index_interval_bytes=64,
    read_batch_bytes=128,
    max_object_bytes=300,
    retention_seconds=10,
    upload_threshold_bytes=1 << 30,  # uploads happen only when the scenario says so
    upload_retry_initial_seconds=0.001,
    upload_retry_max_seconds=0.001,
)
BROKERS = ("b0", "b1", "b2")

Op = tuple[str, int]
ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 6)),
        st.tuples(st.just("upload"), st.just(0)),
        st.tuples(st.just("seal_move"), st.integers(0, len(BROKERS) - 1)),
        st.tuples(st.just("crash_restart"), st.just(0)),
        st.tuples(st.just("upload_crash_move"), st.integers(0, len(BROKERS) - 1)),
        st.tuples(st.just("retention"), st.just(0)),
        st.tuples(st.just("read"), st.integers(0, 60)),
    ),
    max_size=14,
)


def body(offset: int) -> bytes:
    return f"m{offset}".encode()


async def scenario(ops: list[Op], root: Path) -> None:
    clock = FakeClock()
    objects = FsspecObjectStore(str(root / "objects"))
    acked: list[int] = []  # offsets acknowledged so far, in order

    async with MemoryStore(clock) as metadata:

        async def open_on(broker: str) -> ReliableTopic:
            topic = ReliableTopic(
                "/prop/t",
                broker_id=broker,
                data_dir=root / broker,
                objects=objects,
                metadata=metadata,
                clock=clock,
                config=CONFIG,
            )
            await topic.open()
            # Never an offset already used: the next offset follows every acknowledged one.
            assert topic.next_offset == len(acked), (topic.opened, len(acked))
            return topic

        async def check_read(topic: ReliableTopic, start: int) -> None:
            items = [item async for item in topic.read(start, live=False)]
            assert [i.offset for i in items] == acked[start:]
            assert all(i.record.payload == body(i.offset) for i in items)
            # Tiers only move forward: objects, then the WAL.
            ranks = [0 if i.tier is Tier.OBJECT else 1 for i in items]
            assert ranks == sorted(ranks)

        topic = await open_on(BROKERS[0])
        try:
            for op, arg in ops:
                if op == "append":
                    first = len(acked)
                    got = await topic.append_batch([Message(body(first + i)) for i in range(arg)])
                    assert list(got) == list(range(first, first + arg))
                    acked.extend(got)
                elif op == "upload":
                    assert await topic.upload_now() == len(acked) - 1
                elif op == "seal_move":
                    state = await topic.seal()
                    assert state.last_committed_offset == len(acked) - 1
                    topic = await open_on(BROKERS[arg])
                    assert topic.opened.source is StartSource.SEALED
                elif op == "crash_restart":
                    await topic.close()  # acknowledged appends are on disk; no seal
                    topic = await open_on(topic.broker_id)
                elif op == "upload_crash_move":
                    await topic.upload_now()
                    await topic.close()
                    topic = await open_on(BROKERS[arg])
                elif op == "retention":
                    await clock.advance(CONFIG.retention_seconds + 1)
                    await topic.upload_now()  # applies retention after uploading
                elif op == "read":
                    await check_read(topic, min(arg, len(acked)))
            await check_read(topic, 0)
        finally:
            if topic.status.value == "open":
                await topic.close()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(ops=ops_strategy)
def test_every_acknowledged_message_is_read_back_exactly_once(ops: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(scenario(ops, Path(root)))
