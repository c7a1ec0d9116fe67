"""Kafka replica reassignment (KAFKA-19048) at scale: plan time, moves vs bounds.

Default: 1 M partitions at RF 3 (3 M replicas) over 1 000 brokers in 10 racks, already
rack-aware and balanced per topic; 50 brokers join (5 per rack). Topic
sizes repeat 1000, 500, 200, 100, 50, 24, 12, 6, 3, 1 partitions. Prints JSON: plan time
on the local engine and on Spark `local[2]`, replica moves, the lower bound, what a
`--generate`-style round robin would move, leader changes, balance after.

    python benchmarks/bench_replicas.py [--partitions N] [--brokers B] [--racks R]
                                        [--add A] [--no-spark] [--quick]

`--quick` (the test suite's run) plans 3 000 partitions on 30 brokers (3 racks, +3) on the
local engine only (`--no-spark`: the `spark_local2` and `spark_equals_local` fields are
left out). Spark even at that size took 40-60 s of wall time on the loaded 2-core test machine
(its own JVM, then the job), far more than a quick run may; the Spark planner is covered by
`tests/pipeline/test_replicas_spark.py` on the suite's shared session.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from ballast.balance.kafka.replicas import (
    KafkaBroker,
    ReplicaPlan,
    TopicReplicas,
    make_layout,
    plan_replicas,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cli import emit, parse_args

SIZES = (1000, 500, 200, 100, 50, 24, 12, 6, 3, 1)


def topic_sizes(partitions: int) -> list[int]:
    sizes: list[int] = []
    left = partitions
    i = 0
    while left > 0:
        n = min(SIZES[i % len(SIZES)], left)
        sizes.append(n)
        left -= n
        i += 1
    return sizes


def cluster(
    partitions: int, brokers: int, racks: int, add: int, rf: int
) -> tuple[list[KafkaBroker], list[int], list[TopicReplicas]]:
    """Brokers 0..B-1 in racks r0..; added brokers B..B+A-1 spread over the racks; topics
    balanced per topic and rack-aware, as a well-run cluster is before it grows."""
    rng = np.random.default_rng(7)
    existing = [KafkaBroker(i, f"r{i % racks}") for i in range(brokers)]
    added = [KafkaBroker(brokers + i, f"r{i % racks}") for i in range(add)]
    per_rack = [[b.id for b in existing if b.rack == f"r{k}"] for k in range(racks)]
    alternated = np.array([r[j] for j in range(len(per_rack[0])) for r in per_rack])
    n = len(alternated)
    topics = []
    for t, size in enumerate(topic_sizes(partitions)):
        start = int(rng.integers(n))
        # Replica slots laid end to end along the rack-alternated list: consecutive
        # brokers sit in different racks, and every broker holds its fair share ±1.
        slots = (start + np.arange(size * rf)) % n
        matrix = alternated[slots].reshape(size, rf).astype(np.int64)
        topics.append(TopicReplicas(f"topic-{t:05d}", np.arange(size, dtype=np.int64), matrix))
    return existing + added, [b.id for b in added], topics


def summary(plan: ReplicaPlan, seconds: float, cpu: float | None = None) -> dict[str, object]:
    after = [b.replicas_after for b in plan.brokers]
    leaders = [b.leaders_after for b in plan.brokers]
    leader_target = [b.leader_target for b in plan.brokers]
    return {
        "seconds": round(seconds, 2),
        # On a shared machine wall time says more about the neighbours than the planner.
        **({"cpu_seconds": round(cpu, 2)} if cpu is not None else {}),
        "replica_moves": plan.replica_moves,
        "lower_bound": plan.lower_bound,
        "cluster_lower_bound": plan.cluster_lower_bound,
        "round_robin_moves": plan.round_robin_moves,
        "leader_changes": plan.leader_changes,
        "partitions_changed": len(plan.changes),
        "replicas_per_broker_after": [min(after), max(after)],
        "leaders_per_broker_after": [min(leaders), max(leaders)],
        "leader_targets": [min(leader_target), max(leader_target)],
        "rack_violations_after": plan.rack_violations_after,
        "notes": len(plan.notes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=1_000_000)
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--racks", type=int, default=10)
    parser.add_argument("--add", type=int, default=50)
    parser.add_argument("--rf", type=int, default=3)
    parser.add_argument("--no-spark", action="store_true", help="only the local engine")
    args = parse_args(
        parser,
        quick={"partitions": 3000, "brokers": 30, "racks": 3, "add": 3, "no_spark": True},
    )
    brokers, added, topics = cluster(args.partitions, args.brokers, args.racks, args.add, args.rf)
    layout = make_layout(brokers, add=added, rack_aware=True, max_rf=args.rf)
    started, cpu = time.perf_counter(), time.process_time()
    plan = plan_replicas(topics, layout)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    result: dict[str, object] = {
        "benchmark": "kafka replica reassignment (KAFKA-19048)",
        "partitions": args.partitions,
        "replicas": plan.replicas,
        "topics": len(topics),
        "brokers": args.brokers,
        "racks": args.racks,
        "added": args.add,
        "local": summary(plan, seconds, cpu),
    }
    if not args.no_spark:
        from ballast.pipeline.replicas import plan_replicas_spark
        from ballast.pipeline.session import build_session

        spark = build_session("local[2]", app_name="bench-replicas", shuffle_partitions=8)
        try:
            started = time.perf_counter()
            on_spark = plan_replicas_spark(spark, topics, layout)
            result["spark_local2"] = summary(on_spark, time.perf_counter() - started)
            result["spark_equals_local"] = on_spark == plan
        finally:
            spark.stop()
    emit(result)


if __name__ == "__main__":
    main()
