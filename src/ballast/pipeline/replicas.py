"""The Kafka replica planner as a Spark job: the same pure stages, topics in parallel.

1. Partitions are a DataFrame (topic, partition, r0…r{w-1}: broker indices, -1 padding);
   plain aggregations give each topic's `TopicCounts` (replicas and leaders per broker).
2. The driver collects the counts and fixes the cluster-wide targets (`plan_targets`):
   this is the only step that needs every topic at once, and it is small (topics × brokers).
3. Partitions and targets are co-grouped by topic and every topic is planned on the
   executors by `plan_topic`; only the changed partitions come back to the driver, where
   `assemble` adds everything up exactly as the local engine does.

Each function the executors run is the core's own, so the plan equals the local engine's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ballast.balance.kafka.replicas import (
    BrokerLayout,
    PartitionChange,
    ReplicaPlan,
    TopicCounts,
    TopicPlan,
    TopicReplicas,
    TopicTargets,
    assemble,
    balance_leaders,
    plan_targets,
    plan_topic,
    rack_violations,
)

TARGETS_SCHEMA = (
    "topic string, replicas array<long>, leaders array<long>, leader_floor array<long>, "
    "leader_ceiling array<long>"
)
CHANGES_SCHEMA = (
    "topic string, partition long, before array<long>, after array<long>, "
    "round_robin_moves long, rack_violations long, notes string"
)
SUMMARY_PARTITION = -1  # the row carrying a topic's round-robin figure and notes


def partitions_frame(
    spark: SparkSession, topics: Sequence[TopicReplicas], slices: int | None = None
) -> DataFrame:
    """All partitions as one DataFrame: topic, partition, r0…r{w-1} (-1 pads)."""
    width = max((t.replicas.shape[1] for t in topics), default=1)
    columns: dict[str, object] = {
        "topic": np.concatenate([np.full(len(t.partitions), t.topic, dtype=object) for t in topics])
        if topics
        else np.array([], dtype=object),
        "partition": np.concatenate([t.partitions for t in topics])
        if topics
        else np.array([], dtype=np.int64),
    }
    for j in range(width):
        columns[f"r{j}"] = (
            np.concatenate(
                [
                    t.replicas[:, j] if j < t.replicas.shape[1] else np.full(len(t.partitions), -1)
                    for t in topics
                ]
            ).astype(np.int64)
            if topics
            else np.array([], dtype=np.int64)
        )
    schema = "topic string, partition long, " + ", ".join(f"r{j} long" for j in range(width))
    frame = spark.createDataFrame(pd.DataFrame(columns), schema)
    return frame.repartition(slices, "topic") if slices else frame


def _topic_from_pandas(pdf: pd.DataFrame) -> TopicReplicas:
    pdf = pdf.sort_values("partition", kind="stable")
    cols = sorted((c for c in pdf.columns if c.startswith("r")), key=lambda c: int(c[1:]))
    matrix = pdf[cols].to_numpy(dtype=np.int64)
    # The local engine's width is the topic's own largest RF: trim the shared padding.
    width = int((matrix >= 0).sum(axis=1).max(initial=1))
    return TopicReplicas(
        str(pdf["topic"].iloc[0]), pdf["partition"].to_numpy(dtype=np.int64), matrix[:, :width]
    )


def collect_counts(partitions: DataFrame, layout: BrokerLayout) -> list[TopicCounts]:
    """Stage 1 as plain aggregations (no Python on the executors): per topic and broker,
    replicas held and partitions led, and per topic how many partitions have each RF.

    Rack violations are counted in stage 3, where each topic's rows are at hand; they are
    0 here until `plan_replicas_spark` fills them in.
    """
    width = sum(1 for c in partitions.columns if c.startswith("r"))
    replicas = F.array(*[F.col(f"r{j}") for j in range(width)])
    held: pd.DataFrame = (
        partitions.select("topic", F.explode(replicas).alias("broker"))
        .where(F.col("broker") >= 0)
        .groupBy("topic", "broker")
        .count()
        .toPandas()
    )
    led: pd.DataFrame = partitions.groupBy("topic", F.col("r0").alias("broker")).count().toPandas()
    factors: pd.DataFrame = (
        partitions.select("topic", F.size(F.filter(replicas, lambda b: b >= 0)).alias("rf"))
        .groupBy("topic", "rf")
        .count()
        .toPandas()
    )
    names = sorted(factors["topic"].unique().tolist())
    row_of = {name: i for i, name in enumerate(names)}
    held_matrix = np.zeros((len(names), layout.size), dtype=np.int64)
    led_matrix = np.zeros((len(names), layout.size), dtype=np.int64)
    for frame, matrix in ((held, held_matrix), (led, led_matrix)):
        rows = frame["topic"].map(row_of).to_numpy(dtype=np.int64)
        matrix[rows, frame["broker"].to_numpy(dtype=np.int64)] = frame["count"].to_numpy()
    histogram: dict[str, list[tuple[int, int]]] = {name: [] for name in names}
    for topic, rf, n in factors.sort_values(["topic", "rf"]).itertuples(index=False):
        histogram[topic].append((int(rf), int(n)))
    return [
        TopicCounts(
            topic=name,
            partitions=sum(n for _, n in histogram[name]),
            rf_histogram=tuple(histogram[name]),
            replicas=held_matrix[i].copy(),
            leaders=led_matrix[i].copy(),
            rack_violations=0,
        )
        for i, name in enumerate(names)
    ]


def _listed(values: np.ndarray | None) -> list[int] | None:
    return None if values is None else values.tolist()


def _array(values: object) -> np.ndarray | None:
    return None if values is None else np.asarray(values, dtype=np.int64)


def topic_plans(
    spark: SparkSession,
    partitions: DataFrame,
    targets: Sequence[TopicTargets],
    layout: BrokerLayout,
    seed: int = 0,
    violations: dict[str, int] | None = None,
) -> list[TopicPlan]:
    """Stage 3 on the executors: each topic with its targets, changed partitions back.

    `violations`, when given, receives each topic's rack violations before the plan.
    """
    if violations is None:
        violations = {}
    target_rows = pd.DataFrame(
        {
            "topic": [t.topic for t in targets],
            "replicas": [t.replicas.tolist() for t in targets],
            "leaders": [t.leaders.tolist() for t in targets],
            "leader_floor": [_listed(t.leader_floor) for t in targets],
            "leader_ceiling": [_listed(t.leader_ceiling) for t in targets],
        }
    )
    target_frame = spark.createDataFrame(target_rows, TARGETS_SCHEMA)

    def plan(pdf: pd.DataFrame, tdf: pd.DataFrame) -> pd.DataFrame:
        topic = _topic_from_pandas(pdf)
        row = tdf.iloc[0]
        wanted = TopicTargets(
            topic.topic,
            np.asarray(row["replicas"], dtype=np.int64),
            np.asarray(row["leaders"], dtype=np.int64),
            _array(row["leader_floor"]),
            _array(row["leader_ceiling"]),
        )
        result = plan_topic(topic, wanted, layout, seed)
        out = [
            {
                "topic": ch.topic,
                "partition": ch.partition,
                "before": list(ch.before),
                "after": list(ch.after),
                "round_robin_moves": 0,
                "rack_violations": 0,
                "notes": "",
            }
            for ch in result.changes
        ]
        out.append(
            {
                "topic": topic.topic,
                "partition": SUMMARY_PARTITION,
                "before": [],
                "after": [],
                "round_robin_moves": result.round_robin_moves,
                "rack_violations": int(
                    rack_violations(topic.replicas, layout.rack_group, layout.rack_limits).sum()
                ),
                "notes": json.dumps(result.notes),
            }
        )
        return pd.DataFrame(out)

    rows: pd.DataFrame = (
        partitions.groupBy("topic")
        .cogroup(target_frame.groupBy("topic"))
        .applyInPandas(plan, CHANGES_SCHEMA)
        .toPandas()
    )
    summaries = rows[rows["partition"] == SUMMARY_PARTITION]
    violations.update(
        zip(summaries["topic"], summaries["rack_violations"].astype(int), strict=True)
    )
    return list(_plans_from_rows(rows))


def _plans_from_rows(rows: pd.DataFrame) -> Iterator[TopicPlan]:
    for topic, group in rows.groupby("topic", sort=True):
        summary = group[group["partition"] == SUMMARY_PARTITION].iloc[0]
        changes = group[group["partition"] != SUMMARY_PARTITION].sort_values("partition")
        yield TopicPlan(
            str(topic),
            tuple(
                PartitionChange(
                    str(topic),
                    int(r.partition),
                    tuple(int(b) for b in r.before),
                    tuple(int(b) for b in r.after),
                )
                for r in changes.itertuples()
            ),
            int(summary["round_robin_moves"]),
            tuple(json.loads(summary["notes"])),
        )


def plan_replicas_spark(
    spark: SparkSession,
    topics: Sequence[TopicReplicas],
    layout: BrokerLayout,
    seed: int = 0,
    slices: int | None = None,
) -> ReplicaPlan:
    """The whole planner with topics planned in parallel; equal to `plan_replicas`."""
    partitions = partitions_frame(spark, topics, slices).cache()
    try:
        counts = collect_counts(partitions, layout)
        targets = plan_targets(counts, layout)
        violations: dict[str, int] = {}
        plans = topic_plans(spark, partitions, targets, layout, seed, violations)
    finally:
        partitions.unpersist()
    counts = [replace(c, rack_violations=violations[c.topic]) for c in counts]
    # The cluster-wide leader pass needs every topic at once: it runs on the driver.
    return assemble(counts, targets, balance_leaders(topics, plans, targets, layout), layout)
