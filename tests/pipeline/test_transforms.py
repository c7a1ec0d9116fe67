"""Each transform on hand-made histories with answers worked out by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import DataFrame, SparkSession

from ballast.balance.rankings import score_brokers
from ballast.config import Strategy
from ballast.model import ClusterSnapshot, LoadReport, TopicLoad
from ballast.pipeline import transforms

from .support import START, broker_rows, report, topic_rows

W = 300.0  # 5-minute windows


def idle(n: int, prefix: str = "t") -> list[TopicLoad]:
    return [TopicLoad(f"/ns/{prefix}{i}") for i in range(n)]


def broker_windows(frame: DataFrame) -> DataFrame:
    return frame.transform(transforms.with_window, W).transform(transforms.broker_window_report)


def comparison(spark: SparkSession, reports: list) -> pd.DataFrame:
    scored = broker_windows(broker_rows(spark, reports)).transform(transforms.with_strategy_scores)
    out = scored.transform(transforms.strategy_scores_long).transform(
        transforms.strategy_comparison_report, 0.3
    )
    return out.toPandas().sort_values(["window_start", "strategy"]).reset_index(drop=True)


def test_broker_window_mean_p95_max_and_ewma(spark: SparkSession) -> None:
    reports = [
        report("b1", START + 0, cpu=10, mem=30, topics=idle(1)),
        report("b1", START + 60, cpu=20, mem=30, topics=idle(2)),
        report("b1", START + 120, cpu=60, mem=30, topics=idle(3)),
        report("b1", START + 300, cpu=50, mem=30),
        report("b1", START + 600, cpu=20, mem=10),
    ]
    rows = broker_windows(broker_rows(spark, reports)).toPandas()
    rows = transforms.add_usage_ewma(rows)
    first = rows.iloc[0]
    assert first["samples"] == 3
    assert first["cpu_percent_mean"] == pytest.approx(30.0)
    # numpy's default (linear) percentile: position 0.95 * (3 - 1) = 1.9 -> 20 + 0.9 * 40
    assert first["cpu_percent_p95"] == pytest.approx(56.0)
    assert first["cpu_percent_max"] == 60.0
    assert first["topic_count_mean"] == 2.0 and first["topic_count_p95"] == pytest.approx(2.9)
    assert first["weighted_topic_load_mean"] == pytest.approx(0.4)  # 0.2 per idle topic
    # usage = max(cpu, mem) per report: window means 40, 50, 20 -> EWMA seeded with 40
    assert rows["usage_mean"].tolist() == pytest.approx([40.0, 50.0, 20.0])
    assert rows["usage_ewma"].tolist() == pytest.approx([40.0, 41.0, 38.9], abs=1e-12)
    assert rows["window_start"].tolist() == [
        pd.Timestamp(START + k * W, unit="s") for k in range(3)
    ]


def test_cv_and_classification_match_the_reference_anchors(spark: SparkSession) -> None:
    # Window 0: Fair loads 5/10/30 -> broker 3 overloaded (Danube's anchor).
    # Window 1: 100/100/100/0/0 (scale-out): mean 60, std 48.99 -> nothing overloaded,
    #           the two new brokers underloaded.
    # Window 2: b4 is draining: left out of the statistics.
    w0 = [report(b, START, topics=idle(n, b)) for b, n in (("b1", 5), ("b2", 10), ("b3", 30))]
    w1 = [
        report(b, START + W, topics=idle(n, b))
        for b, n in (("b1", 100), ("b2", 100), ("b3", 100), ("b4", 0), ("b5", 0))
    ]
    w2 = [report(b, START + 2 * W, topics=idle(n, b)) for b, n in (("b1", 2), ("b2", 4))]
    w2.append((report("b4", START + 2 * W, topics=idle(50, "x")), "draining"))
    rows = comparison(spark, [*w0, *w1, *w2])
    fair = rows[rows["strategy"] == "fair"].reset_index(drop=True)
    assert fair["brokers"].tolist() == [3, 5, 2]
    assert fair["mean"].tolist() == pytest.approx([15.0, 60.0, 3.0])
    assert fair["std"].tolist() == pytest.approx([np.sqrt(350 / 3), np.sqrt(12000 / 5), 1.0])
    assert fair["cv"].tolist() == pytest.approx([np.sqrt(350 / 3) / 15, np.sqrt(2400) / 60, 1 / 3])
    assert [list(x) for x in fair["overloaded"]] == [["b3"], [], []]
    assert [list(x) for x in fair["underloaded"]] == [[], ["b4", "b5"], []]
    assert fair["above_threshold"].tolist() == [True, True, True]
    assert fair["min"].tolist() == [5.0, 0.0, 2.0] and fair["max"].tolist() == [30.0, 100.0, 4.0]
    # No CPU or memory anywhere: Balanced falls back to the topic count.
    balanced = rows[rows["strategy"] == "balanced"].reset_index(drop=True)
    assert balanced["cv"].tolist() == pytest.approx(fair["cv"].tolist())


def test_balanced_anchor_scores(spark: SparkSession) -> None:
    """docs/design/implementation-notes.md: (cpu, mem, topics) (50,30,10), (20,20,5), (10,10,2) with
    idle topics score 28.6, 14.3 and 7.12."""
    reports = [
        report("broker1", START, cpu=50, mem=30, topics=idle(10)),
        report("broker2", START, cpu=20, mem=20, topics=idle(5)),
        report("broker3", START, cpu=10, mem=10, topics=idle(2)),
    ]
    scored = broker_windows(broker_rows(spark, reports)).transform(transforms.with_strategy_scores)
    got = {r["broker_id"]: r["score_balanced"] for r in scored.collect()}
    assert got == pytest.approx({"broker1": 28.6, "broker2": 14.3, "broker3": 7.12}, abs=1e-9)


def _random_snapshot(rng: np.random.Generator, k: int) -> tuple[list[LoadReport], ClusterSnapshot]:
    brokers = [f"b{i}" for i in range(int(rng.integers(2, 7)))]
    no_resources = k % 5 == 0  # exercises Balanced's fallback
    reports = []
    for b in brokers:
        topics = [
            TopicLoad(
                f"/ns/{b}-{j}",
                msg_rate=float(rng.uniform(0, 500)),
                byte_rate=float(rng.choice([0.0, rng.uniform(0, 5e6)])),
                producers=int(rng.integers(0, 4)),
                consumers=int(rng.integers(0, 6)),
                subscriptions=int(rng.integers(0, 3)),
                backlog=int(rng.integers(0, 50_000)),
            )
            for j in range(int(rng.integers(0, 12)))
        ]
        scale = 0.0 if no_resources else 1.0
        reports.append(
            LoadReport(
                b,
                START + k * W + float(rng.uniform(0, 200)),
                cpu_percent=scale * float(rng.uniform(0, 100)),
                memory_percent=scale * float(rng.uniform(0, 100)),
                disk_io_bps=float(rng.choice([0.0, 0.5, rng.uniform(0, 1e8)])),
                network_io_bps=float(rng.choice([0.0, rng.uniform(0, 1e8)])),
                topics=tuple(topics),
            )
        )
    snapshot = ClusterSnapshot(
        brokers=tuple(brokers),
        reports={r.broker_id: r for r in reports},
        assignments={r.broker_id: tuple(t.topic for t in r.topics) for r in reports},
    )
    return reports, snapshot


def test_spark_scores_equal_the_balance_core_for_every_strategy(spark: SparkSession) -> None:
    """One snapshot per window: the window means are the snapshot's reports, so the
    Spark scores must be the core's `score_brokers`, for all three strategies."""
    rng = np.random.default_rng(42)
    snapshots = [_random_snapshot(rng, k) for k in range(12)]
    everything = [r for reports, _ in snapshots for r in reports]
    scored = broker_windows(broker_rows(spark, everything)).transform(
        transforms.with_strategy_scores
    )
    rows = scored.toPandas()
    rows["k"] = (
        (rows["window_start"] - pd.Timestamp(START, unit="s")).dt.total_seconds() // W
    ).astype(int)
    for k, (_, snap) in enumerate(snapshots):
        window = rows[rows["k"] == k].set_index("broker_id")
        for strategy, column in transforms.SCORE_COLUMNS.items():
            expected = score_brokers(snap, strategy)
            got = window[column].to_dict()
            assert got == pytest.approx(expected, rel=1e-12, abs=1e-12), (k, strategy)
    assert set(transforms.SCORE_COLUMNS) == set(Strategy)


def test_topic_windows_rates_and_backlog_trend(spark: SparkSession) -> None:
    reports = [
        report(
            "b1",
            START + 30 * i,
            topics=[TopicLoad("/ns/a", 10.0 * (i + 1), 1e6, 1, 2, 1, 100 + 30 * i)],
        )
        for i in range(4)
    ]
    reports.append(report("b2", START + 150, topics=[TopicLoad("/ns/a", 50.0, 1e6, 1, 2, 1, 400)]))
    reports.append(report("b2", START + 300, topics=[TopicLoad("/ns/b", 1.0)]))
    rows = (
        topic_rows(spark, reports)
        .transform(transforms.with_window, W)
        .transform(transforms.topic_window_report)
        .toPandas()
        .sort_values(["window_start", "topic"])
    )
    a, b = rows.iloc[0], rows.iloc[1]
    assert (a["topic"], a["broker_id"], a["samples"]) == ("/ns/a", "b2", 5)  # owner at the end
    assert a["msg_rate_mean"] == pytest.approx(30.0)
    assert a["msg_rate_p95"] == pytest.approx(40 + 0.8 * 10)  # position 3.8 of 10..50
    assert (a["backlog_first"], a["backlog_last"], a["backlog_delta"]) == (100, 400, 300)
    # least squares over (0,100) (30,130) (60,160) (90,190) (150,400)
    t = np.array([0, 30, 60, 90, 150.0])
    y = np.array([100, 130, 160, 190, 400.0])
    assert a["backlog_slope"] == pytest.approx(np.polyfit(t, y, 1)[0])
    # load score: 0.2 + 0.3 * 1 MB/s + 0.3 * 3 connections + 0.2 * backlog / 10 000
    assert a["load_score_mean"] == pytest.approx(0.2 + 0.3 + 0.9 + 0.2 * y.mean() / 10_000)
    assert (b["topic"], b["samples"]) == ("/ns/b", 1)
    assert np.isnan(b["backlog_slope"]) or b["backlog_slope"] is None


def test_p95_is_numpys_linear_percentile_bit_for_bit(spark: SparkSession) -> None:
    rng = np.random.default_rng(3)
    groups = {g: rng.lognormal(3, 2, int(rng.integers(1, 40))).tolist() for g in range(60)}
    groups[60] = [5.0, 5.0, 5.0]
    rows = [(g, float(v)) for g, values in groups.items() for v in values]
    frame = spark.createDataFrame(rows, "g long, v double")
    got = {
        r["g"]: r["p"]
        for r in frame.groupBy("g").agg(transforms.percentile_linear("v").alias("p")).collect()
    }
    assert got == {g: float(np.percentile(values, 95)) for g, values in groups.items()}


def test_small_windows_p95s_are_the_exact_ones_bit_for_bit(spark: SparkSession) -> None:
    """The two-largest shortcut gives `percentile_linear`'s floats for every group of up
    to 21 samples (ties included), and no value for a larger group (the job then
    recomputes without the shortcut)."""
    rng = np.random.default_rng(11)
    reports = []
    for i, size in enumerate([*range(1, 22), 21, 22, 30]):
        values = rng.lognormal(2, 2, size).round(int(rng.integers(0, 3)))  # ties too
        reports += [
            report("b1", START + 3600 * i + t, topics=[TopicLoad(f"/ns/t{i}", float(v), float(v))])
            for t, v in enumerate(values)
        ]
    windows = topic_rows(spark, reports).transform(transforms.with_window, 3600.0)
    columns = ["topic", "samples", "msg_rate_p95", "byte_rate_p95", "load_score_p95"]

    def report_of(small: bool) -> pd.DataFrame:
        frame = windows.transform(transforms.topic_window_report, small_windows=small)
        return frame.select(*columns).toPandas().sort_values("topic").reset_index(drop=True)

    exact, fast = report_of(False), report_of(True)
    small = exact["samples"] <= transforms.TOP_TWO_MAX_SAMPLES
    assert small.sum() == 22 and (~small).sum() == 2
    pd.testing.assert_frame_equal(exact[small], fast[small], check_exact=True)
    assert fast[~small][columns[2:]].isna().all().all()


def test_small_windows_group_by_streams_over_the_windows_sorted_rows(
    spark: SparkSession, capsys: pytest.CaptureFixture[str]
) -> None:
    """The session's settings let the topic windows' group-by reuse the order its window
    sorted the rows in: a sort aggregate, no hash table (the cheaper plan at 10M rows)."""
    reports = [
        report("b1", START + 30 * i, topics=[TopicLoad("/ns/a", float(i), float(i))])
        for i in range(12)
    ]
    frame = (
        topic_rows(spark, reports)
        .transform(transforms.with_window, W)
        .transform(transforms.topic_window_report, brokers=["b1"], small_windows=True)
    )
    frame.explain()
    plan = capsys.readouterr().out
    assert "SortAggregate" in plan and "HashAggregate" not in plan
