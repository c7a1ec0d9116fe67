"""The analysis as a chain of pure DataFrame steps.

Each step takes a DataFrame and returns one, states its output columns in a `select`, and
is composed with `DataFrame.transform`:

    brokers = broker_table.transform(broker_rows).transform(with_window, 300) \\
        .transform(broker_window_report).transform(with_strategy_scores)

Scores come from `ballast.balance.scoring`, applied to Spark columns; the rules around
them are the core's (`balance/rankings.py`, `balance/imbalance.py`): WeightedLoad divides
each metric by the window's cluster maximum floored at 1.0, Balanced falls back to the
topic count when no broker in the window reports CPU or memory, statistics and the
overloaded/underloaded classification are over active brokers only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from ballast.balance.imbalance import classify
from ballast.balance.scoring import (
    balanced_score,
    balanced_with_fallback,
    coefficient_of_variation,
    ewma,
    fair_score,
    normalise,
    reports_resources,
    topic_load_score,
    weighted_load_score,
)
from ballast.config import Strategy
from ballast.model import BrokerMode, throughput_mbps, topic_connections
from ballast.pipeline.rules import SPARK_OPS
from ballast.pipeline.shedding import PULSAR_SCORE_COLUMNS, pulsar_score_columns

P95 = 0.95
EWMA_HISTORY_WEIGHT = 0.9  # Pulsar's ThresholdShedder
SCORE_COLUMNS = {
    Strategy.FAIR: "score_fair",
    Strategy.BALANCED: "score_balanced",
    Strategy.WEIGHTED_LOAD: "score_weighted_load",
    **PULSAR_SCORE_COLUMNS,  # Pulsar's placement strategies (pipeline/shedding.py)
}
_WHOLE_PARTITION = (Window.unboundedPreceding, Window.unboundedFollowing)

BROKER_ROW_COLUMNS = (
    "broker_id",
    "timestamp",
    "state",
    "cpu_percent",
    "memory_percent",
    "disk_io_bps",
    "network_io_bps",
    "topic_count",
    "throughput_mbps",
    "msg_rate",
    "connections",
    "backlog",
    "weighted_topic_load",
    "usage",
)


def broker_rows(brokers: DataFrame) -> DataFrame:
    """The broker table's rows with the core's derived figures: the weighted topic load
    (`topic_load_score` of the report's totals) and Pulsar's usage, max(cpu%, memory%)."""
    return brokers.select(
        *BROKER_ROW_COLUMNS[:-2],
        topic_load_score(
            F.col("topic_count"), F.col("throughput_mbps"), F.col("connections"), F.col("backlog")
        ).alias("weighted_topic_load"),
        SPARK_OPS.maximum(F.col("cpu_percent"), F.col("memory_percent")).alias("usage"),
    )


def topic_rows(topics: DataFrame) -> DataFrame:
    """The topic table's rows with connections and the topic's load score (the core's
    `topic_connections`, `throughput_mbps` and `topic_load_score`)."""
    connections = topic_connections(F.col("producers"), F.col("consumers"))
    return topics.select(
        "broker_id",
        "timestamp",
        "topic",
        "msg_rate",
        "byte_rate",
        "producers",
        "consumers",
        "subscriptions",
        "backlog",
        connections.alias("connections"),
        topic_load_score(
            F.lit(1), throughput_mbps(F.col("byte_rate")), connections, F.col("backlog")
        ).alias("load_score"),
    )


def with_window(rows: DataFrame, window_seconds: float) -> DataFrame:
    """Add the tumbling window (UTC, aligned to the epoch) each row's timestamp is in."""
    start = F.floor(F.col("timestamp") / F.lit(float(window_seconds))) * F.lit(
        float(window_seconds)
    )
    return rows.withColumn("window_start", F.timestamp_seconds(start)).withColumn(
        "window_end", F.timestamp_seconds(start + F.lit(float(window_seconds)))
    )


def _interpolate(below: Column, above: Column, frac: Column) -> Column:
    """NumPy's linear interpolation between two neighbours, with NumPy's arithmetic."""
    step = above - below
    return F.when(frac >= 0.5, above - step * (1 - frac)).otherwise(below + step * frac)


def _position(n: Column, q: float) -> tuple[Column, Column]:
    position = (n - 1).cast("double") * F.lit(float(q))
    low = F.floor(position).cast("int")
    return low, position - low


def percentile_linear(column: str | Column, q: float = P95) -> Column:
    """Exact percentile of a group, interpolated like NumPy's default ('linear') method,
    with NumPy's arithmetic (so the same floats come out).

    Spark's own `percentile` gives the same value but keeps a hash map per group and was
    4x slower here than sorting the collected values, which for windows of a few dozen
    samples is cheap. `sort_array` (compiled comparison), not `array_sort` (a comparator
    lambda, interpreted): same order for the null-free collected values, and faster.
    """
    col = F.col(column) if isinstance(column, str) else column
    values = F.sort_array(F.collect_list(col))
    n = F.size(values)
    low, frac = _position(n, q)
    below = F.try_element_at(values, low + 1)
    above = F.try_element_at(values, F.least(low + 2, n))
    return _interpolate(below, above, frac)


# The p95 of n <= 21 values only needs the two largest: NumPy's position 0.95 * (n - 1)
# lies between the second largest (index n - 2) and the largest. `topic_window_report`
# uses that (no collected lists: plain aggregates, several times faster) when every
# group is that small, which a window of the usual size is (5 min of 30 s reports: 10).
TOP_TWO_MAX_SAMPLES = 21


def _top_two_columns(metrics: Sequence[str], keys: Sequence[str]) -> list[Column]:
    """Each metric's group maximum, on every row (a window over the group's keys)."""
    group = Window.partitionBy(*keys).rowsBetween(*_WHOLE_PARTITION)
    return [F.max(m).over(group).alias(f"_{m}_top") for m in metrics]


def _top_two_aggregates(metric: str) -> list[Column]:
    top, value = F.col(f"_{metric}_top"), F.col(metric)
    return [
        F.max(top).alias(f"_{metric}_top"),
        F.max(F.when(value < top, value)).alias(f"_{metric}_second"),
        F.count_if(value == top).alias(f"_{metric}_ties"),
    ]


def _top_two_p95(metric: str, n: Column) -> Column:
    """`percentile_linear` of the group from its two largest values (n <= 21)."""
    top = F.col(f"_{metric}_top")
    second = F.when((n == 1) | (F.col(f"_{metric}_ties") >= 2), top).otherwise(
        F.col(f"_{metric}_second")
    )
    low, frac = _position(n, P95)
    below = F.when(low == n - 1, top).otherwise(second)
    return _interpolate(below, top, frac)


def _stats(column: str, name: str | None = None) -> list[Column]:
    name = name or column
    return [
        F.avg(column).alias(f"{name}_mean"),
        percentile_linear(column).cast("double").alias(f"{name}_p95"),
        F.max(column).cast("double").alias(f"{name}_max"),
    ]


def broker_window_report(broker_rows: DataFrame) -> DataFrame:
    """Per broker and window: sample count, mean/p95/max of CPU, memory, throughput and
    topic count, means of the other metrics, the last reported state, and `usage_mean`
    (the window's sample for Pulsar's smoothed usage)."""
    return (
        broker_rows.groupBy("window_start", "window_end", "broker_id")
        .agg(
            F.max_by("state", "timestamp").alias("state"),
            F.count(F.lit(1)).alias("samples"),
            *_stats("cpu_percent"),
            *_stats("memory_percent"),
            *_stats("throughput_mbps"),
            *_stats("topic_count"),
            F.avg("disk_io_bps").alias("disk_io_bps_mean"),
            F.avg("network_io_bps").alias("network_io_bps_mean"),
            F.avg("msg_rate").alias("msg_rate_mean"),
            F.avg("backlog").alias("backlog_mean"),
            F.avg("connections").alias("connections_mean"),
            F.avg("weighted_topic_load").alias("weighted_topic_load_mean"),
            F.avg("usage").alias("usage_mean"),
        )
        .select(
            "window_start",
            "window_end",
            "broker_id",
            "state",
            "samples",
            *(
                f"{metric}_{stat}"
                for metric in ("cpu_percent", "memory_percent", "throughput_mbps", "topic_count")
                for stat in ("mean", "p95", "max")
            ),
            "disk_io_bps_mean",
            "network_io_bps_mean",
            "msg_rate_mean",
            "backlog_mean",
            "connections_mean",
            "weighted_topic_load_mean",
            "usage_mean",
        )
    )


def with_strategy_scores(broker_windows: DataFrame) -> DataFrame:
    """Add each broker's score under Fair, Balanced and WeightedLoad, from its window
    means, normalised against the brokers of the same window."""
    cluster = Window.partitionBy("window_start").rowsBetween(*_WHOLE_PARTITION)

    def norm(column: str) -> Column:
        return normalise(F.col(column), F.max(column).over(cluster), SPARK_OPS)

    resources = reports_resources(
        F.max("cpu_percent_mean").over(cluster), F.max("memory_percent_mean").over(cluster)
    )
    fair = fair_score(F.col("topic_count_mean"))
    balanced = balanced_score(
        F.col("weighted_topic_load_mean"), F.col("cpu_percent_mean"), F.col("memory_percent_mean")
    )
    weighted = weighted_load_score(
        norm("cpu_percent_mean"),
        norm("memory_percent_mean"),
        norm("disk_io_bps_mean"),
        norm("network_io_bps_mean"),
        norm("throughput_mbps_mean"),
        norm("weighted_topic_load_mean"),
        ops=SPARK_OPS,
    )
    return broker_windows.select(
        "*",
        fair.alias("score_fair"),
        balanced_with_fallback(balanced, fair, resources, SPARK_OPS).alias("score_balanced"),
        weighted.alias("score_weighted_load"),
        *pulsar_score_columns(),
    )


def strategy_scores_long(scored: DataFrame) -> DataFrame:
    """One row per window, broker and strategy: `strategy`, `score`, `state`."""
    return scored.unpivot(
        ["window_start", "window_end", "broker_id", "state"],
        list(SCORE_COLUMNS.values()),
        "score_column",
        "score",
    ).select(
        "window_start",
        "window_end",
        "broker_id",
        "state",
        F.regexp_replace(F.col("score_column"), "^score_", "").alias("strategy"),
        "score",
    )


def with_classification(scores: DataFrame) -> DataFrame:
    """Add `class` (overloaded / underloaded / normal, or inactive for draining and
    drained brokers) against the mean and population std of the window's active brokers."""
    group = Window.partitionBy("window_start", "strategy").rowsBetween(*_WHOLE_PARTITION)
    active = F.col("state") == F.lit(BrokerMode.ACTIVE.value)
    active_score = F.when(active, F.col("score"))
    mean = F.avg(active_score).over(group)
    std = F.stddev_pop(active_score).over(group)
    cls = F.when(~active, F.lit("inactive")).otherwise(
        classify(F.col("score"), mean, std, SPARK_OPS)
    )
    return scores.withColumn("class", cls)


def strategy_comparison_report(scores: DataFrame, cv_threshold: float) -> DataFrame:
    """Per window and strategy, over active brokers: count, mean, population std, CV
    (0 with fewer than 2 brokers or a zero mean), min, max, the overloaded and
    underloaded brokers, and whether CV is above the rebalancing threshold."""
    classified = scores.transform(with_classification).filter(F.col("class") != "inactive")

    def brokers_in(cls: str) -> Column:
        return F.array_sort(F.collect_list(F.when(F.col("class") == cls, F.col("broker_id"))))

    stats = classified.groupBy("window_start", "window_end", "strategy").agg(
        F.count(F.lit(1)).alias("brokers"),
        F.avg("score").alias("mean"),
        F.stddev_pop("score").alias("std"),
        F.min("score").alias("min"),
        F.max("score").alias("max"),
        brokers_in("overloaded").alias("overloaded"),
        brokers_in("underloaded").alias("underloaded"),
    )
    cv = coefficient_of_variation(F.col("std"), F.col("mean"), F.col("brokers"), SPARK_OPS)
    return stats.select(
        "window_start",
        "window_end",
        "strategy",
        "brokers",
        "mean",
        "std",
        cv.alias("cv"),
        "min",
        "max",
        "overloaded",
        "underloaded",
        (cv > F.lit(float(cv_threshold))).alias("above_threshold"),
    )


def topic_window_report(
    topic_rows: DataFrame,
    with_first_seen: bool = False,
    brokers: Sequence[str] | None = None,
    small_windows: bool = False,
) -> DataFrame:
    """Per topic and window: mean and p95 rates and load score, mean connections, and the
    backlog trend (first, last, last − first, least-squares slope per second); with
    `with_first_seen`, also `first_seen`, the window's first timestamp (the job keeps it
    for the plan instead of scanning the topic rows again).

    `brokers`, every broker id the rows name, lets the owner (the broker of the window's
    last report) be aggregated as the id's index, a number: a string in an aggregation
    buffer makes Spark fall back to a slower aggregation for the whole group-by.

    `small_windows` promises that no group has more than `TOP_TWO_MAX_SAMPLES` rows: the
    p95s then come from each group's two largest values (the same floats as
    `percentile_linear`); a group that breaks the promise gets a null p95 (the job checks
    `samples` and recomputes without the promise).
    """
    keys = ("window_start", "window_end", "topic")
    metrics = ("msg_rate", "byte_rate", "load_score")
    extra = [F.min("timestamp").alias("first_seen")] if with_first_seen else []
    if brokers:
        names = sorted(set(brokers))
        index = F.create_map(*[x for i, b in enumerate(names) for x in (F.lit(b), F.lit(i))])
        owner = F.element_at(
            F.array(*[F.lit(b) for b in names]),
            F.max_by(F.element_at(index, F.col("broker_id")), "timestamp") + 1,
        )
    else:
        owner = F.max_by("broker_id", "timestamp")
    if small_windows:
        rows = topic_rows.select("*", *_top_two_columns(metrics, keys))
        tails = [agg for m in metrics for agg in _top_two_aggregates(m)]
        samples = F.col("samples")
        small = samples <= TOP_TWO_MAX_SAMPLES
        p95 = {m: F.when(small, _top_two_p95(m, samples)) for m in metrics}
    else:
        rows, tails = topic_rows, [percentile_linear(m).alias(f"_{m}_p95") for m in metrics]
        p95 = {m: F.col(f"_{m}_p95") for m in metrics}
    return (
        rows.groupBy(*keys)
        .agg(
            owner.alias("broker_id"),
            F.count(F.lit(1)).alias("samples"),
            F.avg("msg_rate").alias("msg_rate_mean"),
            F.avg("byte_rate").alias("byte_rate_mean"),
            F.avg("connections").alias("connections_mean"),
            F.avg("load_score").alias("load_score_mean"),
            F.min_by("backlog", "timestamp").alias("backlog_first"),
            F.max_by("backlog", "timestamp").alias("backlog_last"),
            # Time from the window's start, not epoch seconds: Spark's running update of
            # the moments lost up to 1e-9 of the slope to epoch-sized timestamps.
            F.regr_slope(
                F.col("backlog"), F.col("timestamp") - F.unix_seconds(F.col("window_start"))
            ).alias("backlog_slope"),
            *tails,
            *extra,
        )
        .select(
            *keys,
            "broker_id",
            "samples",
            "msg_rate_mean",
            p95["msg_rate"].alias("msg_rate_p95"),
            "byte_rate_mean",
            p95["byte_rate"].alias("byte_rate_p95"),
            "connections_mean",
            "load_score_mean",
            p95["load_score"].alias("load_score_p95"),
            "backlog_first",
            "backlog_last",
            (F.col("backlog_last") - F.col("backlog_first")).alias("backlog_delta"),
            "backlog_slope",
            *(["first_seen"] if with_first_seen else []),
        )
    )


def add_usage_ewma(
    broker_windows: pd.DataFrame, history_weight: float = EWMA_HISTORY_WEIGHT
) -> pd.DataFrame:
    """Pulsar's smoothed usage per broker over its windows in time order, seeded with the
    first window's sample (seeding with 0 is Pulsar issue 13119).

    Runs on the driver: the per-window broker table is small (brokers × windows) and the
    recurrence is sequential. It calls `scoring.ewma`, so it is the core's formula.
    """
    out = broker_windows.sort_values(["broker_id", "window_start"], kind="stable").reset_index(
        drop=True
    )
    smoothed: list[float] = []
    previous: dict[str, float] = {}
    for broker, sample in zip(out["broker_id"].tolist(), out["usage_mean"].tolist(), strict=True):
        value = (
            sample
            if broker not in previous
            else float(ewma(previous[broker], sample, history_weight))
        )
        previous[broker] = value
        smoothed.append(value)
    out["usage_ewma"] = smoothed
    return out


def conform(
    frame: DataFrame, columns: list[str] | tuple[str, ...], types: dict[str, Any] | None = None
) -> DataFrame:
    """Select `columns` in order (the written table's schema), casting where asked."""
    types = types or {}
    return frame.select(*[F.col(c).cast(types[c]) if c in types else F.col(c) for c in columns])
