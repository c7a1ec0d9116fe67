"""Metadata-store throughput and watch latency, for `MemoryStore` and `EtcdStore`.

Measures puts/s, gets/s and txn/s (compare-and-swap), sequentially and with 64 concurrent
tasks, and watch latency (put → event delivered, p50/p99). etcd is a throw-away single
member started by `tests/etcd_fixtures.EtcdServer` (``--unsafe-no-fsync``, so the figures
show client and server overhead, not disk). Prints one JSON document.

    .venv/bin/python benchmarks/bench_metadata.py [--scale 1.0] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ballast.metadata import EtcdStore, MemoryStore
from benchmarks.cli import emit, parse_args
from tests.etcd_fixtures import EtcdServer

CONCURRENCY = 64
Store = MemoryStore | EtcdStore


async def rate(op: Callable[[int], Awaitable[Any]], count: int, concurrency: int) -> float:
    """Operations per second running `count` calls of `op` over `concurrency` tasks."""

    async def worker(offset: int) -> None:
        for i in range(offset, count, concurrency):
            await op(i)

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return count / (time.perf_counter() - start)


async def throughput(store: Store, prefix: str, count: int) -> dict[str, float]:
    """puts/s, gets/s and txn/s, sequential and concurrent."""
    keys = [f"{prefix}k{i % 256:03d}" for i in range(count)]
    value = {"broker_url": "http://10.0.0.1:6650", "epoch": 3, "ready": True}

    async def put(i: int) -> None:
        await store.put(keys[i], value)

    async def get(i: int) -> None:
        await store.get(keys[i])

    async def cas(i: int) -> None:
        # Per-task counter keys: a CAS that loses to a concurrent writer would measure
        # contention instead of the store.
        key = f"{prefix}c{i % CONCURRENCY:02d}"
        kv = await store.get(key)
        await store.compare_and_swap(key, kv.mod_revision if kv else 0, i)

    result: dict[str, float] = {}
    for name, op in (("put", put), ("get", get), ("txn", cas)):
        result[f"{name}_per_s_sequential"] = round(await rate(op, count, 1), 1)
        result[f"{name}_per_s_concurrent_{CONCURRENCY}"] = round(
            await rate(op, count, CONCURRENCY), 1
        )
    # txn figures include the read that fetches the expected revision: that is what a
    # fenced update costs a caller.
    return result


async def watch_latency(store: Store, prefix: str, samples: int) -> dict[str, float]:
    """Put → event latency in milliseconds, one write in flight at a time."""
    latencies: list[float] = []
    async with store.watch_prefix(prefix) as watch:
        await watch.ready()
        for i in range(samples):
            start = time.perf_counter()
            await store.put(f"{prefix}w", i)
            event = await asyncio.wait_for(anext(watch), 5)
            latencies.append((time.perf_counter() - start) * 1000)
            assert event.value == i
    latencies.sort()
    return {
        "watch_latency_ms_p50": round(statistics.median(latencies), 3),
        "watch_latency_ms_p99": round(latencies[int(len(latencies) * 0.99) - 1], 3),
        "watch_samples": samples,
    }


async def bench(store: Store, count: int, samples: int) -> dict[str, Any]:
    async with store:
        out: dict[str, Any] = {"ops_per_measurement": count}
        out.update(await throughput(store, "/bench/ops/", count))
        out.update(await watch_latency(store, "/bench/watch/", samples))
        await store.delete_prefix("/bench/")
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="share of the operations")
    args = parse_args(parser, quick={"scale": 0.1})
    scale = args.scale

    started = time.perf_counter()
    results: dict[str, Any] = {
        "python": platform.python_version(),
        "concurrency": CONCURRENCY,
    }
    results["memory"] = asyncio.run(bench(MemoryStore(), int(20_000 * scale), int(2_000 * scale)))
    with EtcdServer() as server:
        results["etcd"] = asyncio.run(
            bench(EtcdStore(server.client_url), int(2_000 * scale), int(500 * scale))
        )
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    emit(results)


if __name__ == "__main__":
    main()
