"""Benchmark of the reliable-topic storage engine; prints one JSON document.

- append throughput (msgs/s, MB/s) for 100 B and 1 KiB payloads, fsync per batch and per
  interval, from 64 concurrent single-message producers and from batch appends;
- tiered read throughput from object storage (local directory) and from the WAL files;
- seal time of a topic holding 100 MB that is not yet uploaded.

Usage: python benchmarks/bench_storage.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ballast.clock import SystemClock
from ballast.metadata import MemoryStore
from ballast.storage import (
    FsspecObjectStore,
    FsyncPolicy,
    Message,
    ReliableTopic,
    StorageConfig,
    Tier,
)

MB = 1_000_000
BASE = StorageConfig(
    upload_interval_seconds=3600,  # uploads only when a benchmark asks for them
    upload_threshold_bytes=1 << 40,
    cache_messages=1024,
    fsync_interval_seconds=0.05,
)


def topic_on(root: Path, metadata: MemoryStore, config: StorageConfig, name: str) -> ReliableTopic:
    return ReliableTopic(
        f"/bench/{name}",
        broker_id="bench",
        data_dir=root / "wal",
        objects=FsspecObjectStore(str(root / "objects")),
        metadata=metadata,
        clock=SystemClock(),
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
    # Small segments, so that retention can drop all but the active one after the upload.
    config = replace(BASE, fsync_policy=FsyncPolicy.NEVER, retention_seconds=0, segment_bytes=MB)
    results: dict[str, Any] = {}
    async with MemoryStore() as metadata:
        topic = topic_on(root, metadata, config, "reads")
        async with topic:
            count = await fill(topic, total_bytes, size)
            # WAL tier: the cache holds only the newest 1024 records, the rest is files.
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
            # Object tier: upload, let retention drop every closed segment, read again.
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


async def bench_seal(root: Path, total_bytes: int) -> dict[str, Any]:
    config = replace(BASE, fsync_policy=FsyncPolicy.INTERVAL)
    async with MemoryStore() as metadata:
        topic = topic_on(root, metadata, config, "seal")
        async with topic:
            count = await fill(topic, total_bytes, 1024)
            start = time.perf_counter()
            state = await topic.seal()
            elapsed = time.perf_counter() - start
    return {
        "unuploaded_mb": round(count * 1024 / MB, 1),
        "messages": count,
        "last_committed_offset": state.last_committed_offset,
        "objects": topic.stats.objects_uploaded,
        "seconds": round(elapsed, 2),
        "mb_per_s": round(count * 1024 / elapsed / MB, 1),
    }


async def main(quick: bool) -> dict[str, Any]:
    seconds = 0.5 if quick else 2.0
    with tempfile.TemporaryDirectory(prefix="ballast-bench-") as tmp:
        root = Path(tmp)
        appends = []
        for size in (100, 1024):
            for policy in (FsyncPolicy.BATCH, FsyncPolicy.INTERVAL):
                for mode in ("concurrent", "batch"):
                    appends.append(await bench_append(root, size, policy, mode, seconds))
        reads = await bench_reads(root, (10 if quick else 50) * MB)
        seal = await bench_seal(root, (10 if quick else 100) * MB)
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
    parser.add_argument("--quick", action="store_true", help="smaller sizes, shorter runs")
    args = parser.parse_args()
    started = time.perf_counter()
    report = asyncio.run(main(args.quick))
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=2))
