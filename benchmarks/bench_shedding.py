"""Shedding-decision benchmark: Pulsar's three shedders on 1 000 brokers × 100 000 bundles.

- core: the shedder alone (`threshold_shedder`, `overload_shedder`, `uniform_shedder`) on
  column inputs (NumPy), i.e. the decision Pulsar's leader takes every shedding interval;
- from_snapshot: the same cluster as a `ClusterSnapshot` (100 000 topics, one per unit)
  through `decide_rebalance` with `policy: threshold`: building the units from load reports,
  the grace period, the shedder, and a target per shed unit (placement + estimate).

Load is skewed (log-normal per bundle; a tenth of the brokers run hot) so that brokers do
shed. Prints one JSON document.

    .venv/bin/python benchmarks/bench_shedding.py [--brokers 1000] [--bundles 100000] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ballast.balance import MoveHistory, decide_rebalance
from ballast.balance.pulsar.shedders import (
    SheddingInput,
    overload_shedder,
    threshold_shedder,
    uniform_shedder,
)
from ballast.config import PulsarConfig, RebalancingConfig, RebalancingPolicy, Strategy
from ballast.model import ClusterSnapshot, LoadReport, TopicLoad

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cli import emit, parse_args

MB = 1024 * 1024


def cluster(brokers: int, bundles: int, seed: int) -> tuple[SheddingInput, ClusterSnapshot]:
    rng = np.random.default_rng(seed)
    ids = tuple(f"broker-{i:04d}" for i in range(brokers))
    owner = rng.integers(0, brokers, bundles)
    hot = rng.random(brokers) < 0.1
    boost = np.where(hot[owner], 3.0, 1.0)
    thr = rng.lognormal(np.log(0.2 * MB), 0.8, bundles) * boost
    rate = thr / 1000.0
    b_thr = np.bincount(owner, thr, brokers)
    b_rate = np.bincount(owner, rate, brokers)
    cpu = np.clip(5 + 90 * b_thr / b_thr.max(), 0, 100)
    res = np.zeros((brokers, 5))
    res[:, 0] = cpu
    res[:, 1] = 30.0
    names = tuple(f"/ns{i % 50:02d}/t{i:06d}" for i in range(bundles))
    inp = SheddingInput(ids, res, b_rate, b_thr, names, owner.astype(np.int64), rate, thr)
    per: list[list[TopicLoad]] = [[] for _ in range(brokers)]
    for j in range(bundles):
        per[owner[j]].append(TopicLoad(names[j], msg_rate=float(rate[j]), byte_rate=float(thr[j])))
    reports = {
        b: LoadReport(b, 0.0, float(cpu[i]), 30.0, topics=tuple(per[i])) for i, b in enumerate(ids)
    }
    assignments = {b: tuple(t.topic for t in per[i]) for i, b in enumerate(ids)}
    return inp, ClusterSnapshot(ids, reports, {}, assignments)


def timed(fn: Callable[[], Any], repeat: int) -> tuple[dict[str, float], Any]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return {
        "median_ms": 1000 * statistics.median(times),
        "min_ms": 1000 * min(times),
        "max_ms": 1000 * max(times),
    }, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--brokers", type=int, default=1000)
    ap.add_argument("--bundles", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    args = parse_args(ap, quick={"brokers": 50, "bundles": 5_000, "repeat": 2})
    t0 = time.perf_counter()
    inp, snap = cluster(args.brokers, args.bundles, args.seed)
    build_s = time.perf_counter() - t0
    cfg = PulsarConfig()
    uniform_cfg = PulsarConfig(max_unload_bundle_num_per_shedding=-1)
    results: dict[str, Any] = {}
    for name, fn in (
        ("threshold", lambda: threshold_shedder(inp, cfg)),
        ("overload", lambda: overload_shedder(inp, cfg)),
        ("uniform", lambda: uniform_shedder(inp, uniform_cfg)),
    ):
        stats, out = timed(fn, args.repeat)
        stats["units_unloaded"] = len(out.unloads)
        stats["brokers_shedding"] = len({u.broker for u in out.unloads})
        results[name] = stats
    # No rate limit (Pulsar has none; Ballast's max_moves_per_hour applies to shedders):
    # every shed unit gets its target, as in the figures docs/benchmarks.md reports.
    rules = RebalancingConfig(
        enabled=True, policy=RebalancingPolicy.THRESHOLD, max_moves_per_hour=10**9
    )
    stats, decision = timed(
        lambda: decide_rebalance(snap, MoveHistory(), 1.0, rules, Strategy.FAIR, pulsar=cfg),
        max(1, args.repeat // 2),
    )
    stats["moves"] = len(decision.moves)
    emit(
        {
            "benchmark": "shedding decision",
            "brokers": args.brokers,
            "bundles": args.bundles,
            "input_build_seconds": round(build_s, 3),
            "core": results,
            "from_snapshot_threshold": stats,
        }
    )


if __name__ == "__main__":
    main()
