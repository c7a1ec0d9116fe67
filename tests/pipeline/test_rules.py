"""One rule set: each rule of the core, applied by Spark, agrees with the core on
generated data (the same function runs on both sides; these tests prove the plumbing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F

from ballast.balance.imbalance import classify, measure
from ballast.balance.scoring import (
    NUMPY_OPS,
    balanced_with_fallback,
    cluster_stats,
    coefficient_of_variation,
    normalise,
    reports_resources,
)
from ballast.model import PYTHON_OPS, LoadReport, is_broker_id, is_topic_name
from ballast.pipeline import compact, rules, transforms
from ballast.pipeline.generate import GeneratorSpec, generate_history

W = 300.0


@pytest.fixture(scope="module")
def generated(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, compact.Columnar]:
    root = tmp_path_factory.mktemp("rules-history")
    generate_history(GeneratorSpec(brokers=5, topics=25, hours=1, seed=21), str(root))
    _, columnar = compact.compact(spark, str(root), str(root / "_scratch"))
    return root, columnar


def _scored(spark: SparkSession, columnar: compact.Columnar) -> pd.DataFrame:
    windows = (
        columnar.read(spark, "brokers")
        .transform(transforms.broker_rows)
        .transform(transforms.with_window, W)
        .transform(transforms.broker_window_report)
    )
    return windows.transform(transforms.with_strategy_scores).toPandas()


def test_report_totals(spark: SparkSession, generated: tuple[Path, compact.Columnar]) -> None:
    root, columnar = generated
    lines = [
        x
        for f in sorted(root.glob("date=*/hour=*/*.jsonl"))
        for x in f.read_text().split("\n")
        if x
    ]
    expected = {}
    for line in lines:
        r = LoadReport.from_json(line)
        expected[(r.broker_id, r.timestamp)] = (
            r.topic_count,
            r.total_throughput_mbps,
            r.total_msg_rate,
            r.total_backlog,
            r.total_connections,
        )
    rows = columnar.read(spark, "brokers").collect()
    got = {
        (r["broker_id"], r["timestamp"]): (
            r["topic_count"],
            r["throughput_mbps"],
            r["msg_rate"],
            r["backlog"],
            r["connections"],
        )
        for r in rows
    }
    assert got == expected  # the same floats, bit for bit


def test_name_validation(spark: SparkSession, generated: tuple[Path, compact.Columnar]) -> None:
    _, columnar = generated
    names = [
        r["topic"] for r in columnar.read(spark, "topics").select("topic").distinct().collect()
    ]
    names += [
        r["broker_id"]
        for r in columnar.read(spark, "brokers").select("broker_id").distinct().collect()
    ]
    names += [
        "/ns/t",
        "ns/t",
        "/ns/t/x",
        "/ns/",
        "//t",
        "/n s/t",
        "/ns/t\n",
        "b1\n",
        "b:1",
        "/ns/t:1",
        "b/1",
        "-b",
        "_b",
        "b" * 128,
        "b" * 129,
        f"/{'n' * 128}/t",
        f"/{'n' * 129}/t",
        "",
        "é",
    ]
    frame = spark.createDataFrame([(n,) for n in names], "name string")
    got = {
        r["name"]: (r["broker"], r["topic"])
        for r in frame.select(
            "name",
            rules.is_broker_id(F.col("name")).alias("broker"),
            rules.is_topic_name(F.col("name")).alias("topic"),
        ).collect()
    }
    assert got == {n: (is_broker_id(n), is_topic_name(n)) for n in names}
    assert got["/ns/t\n"] == (False, False) and got["b1\n"] == (False, False)


def test_normalisation(spark: SparkSession, generated: tuple[Path, compact.Columnar]) -> None:
    _, columnar = generated
    rows = columnar.read(spark, "brokers").select("timestamp", "disk_io_bps", "cpu_percent")
    rows = rows.union(spark.createDataFrame([(0.0, 0.0, 0.5), (0.0, 0.25, 0.0)], rows.schema))
    per = Window.partitionBy("timestamp")
    got = rows.select(
        "timestamp",
        "disk_io_bps",
        "cpu_percent",
        normalise(F.col("disk_io_bps"), F.max("disk_io_bps").over(per), rules.SPARK_OPS).alias("d"),
        normalise(F.col("cpu_percent"), F.max("cpu_percent").over(per), rules.SPARK_OPS).alias("c"),
    ).toPandas()
    for _, group in got.groupby("timestamp"):
        for column, out in (("disk_io_bps", "d"), ("cpu_percent", "c")):
            values = group[column].to_numpy()
            assert group[out].tolist() == normalise(values, values.max()).tolist()


def test_balanced_fallback(spark: SparkSession) -> None:
    cases = [(0.0, 0.0), (0.0, 3.0), (2.0, 0.0), (5.0, 7.0)]
    frame = spark.createDataFrame(cases, "cpu double, mem double")
    spark_side = frame.select(
        balanced_with_fallback(
            F.lit(1.0), F.lit(2.0), reports_resources(F.col("cpu"), F.col("mem")), rules.SPARK_OPS
        ).alias("score")
    ).collect()
    python_side = [
        balanced_with_fallback(1.0, 2.0, reports_resources(cpu, mem), PYTHON_OPS)
        for cpu, mem in cases
    ]
    cpu, mem = np.array(cases).T
    numpy_side = balanced_with_fallback(
        np.ones(4), np.full(4, 2.0), reports_resources(cpu, mem), NUMPY_OPS
    )
    assert [r["score"] for r in spark_side] == python_side == numpy_side.tolist()
    assert python_side == [2.0, 1.0, 1.0, 1.0]


def test_cv_and_classification(
    spark: SparkSession, generated: tuple[Path, compact.Columnar]
) -> None:
    _, columnar = generated
    scored = _scored(spark, columnar)
    comparison = (
        spark.createDataFrame(scored)
        .transform(transforms.strategy_scores_long)
        .transform(transforms.strategy_comparison_report, 0.2)
        .toPandas()
    )
    assert len(comparison) > 0
    for _, row in comparison.iterrows():
        window = scored[
            (scored["window_start"] == row["window_start"]) & (scored["state"] == "active")
        ]
        scores = dict(zip(window["broker_id"], window[f"score_{row['strategy']}"], strict=True))
        core = measure(scores)
        mean, std, _ = cluster_stats(list(scores.values()))
        assert row["cv"] == pytest.approx(core.cv, rel=1e-12, abs=1e-15)
        assert row["cv"] == pytest.approx(
            coefficient_of_variation(std, mean, len(scores)), rel=1e-12
        )
        assert list(row["overloaded"]) == list(core.overloaded)
        assert list(row["underloaded"]) == list(core.underloaded)
        for broker, score in scores.items():
            assert classify(score, core.mean, core.std) == core.classification(broker)
    # Edge cases of the CV guard agree too.
    for std, mean, n in ((1.0, 0.0, 3), (1.0, 2.0, 1), (1.0, 2.0, 2)):
        got = (
            spark.range(1)
            .select(
                coefficient_of_variation(F.lit(std), F.lit(mean), F.lit(n), rules.SPARK_OPS).alias(
                    "cv"
                )
            )
            .first()
        )
        assert got is not None and got["cv"] == coefficient_of_variation(std, mean, n)
