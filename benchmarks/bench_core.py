"""Rankings plus one rebalance decision for 1 000 brokers and 1 000 000 topics.

Target: under 1 second. Building the snapshot (decoding reports) is not timed: the leader
does that once per report as reports arrive, not per decision. Prints JSON.

    .venv/bin/python benchmarks/bench_core.py [--brokers 1000] [--topics 1000000] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from ballast.balance import MoveHistory, decide_rebalance, rank
from ballast.config import Strategy, parse_config
from ballast.model import ClusterSnapshot, LoadReport, TopicLoad

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cli import emit, parse_args


def build(brokers: int, topics: int, seed: int) -> ClusterSnapshot:
    rng = np.random.default_rng(seed)
    ids = tuple(f"broker-{i:04d}" for i in range(brokers))
    # Uneven brokers (topic counts 0.2x..1.8x the mean, CPU 5..95 %) so a move is needed.
    weights = 0.2 + 1.6 * (np.arange(brokers) % 10) / 9
    counts = np.floor(topics * weights / weights.sum()).astype(int)
    counts[0] += topics - counts.sum()
    rates = rng.lognormal(10, 1.0, topics)
    reports, assignments = {}, {}
    start = 0
    for i, b in enumerate(ids):
        n = int(counts[i])
        names = tuple(f"/ns{i % 50}/t-{i}-{j}" for j in range(n))
        loads = tuple(
            TopicLoad(name, msg_rate=r / 100, byte_rate=r, producers=1, consumers=1)
            for name, r in zip(names, rates[start : start + n], strict=True)
        )
        start += n
        cpu = 5 + 10 * (i % 10)
        reports[b] = LoadReport(b, 0.0, cpu, cpu * 0.8, topics=loads)
        assignments[b] = names
    return ClusterSnapshot(ids, reports, {}, assignments, {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--brokers", type=int, default=1000)
    ap.add_argument("--topics", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = parse_args(ap, quick={"brokers": 50, "topics": 20_000, "repeat": 1})
    t0 = time.perf_counter()
    snap = build(args.brokers, args.topics, 1)
    build_s = time.perf_counter() - t0
    cfg = parse_config(
        {"load_manager": {"rebalancing": {"enabled": True, "min_topic_age_seconds": 0}}}
    ).load_manager.rebalancing
    results = {}
    for strategy in Strategy:
        best = float("inf")
        for _ in range(args.repeat):
            t = time.perf_counter()
            rank(snap, strategy)
            d = decide_rebalance(snap, MoveHistory(), 10_000.0, cfg, strategy)
            best = min(best, time.perf_counter() - t)
        results[strategy.value] = {"seconds": round(best, 4), "decision": d.rule}
    emit(
        {
            "benchmark": "core_rankings_plus_decision",
            "brokers": args.brokers,
            "topics": args.topics,
            "snapshot_build_seconds": round(build_s, 2),
            "seconds": max(r["seconds"] for r in results.values()),
            "by_strategy": results,
            "target_seconds": 1.0,
        }
    )


if __name__ == "__main__":
    main()
