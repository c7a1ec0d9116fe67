"""Property: any interleaving of appends, uploads, seals, reopens, crashes (with or without
the disk) and reads from any offset never assigns an offset twice, across owners, and
returns every acknowledged message that survived exactly once, in offset order, without
waiting for offsets that were skipped."""

from __future__ import annotations

import asyncio
import shutil
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
    offset_reservation_step=8,  # small: extensions (early and blocking) happen all the time
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
        st.tuples(st.just("hard_crash_restart"), st.just(0)),
        st.tuples(st.just("disk_loss_move"), st.integers(0, len(BROKERS) - 1)),
        st.tuples(st.just("retention"), st.just(0)),
        st.tuples(st.just("read"), st.integers(0, 120)),
    ),
    max_size=14,
)


def body(offset: int) -> bytes:
    return f"m{offset}".encode()


async def scenario(ops: list[Op], root: Path) -> None:
    clock = FakeClock()
    objects = FsspecObjectStore(str(root / "objects"))
    assigned: set[int] = set()  # every offset ever acknowledged, by any owner
    readable: list[int] = []  # acknowledged offsets still held somewhere, in order

    async with MemoryStore(clock) as metadata:

        async def open_on(broker: str, *, graceful: bool, after: int) -> ReliableTopic:
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
            # Never an offset already used: the next one follows every acknowledged one,
            # and every offset the previous owner may have assigned (its reservation).
            assert topic.next_offset > max(assigned, default=-1), topic.opened
            assert topic.next_offset > after, (topic.opened, after)
            if graceful:  # a seal or a close: continues right after, no gap
                assert topic.next_offset == after + 1, (topic.opened, after)
                assert topic.opened.gap is None
            return topic

        async def check_read(topic: ReliableTopic, start: int) -> None:
            async with asyncio.timeout(10):  # skipped offsets must not be waited for
                items = [item async for item in topic.read(start, live=False)]
            assert [i.offset for i in items] == [o for o in readable if o >= start]
            assert all(i.record.payload == body(i.offset) for i in items)
            # Tiers only move forward: objects, then the WAL.
            ranks = [0 if i.tier is Tier.OBJECT else 1 for i in items]
            assert ranks == sorted(ranks)

        topic = await open_on(BROKERS[0], graceful=False, after=-1)
        try:
            for op, arg in ops:
                if op == "append":
                    first = topic.next_offset
                    got = await topic.append_batch([Message(body(first + i)) for i in range(arg)])
                    assert list(got) == list(range(first, first + arg))
                    assert assigned.isdisjoint(got) and first > max(assigned, default=-1)
                    assigned.update(got)
                    readable.extend(got)
                elif op == "upload":
                    assert await topic.upload_now() == topic.next_offset - 1
                elif op == "seal_move":
                    state = await topic.seal()
                    assert state.last_committed_offset == topic.next_offset - 1
                    topic = await open_on(
                        BROKERS[arg], graceful=True, after=state.last_committed_offset
                    )
                    assert topic.opened.source is StartSource.SEALED
                elif op == "crash_restart":
                    await topic.close()  # acknowledged appends are on disk; no seal
                    topic = await open_on(
                        topic.broker_id, graceful=True, after=topic.next_offset - 1
                    )
                elif op == "upload_crash_move":
                    await topic.upload_now()
                    await topic.close()
                    topic = await open_on(BROKERS[arg], graceful=True, after=topic.next_offset - 1)
                elif op == "hard_crash_restart":
                    # A crash: no seal, no release; the disk survives, nothing is lost.
                    await topic.close(release_reservation=False)
                    topic = await open_on(
                        topic.broker_id, graceful=False, after=topic.reserved_through
                    )
                elif op == "disk_loss_move":
                    # The broker dies with its disk: what it had not uploaded is gone.
                    uploaded = topic.uploaded_offset
                    reserved = topic.reserved_through
                    await topic.close(release_reservation=False)
                    shutil.rmtree(topic.directory)
                    readable = [o for o in readable if o <= uploaded]
                    topic = await open_on(BROKERS[arg], graceful=False, after=reserved)
                elif op == "retention":
                    await clock.advance(CONFIG.retention_seconds + 1)
                    await topic.upload_now()  # applies retention after uploading
                elif op == "read":
                    await check_read(topic, min(arg, topic.next_offset))
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
def test_offsets_are_never_reused_and_surviving_messages_are_read_exactly_once(
    ops: list[Op],
) -> None:
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(scenario(ops, Path(root)))
