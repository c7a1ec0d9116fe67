"""From the history to a `ClusterSnapshot` the decision core can plan on.

The snapshot is the cluster as of the last record (`now` is the history's end, never
the wall clock, so the same history always gives the same plan):

- brokers: those whose last report is at most `stale_after` seconds old; older ones left
  the cluster (died or were removed) and are listed as departed;
- assignments: the topics each live broker listed in its last report (a topic listed by
  two brokers belongs to the later report: it moved in between);
- loads: p95 over the planning horizon, per topic (rates, connections, backlog) and per
  broker (CPU, memory, disk and network I/O), so the plan is robust to a quiet minute;
  counts are rounded up;
- states: the last reported state; topic creation: the first time a topic was seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ballast.model import BrokerMode, BrokerState, ClusterSnapshot, LoadReport, TopicLoad
from ballast.pipeline.transforms import percentile_linear

P95 = 0.95


def latest_report_rows(broker_rows: DataFrame, topic_rows: DataFrame) -> DataFrame:
    """Per broker: its last report's timestamp, state and topic names."""
    latest = broker_rows.groupBy("broker_id").agg(
        F.max("timestamp").alias("timestamp"), F.max_by("state", "timestamp").alias("state")
    )
    names = (
        topic_rows.join(
            latest.select("broker_id", "timestamp"), on=["broker_id", "timestamp"], how="inner"
        )
        .groupBy("broker_id")
        .agg(F.array_sort(F.collect_list("topic")).alias("topic_names"))
    )
    return latest.join(names, on="broker_id", how="left").select(
        "broker_id", "timestamp", "state", "topic_names"
    )


def broker_p95_report(broker_rows: DataFrame, since: float) -> DataFrame:
    """Per broker: p95 of CPU, memory, disk and network I/O from `since` on."""
    recent = broker_rows.filter(F.col("timestamp") >= F.lit(float(since)))
    return recent.groupBy("broker_id").agg(
        *[
            percentile_linear(F.col(c).cast("double"), P95).alias(c)
            for c in ("cpu_percent", "memory_percent", "disk_io_bps", "network_io_bps")
        ]
    )


def topic_p95_report(topic_rows: DataFrame, since: float) -> DataFrame:
    """Per topic seen from `since` on: p95 of every load figure over those rows.

    The exact percentiles only see the horizon's rows (pass only the hours it spans).
    When each topic was first seen comes apart (`SnapshotParts.first_seen`: the job takes
    it from the topic windows, so the whole history is not scanned again).
    """
    figures = ("msg_rate", "byte_rate", "producers", "consumers", "subscriptions", "backlog")
    return (
        topic_rows.filter(F.col("timestamp") >= F.lit(float(since)))
        .groupBy("topic")
        .agg(*[percentile_linear(F.col(c).cast("double"), P95).alias(c) for c in figures])
        .select("topic", *figures)
    )


@dataclass(frozen=True)
class SnapshotParts:
    """What the driver collected: small tables as lists of dicts."""

    latest: list[dict[str, Any]]
    broker_p95: list[dict[str, Any]]
    topic_p95: list[dict[str, Any]]  # topics seen in the horizon
    first_seen: dict[str, float]  # every topic of the history -> its first timestamp


@dataclass(frozen=True)
class BuiltSnapshot:
    snapshot: ClusterSnapshot
    now: float
    departed: dict[str, float]  # broker -> time of its last report


def _count(value: Any) -> int:
    return 0 if value is None else math.ceil(value)


def build_snapshot(parts: SnapshotParts, stale_after: float) -> BuiltSnapshot:
    """Assemble the core's snapshot from the collected tables (see the module doc)."""
    now = max(row["timestamp"] for row in parts.latest)
    live = sorted(
        (row for row in parts.latest if row["timestamp"] >= now - stale_after),
        key=lambda row: row["broker_id"],
    )
    departed = {
        row["broker_id"]: row["timestamp"]
        for row in sorted(parts.latest, key=lambda r: r["broker_id"])
        if row["timestamp"] < now - stale_after
    }
    owner: dict[str, tuple[float, str]] = {}
    for row in live:
        for topic in row["topic_names"] or ():
            seen = owner.get(topic)
            candidate = (row["timestamp"], row["broker_id"])
            if seen is None or candidate > seen:
                owner[topic] = candidate
    assignments: dict[str, list[str]] = {row["broker_id"]: [] for row in live}
    for topic, (_, broker) in sorted(owner.items()):
        assignments[broker].append(topic)

    topic_loads = {row["topic"]: row for row in parts.topic_p95}
    resources = {row["broker_id"]: row for row in parts.broker_p95}
    reports: dict[str, LoadReport] = {}
    for row in live:
        broker = row["broker_id"]
        loads = []
        for topic in assignments[broker]:
            t = topic_loads.get(topic, {})
            loads.append(
                TopicLoad(
                    topic=topic,
                    msg_rate=float(t.get("msg_rate") or 0.0),
                    byte_rate=float(t.get("byte_rate") or 0.0),
                    producers=_count(t.get("producers")),
                    consumers=_count(t.get("consumers")),
                    subscriptions=_count(t.get("subscriptions")),
                    backlog=_count(t.get("backlog")),
                )
            )
        r = resources.get(broker, {})
        reports[broker] = LoadReport(
            broker_id=broker,
            timestamp=row["timestamp"],
            cpu_percent=float(r.get("cpu_percent") or 0.0),
            memory_percent=float(r.get("memory_percent") or 0.0),
            disk_io_bps=float(r.get("disk_io_bps") or 0.0),
            network_io_bps=float(r.get("network_io_bps") or 0.0),
            topics=tuple(loads),
        )
    snapshot = ClusterSnapshot(
        brokers=tuple(row["broker_id"] for row in live),
        reports=reports,
        states={row["broker_id"]: BrokerState(BrokerMode(row["state"])) for row in live},
        assignments={broker: tuple(topics) for broker, topics in assignments.items()},
        topic_created={topic: seen for topic, seen in parts.first_seen.items() if topic in owner},
    )
    return BuiltSnapshot(snapshot, now, departed)
