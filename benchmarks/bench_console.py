"""Console benchmark: API p99 and first paint at 1 000 brokers and 100 000 topics.

A `MemoryStore` is filled with what a cluster of that size keeps in the store —
registrations, states, one assignment and one metadata record per topic, a load report
per broker listing its topics, the leader's posted balance, and a rebalancing history —
and the console serves it for real (uvicorn on a local port, its `LiveCluster` following
the store's watch). While requests are measured a writer keeps publishing load reports
(`--reports-per-second`, as 1 000 brokers reporting every few seconds would), so frames
are recomputed under load, as in a live cluster.

Measured, each over `--requests` sequential requests:
- cluster view: ``GET /api/summary`` + ``GET /api/brokers?limit=100`` (one page load);
- topic page: ``GET /api/topics/{ns}/{topic}`` (owner, state, every broker's verdict);
- topic search: ``GET /api/topics?q=…&limit=100``;
- history page: ``GET /api/history?limit=100`` and with a broker filter;
and, in headless Chromium (Debian's), the first contentful paint of ``/`` and the time
until the broker table shows its first page. Prints one JSON document.

    .venv/bin/python benchmarks/bench_console.py [--brokers 1000] [--topics 100000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from ballast.clock import SystemClock
from ballast.cluster import AdminClient
from ballast.console import LiveCluster
from ballast.metadata import keys
from ballast.metadata.memory import MemoryStore
from ballast.metadata.records import Registration, TopicMeta
from ballast.model import LoadReport, Move, TopicLoad

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cli import emit, parse_args
from tests.console.helpers import serving
from tests.console.test_browser import CHROMIUM, launch_chromium


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def stats_ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
    }


def report(broker: str, topics: list[str], now: float, rng: random.Random) -> dict[str, Any]:
    loads = tuple(
        TopicLoad(t, msg_rate=rng.uniform(0, 100), byte_rate=rng.uniform(0, 1e5)) for t in topics
    )
    return LoadReport(
        broker, now, cpu_percent=rng.uniform(5, 80), memory_percent=rng.uniform(10, 70),
        topics=loads,
    ).to_dict()  # fmt: skip


async def fill(store: MemoryStore, brokers: int, topics: int, moves: int) -> dict[str, list[str]]:
    rng = random.Random(7)
    now = time.time()
    ids = [f"b{i:04d}" for i in range(brokers)]
    owned: dict[str, list[str]] = {b: [] for b in ids}
    for i in range(topics):
        owned[ids[i % brokers]].append(f"/ns{i % 50}/topic-{i:06d}")
    for b in ids:
        reg = Registration(broker_url=f"10.0.{int(b[1:]) // 250}.{int(b[1:]) % 250}:6650")
        await store.put(keys.register(b), reg.to_dict())
        await store.put(keys.broker_state(b), {"mode": "active", "reason": ""})
        for t in owned[b]:
            await store.put(keys.topic_meta(t), TopicMeta(now - 3600, {}).to_dict())
            await store.put(keys.broker_assignment(b, t), {"assigned_at": now - 3600, "epoch": 1})
        await store.put(keys.load(b), report(b, owned[b], now, rng))
    for seq in range(moves):
        ts = now - 3600 + seq * 3600 / moves
        src, dst = rng.sample(ids, 2)
        move = Move(owned[src][seq % len(owned[src])], src, dst, "LoadImbalance", 1.0, ts)
        # Keyed as `move_write` keys a move: by the assignment revision it released.
        await store.put(keys.rebalancing_history(ts, move.topic, seq + 1), move.to_dict())
    for k in range(60):
        cv = 0.3 * (1 - k / 60) + 0.05
        await store.put(
            keys.LOAD_BALANCE,
            {
                "timestamp": now - 3600 + k * 60,
                "leader": ids[0],
                "strategy": "fair",
                "balance": {"cv": cv, "mean": 100.0, "std": cv * 100, "min": 60.0, "max": 140.0},
                "decision": None,
            },
        )
    await store.put(keys.LEADER, {"broker_id": ids[0], "since": now - 7200})
    return owned


async def reporter(
    store: MemoryStore, owned: dict[str, list[str]], per_second: float, stop: asyncio.Event
) -> int:
    rng = random.Random(11)
    ids = sorted(owned)
    sent = 0
    while not stop.is_set():
        b = ids[sent % len(ids)]
        await store.put(keys.load(b), report(b, owned[b], time.time(), rng))
        sent += 1
        await asyncio.sleep(1.0 / per_second)
    return sent


async def timed(client: httpx.AsyncClient, paths: list[str]) -> float:
    start = time.perf_counter()
    for path in paths:
        resp = await client.get(path)
        resp.raise_for_status()
    return time.perf_counter() - start


async def first_paint(url: str, runs: int) -> dict[str, Any]:
    if not CHROMIUM.exists():
        return {"skipped": "no /usr/bin/chromium (make sysdeps)"}
    fcp: list[float] = []
    table: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ballast-bench-") as profile:
        playwright, context = await launch_chromium(profile)
        try:
            page = await context.new_page()
            for _ in range(runs):
                start = time.perf_counter()
                await page.goto(url + "/")
                await page.locator("#brokers tbody tr").first.wait_for(timeout=30_000)
                table.append(time.perf_counter() - start)
                paint = await page.evaluate(
                    "performance.getEntriesByName('first-contentful-paint')[0]?.startTime"
                )
                if paint is not None:
                    fcp.append(paint / 1000)
                await page.goto("about:blank")
        finally:
            await context.close()
            await playwright.stop()
    return {
        "first_contentful_paint": stats_ms(fcp) if fcp else None,
        "broker_table_shown": stats_ms(table),
        "runs": runs,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    clock = SystemClock()
    async with MemoryStore(clock) as store:
        t0 = time.perf_counter()
        owned = await fill(store, args.brokers, args.topics, args.moves)
        fill_s = time.perf_counter() - t0
        admin = AdminClient(store, clock)
        t1 = time.perf_counter()
        async with LiveCluster(store, clock, admin=admin) as fresh:
            await fresh.current_frame()  # list both prefixes, build the view, first frame
            ready_s = time.perf_counter() - t1
        async with serving(admin, frame_seconds=0.5) as (url, live):
            await live.current_frame()
            gc.freeze()  # as `serve_console` does once the view is listed
            live.touch("brokers", "topics", "history", "balance")
            t2 = time.perf_counter()
            await live.compute()
            frame_s = time.perf_counter() - t2
            stop = asyncio.Event()
            writer = asyncio.ensure_future(reporter(store, owned, args.reports_per_second, stop))
            rng = random.Random(3)
            all_topics = [t for ts in owned.values() for t in ts]
            ids = sorted(owned)
            results: dict[str, list[float]] = {
                "cluster_view": [],
                "topic_page": [],
                "topic_search": [],
                "history_page": [],
                "history_filtered": [],
            }
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                for i in range(args.requests):
                    page = rng.randrange(args.brokers // 100 or 1)
                    results["cluster_view"].append(
                        await timed(
                            client, ["/api/summary", f"/api/brokers?offset={page * 100}&limit=100"]
                        )
                    )
                    topic = rng.choice(all_topics)
                    results["topic_page"].append(await timed(client, [f"/api/topics{topic}"]))
                    results["topic_search"].append(
                        await timed(client, [f"/api/topics?q=topic-0{i % 10}1&limit=100"])
                    )
                    results["history_page"].append(
                        await timed(client, [f"/api/history?offset={i * 100}&limit=100"])
                    )
                    results["history_filtered"].append(
                        await timed(client, [f"/api/history?broker={rng.choice(ids)}&limit=100"])
                    )
                paint = await first_paint(url, args.paint_runs)
            stop.set()
            reports = await writer
            frames = live.frame.version if live.frame is not None else 0
    return {
        "benchmark": "console",
        "brokers": args.brokers,
        "topics": args.topics,
        "moves": args.moves,
        "fill_seconds": round(fill_s, 1),
        "list_and_first_frame_seconds": round(ready_s, 3),
        "frame_compute_ms": round(frame_s * 1000, 1),
        "load_reports_written_during_run": reports,
        "frames_computed": frames,
        "api": {name: stats_ms(values) for name, values in results.items()},
        "requests_each": args.requests,
        "browser": paint,
        "goals": {"api_p99_ms": 200, "first_paint_ms": 1000},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--moves", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--reports-per-second", type=float, default=200.0)
    parser.add_argument("--paint-runs", type=int, default=5)
    args = parse_args(
        parser,
        quick={
            "brokers": 20, "topics": 500, "moves": 200, "requests": 10,
            "reports_per_second": 20.0, "paint_runs": 1,
        },
    )  # fmt: skip
    emit(asyncio.run(main(args)))
