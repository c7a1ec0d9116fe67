"""Topic windows from the partials compaction writes equal the windows of the rows."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from ballast.load_history import HistoryWriter
from ballast.model import LoadReport, TopicLoad
from ballast.pipeline import compact, partials, transforms
from ballast.pipeline.generate import GeneratorSpec, generate_history
from ballast.pipeline.job import AnalyzeOptions, run_analysis

from .support import HOUR0, START, compacted, report

KEYS = ["window_start", "topic"]
# Sums and the trend's moments are added in another order: equal to rounding.
ROUNDED = ["msg_rate_mean", "byte_rate_mean", "connections_mean", "load_score_mean"]
SLOPE = "backlog_slope"


def _two_writers(root: Path, seed: int) -> list[LoadReport]:
    """Two hours of 30 s reports from three brokers, written by two writers (two files
    per hour): every topic's windows hold rows of both files. Rates are rounded so that
    the largest values repeat, within a file and across the two."""
    rng = np.random.default_rng(seed)
    reports = []
    for tick in range(240):
        for b, broker in enumerate(("b1", "b2", "b3")):
            t = START + 30 * tick + b + float(rng.integers(0, 1000)) / 1000
            topics = [
                TopicLoad(
                    f"/ns/t{i}",
                    float(rng.integers(0, 4) * 10),
                    round(float(rng.lognormal(8, 1)), -2),
                    int(rng.integers(0, 3)),
                    int(rng.integers(0, 3)),
                    1,
                    int(rng.integers(0, 10**9)),
                )
                # Topics move between brokers: owner and windows span files.
                for i in range(12)
                if (i + tick // 7) % 3 == b
            ]
            reports.append(report(broker, t, 10.0, 10.0, topics=topics))
    with HistoryWriter(root, writer="w1") as w1, HistoryWriter(root, writer="w2") as w2:
        for r in reports:
            (w1 if rng.random() < 0.5 else w2).append(r)
    # A topic seen once in the whole history: one sample, no trend, its value as p95.
    with HistoryWriter(root, writer="w2") as w2:
        w2.append(report("b1", START + 7000.5, topics=[TopicLoad("/ns/once", 5.0, 7.0)]))
    return reports


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(KEYS).reset_index(drop=True)


def _assert_same_windows(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Equal: exactly, except sums and the slope (equal to rounding)."""
    got, expected = _sorted(got), _sorted(expected[list(got.columns)])
    exact = [c for c in got.columns if c not in (*ROUNDED, SLOPE)]
    pd.testing.assert_frame_equal(got[exact], expected[exact], check_exact=True)
    pd.testing.assert_frame_equal(got[ROUNDED], expected[ROUNDED], check_exact=False, rtol=1e-13)
    # The rows' slope is Spark's running update of the moments: within 1e-12 of the
    # partials' (which are exact to a few units of the last place).
    assert got[SLOPE].isna().equals(expected[SLOPE].isna())
    np.testing.assert_allclose(got[SLOPE], expected[SLOPE], rtol=1e-12, atol=1e-15)


def test_partials_combined_across_files_equal_the_windows_of_the_rows(
    spark: SparkSession, tmp_path: Path
) -> None:
    _two_writers(tmp_path, seed=3)
    columnar = compacted(spark, tmp_path)
    assert all(marker.partials for marker in columnar.hours.values())
    assert len(columnar.hours) == 2
    windows = [
        partials.topic_windows(partials.read_partials(path), 300.0).to_pandas()
        for path in columnar.paths("topic_partials")
    ]
    got = pd.concat(windows, ignore_index=True)
    # Every window of a moving topic is made of both writers' files.
    hour = pq.read_table(columnar.paths("topic_partials")[0]).to_pandas()
    per_window = hour.groupby(["bucket_start", "topic"]).size()
    assert (per_window == 2).mean() > 0.9
    rows = columnar.read(spark, "topics").transform(transforms.topic_rows)
    expected = (
        rows.transform(transforms.with_window, 300.0)
        .transform(
            transforms.topic_window_report,
            with_first_seen=True,
            brokers=["b1", "b2", "b3"],
            small_windows=False,  # the exact p95s: sorting every window's values
        )
        .toPandas()
    )
    for column in ("window_start", "window_end"):  # Spark's are naive UTC, in ns
        got[column] = got[column].dt.tz_localize(None).astype("datetime64[ns]")
    _assert_same_windows(got, expected)
    once = got[got["topic"] == "/ns/once"].iloc[0]
    assert once["samples"] == 1 and once["msg_rate_p95"] == 5.0 and pd.isna(once[SLOPE])


def test_merging_partials_is_merging_their_rows() -> None:
    """Partials of parts of the rows, merged, are the partials of all the rows: the
    merge is exact for counts, extremes, first and last, and the two largest values."""
    rng = np.random.default_rng(8)
    n = 2000
    rows = pa.table(
        {
            "report_id": np.arange(n),
            "broker_id": rng.choice(["b1", "b2"], n),
            "timestamp": START + np.sort(rng.uniform(0, 1200, n)).round(3),
            "topic": rng.choice(["/ns/a", "/ns/b", "/ns/c"], n),
            "msg_rate": rng.integers(0, 5, n).astype(float),  # many repeats of the largest
            "byte_rate": rng.lognormal(5, 2, n),
            "producers": rng.integers(0, 3, n),
            "consumers": rng.integers(0, 3, n),
            "subscriptions": np.ones(n, dtype=np.int64),
            "backlog": rng.integers(10**12, 10**12 + 50, n),  # large, nearly constant
        }
    )
    whole = partials.file_partials(rows).to_pandas()
    cuts = [0, 1, 700, 701, 1500, n]  # parts of one row too
    pieces = pa.concat_tables(
        partials.file_partials(rows.slice(a, b - a)) for a, b in itertools.pairwise(cuts)
    )
    keys = np.unique(pieces.column("bucket_start").to_numpy(), return_inverse=True)[1]
    topics = np.unique(pieces.column("topic").to_numpy(zero_copy_only=False), return_inverse=True)
    merged = pd.DataFrame(
        {
            k: (v.to_pylist() if isinstance(v, pa.Array) else v)
            for k, v in partials.merge(pieces, keys * 10 + topics[1]).items()
        }
    )
    key = ["bucket_start", "topic"]
    whole, merged = whole.sort_values(key).reset_index(drop=True), merged[whole.columns]
    merged = merged.sort_values(key).reset_index(drop=True)
    moments = ["timestamp_mean", "backlog_mean", "backlog_comoment", "timestamp_m2"]
    sums = ["msg_rate_sum", "byte_rate_sum", "load_score_sum"]
    exact = [c for c in whole.columns if c not in (*moments, *sums)]
    pd.testing.assert_frame_equal(merged[exact], whole[exact], check_exact=True)
    pd.testing.assert_frame_equal(merged[sums], whole[sums], check_exact=False, rtol=1e-13)
    pd.testing.assert_frame_equal(
        merged[moments], whole[moments], check_exact=False, rtol=1e-9, atol=1e-6
    )


def _without_partials(history: Path) -> None:
    """The columnar history as a compaction before partials left it."""
    shutil.rmtree(history / "_columnar" / "topic_partials")
    for marker in (history / "_columnar" / "_committed").glob("*.json"):
        data = json.loads(marker.read_text())
        del data["partials"]
        marker.write_text(json.dumps(data))


def test_the_analysis_from_partials_equals_the_analysis_from_rows(
    spark: SparkSession, tmp_path: Path
) -> None:
    """`analyze` reads the hours with partials from them and the others (an hour the
    Spark path compacted, a file with a report outside its hour, hours compacted before
    partials) from their rows; the windows are the same either way."""
    history = tmp_path / "history"
    spec = GeneratorSpec(brokers=3, topics=30, hours=2.5, seed=4, start=START)
    generate_history(spec, str(history))
    first, _, last = sorted(history.glob("date=*/hour=*/*.jsonl"))
    # Hour 00 gets a bad line (the Spark path); hour 01 a second writer's file whose one
    # report belongs to hour 02, naming a topic hour 02's partials hold in that window:
    # neither hour has partials, and that window must not be counted twice.
    first.write_text(first.read_text() + "{not json\n")
    stray = json.loads(last.read_text().splitlines()[0])
    stray["broker_id"], stray["timestamp"] = "broker-9", stray["timestamp"] + 1.5
    (history / "date=2026-01-01" / "hour=01" / "late.jsonl").write_text(json.dumps(stray) + "\n")
    out = tmp_path / "with"
    run_analysis(spark, AnalyzeOptions(history=str(history), out=str(out)))
    markers = compact.read_markers(str(history / "_columnar"))
    assert [markers[h].partials for h in sorted(markers)] == [False, False, True]
    assert HOUR0 in markers
    with_partials = pd.read_parquet(out / "topic_windows")

    _without_partials(history)
    assert not any(m.partials for m in compact.read_markers(str(history / "_columnar")).values())
    out = tmp_path / "without"
    run_analysis(spark, AnalyzeOptions(history=str(history), out=str(out)))
    _assert_same_windows(with_partials, pd.read_parquet(out / "topic_windows"))
