"""Benchmark of the reliable-topic storage engine; prints one JSON document.

- append throughput (msgs/s, MB/s) for 100 B and 1 KiB payloads, fsync per batch and per
  interval, from 64 concurrent single-message producers and from batch appends;
- tiered read throughput from object storage (local directory) and from the WAL files;
- seal time of a topic holding 100 MB, with durable acks (every commit is already in
  object storage) and with local acks (the seal uploads what the background upload has
  not reached yet: `unuploaded_mb`).

Usage: python benchmarks/bench_storage.py [--seconds 2] [--read-mb 50] [--seal-mb 100] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ballast.clock import SystemClock
from ballast.metadata import MemoryStore
from ballast.storage import (
    AckMode,
    FsspecObjectStore,
    FsyncPolicy,
    Message,
    ReliableTopic,
    StorageConfig,
    Tier,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cli import emit, parse_args

MB = 1_000_000
BASE = StorageConfig(
    # Every commit is uploaded at once all the same (a send is acknowledged from object
    # storage): these only keep timed merges and the claim-less mover out of the way.
    upload_interval_seconds=3600,
    upload_threshold_bytes=1 << 40,
    cache_messages=1024,
    fsync_interval_seconds=0.05,
)


class SkippingClock(SystemClock):
    """Real time that the benchmark can move forward at once (to pass a retention period)."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def now(self) -> float:
        return super().now() + self.skipped


def topic_on(
    root: Path,
    metadata: MemoryStore,
    config: StorageConfig,
    name: str,
    clock: SystemClock | None = None,
) -> ReliableTopic:
    return ReliableTopic(
        f"/bench/{name}",
        broker_id="bench",
        data_dir=root / "wal",
        objects=FsspecObjectStore(str(root / "objects")),
        metadata=metadata,
        clock=clock or SystemClock(),
        config=config,
    )


async def bench_append(
    root: Path, size: int, policy: FsyncPolicy, mode: str, seconds: float
) -> dict[str, Any]:
    config = replace(BASE, fsync_policy=policy)
    data = b"x" * size
    async with MemoryStore() as metadata:
        topic = topic_on(root, metadata, config, f"append-{size}-{policy.value}-{mode}")
        async with topic:
            count = 0
            stop = time.perf_counter() + seconds
            start = time.perf_counter()

            async def producer() -> None:
                nonlocal count
                while time.perf_counter() < stop:
                    await topic.append(data)
                    count += 1

            async def batcher() -> None:
                nonlocal count
                batch = [Message(data)] * 100
                while time.perf_counter() < stop:
                    await topic.append_batch(batch)
                    count += len(batch)

            if mode == "concurrent":
                await asyncio.gather(*(producer() for _ in range(64)))
            else:
                await asyncio.gather(*(batcher() for _ in range(4)))
            elapsed = time.perf_counter() - start
            batches = topic.stats.wal_batches
    return {
        "payload_bytes": size,
        "fsync": policy.value,
        "mode": "64 producers, single appends" if mode == "concurrent" else "4 x append_batch(100)",
        "msgs_per_s": round(count / elapsed),
        "mb_per_s": round(count * size / elapsed / MB, 2),
        "msgs_per_commit": round(count / max(batches, 1), 1),
    }


async def fill(topic: ReliableTopic, total_bytes: int, size: int) -> int:
    batch = [Message(b"y" * size)] * 500
    count = 0
    while count * size < total_bytes:
        await topic.append_batch(batch)
        count += len(batch)
    return count


async def bench_reads(root: Path, total_bytes: int) -> dict[str, Any]:
    size = 1024
    # Every WAL commit is uploaded at once (a send is acknowledged from object storage), so
    # the WAL keeps its closed segments only for `retention_seconds` after their upload.
    # Small segments, so that retention can drop all but the active one once it has passed.
    retention = 600.0
    config = replace(
        BASE, fsync_policy=FsyncPolicy.NEVER, retention_seconds=retention, segment_bytes=MB
    )
    clock = SkippingClock()
    results: dict[str, Any] = {}
    async with MemoryStore() as metadata:
        topic = topic_on(root, metadata, config, "reads", clock)
        async with topic:
            count = await fill(topic, total_bytes, size)
            # WAL tier: within the retention period every record is still in the WAL; the
            # cache holds only the newest 1024, the rest is read from the segment files.
            start = time.perf_counter()
            n = 0
            async for item in topic.read(0, live=False):
                assert item.tier is Tier.WAL
                n += 1
            elapsed = time.perf_counter() - start
            assert n == count
            results["wal"] = {
                "messages": n,
                "mb_per_s": round(n * size / elapsed / MB, 1),
                "msgs_per_s": round(n / elapsed),
            }
            # Object tier: pass the retention period (the clock, not a wait), upload (which
            # applies the WAL's retention: every closed segment goes), read again.
            clock.skipped += retention + 1
            await topic.upload_now()
            start = time.perf_counter()
            n = objects = 0
            async for item in topic.read(0, live=False):
                n += 1
                objects += item.tier is Tier.OBJECT
            elapsed = time.perf_counter() - start
            assert n == count  # how many came from objects is reported, not asserted
            results["object_storage"] = {
                "messages": n,
                "from_objects": objects,
                "mb_per_s": round(n * size / elapsed / MB, 1),
                "msgs_per_s": round(n / elapsed),
            }
    return results


async def bench_seal(root: Path, total_bytes: int, ack: AckMode) -> dict[str, Any]:
    # Every WAL commit is uploaded at once: with durable acks (the default) nothing
    # acknowledged waits for the seal; with local acks the upload follows in the background
    # and the seal uploads what it has not reached yet (measured, not chosen).
    config = replace(BASE, fsync_policy=FsyncPolicy.INTERVAL, ack=ack)
    async with MemoryStore() as metadata:
        topic = topic_on(root, metadata, config, f"seal-{ack.value}")
        async with topic:
            count = await fill(topic, total_bytes, 1024)
            waiting = count - 1 - topic.uploaded_offset
            start = time.perf_counter()
            state = await topic.seal()
            elapsed = time.perf_counter() - start
    return {
        "ack": ack.value,
        "mb": round(count * 1024 / MB, 1),
        "unuploaded_mb": round(waiting * 1024 / MB, 1),
        "messages": count,
        "last_committed_offset": state.last_committed_offset,
        "objects": topic.stats.objects_uploaded,
        "seconds": round(elapsed, 3),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ballast-bench-") as tmp:
        root = Path(tmp)
        appends = []
        for size in (100, 1024):
            for policy in (FsyncPolicy.BATCH, FsyncPolicy.INTERVAL):
                for mode in ("concurrent", "batch"):
                    appends.append(await bench_append(root, size, policy, mode, args.seconds))
        reads = await bench_reads(root, args.read_mb * MB)
        seal = {
            ack.value: await bench_seal(root, args.seal_mb * MB, ack)
            for ack in (AckMode.DURABLE, AckMode.LOCAL)
        }
    return {
        "benchmark": "storage",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "append": appends,
        "tiered_read": reads,
        "seal": seal,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per append measurement")
    parser.add_argument("--read-mb", type=int, default=50, help="MB written, then read back")
    parser.add_argument("--seal-mb", type=int, default=100, help="MB in the topic sealed")
    args = parse_args(parser, quick={"seconds": 0.3, "read_mb": 5, "seal_mb": 5})
    started = time.perf_counter()
    report = asyncio.run(main(args))
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    emit(report)
