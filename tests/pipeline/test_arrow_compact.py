"""Compaction's fast path: which files it takes, and that it writes what the Spark path
writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from ballast.load_history import history_line
from ballast.model import PYTHON_OPS, LoadReport, TopicLoad, report_totals
from ballast.pipeline import arrow_compact, compact
from ballast.pipeline.arrow_compact import FAST_ID_BASE, SEGMENT_OPS, Segments
from ballast.pipeline.compact import Hour
from ballast.pipeline.generate import GeneratorSpec, generate_history

from .support import START, compacted

GOOD: dict[str, Any] = {
    "broker_id": "b1",
    "timestamp": START,
    "cpu_percent": 10,
    "topics": [{"topic": "/ns/t", "msg_rate": 1.5, "producers": 2}],
}


def _lines(*records: Any) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()


@pytest.mark.parametrize(
    "line",
    [
        '{"broker_id":"b1","timestamp":1767225600,"topics":[{"topic":"/ns/t"',  # truncated
        "[1, 2]",
        json.dumps(GOOD) + json.dumps(GOOD),  # two objects on one line
        {**GOOD, "cpu_percent": "high"},
        {**GOOD, "broker_id": 5},
        {**GOOD, "broker_id": "a/b"},
        {**GOOD, "timestamp": None},
        {**GOOD, "timestamp": -1},
        {**GOOD, "memory_percent": float("nan")},
        {**GOOD, "cpu_percent": 150},
        {**GOOD, "state": "sleeping"},
        {**GOOD, "topics": [{"topic": "no-slash"}]},
        {**GOOD, "topics": [{"msg_rate": 1}]},
        {**GOOD, "topics": [None]},
        {**GOOD, "topics": [{"topic": "/ns/t", "producers": 2.5}]},
        {**GOOD, "topics": [{"topic": "/ns/t", "backlog": -1}]},
        {**GOOD, "topics": {"topic": "/ns/t"}},
        '{"broker_id": "b1", "broker_id": "b2", "timestamp": 1}',
    ],
)
def test_a_file_with_anything_to_quarantine_is_not_clean(line: Any) -> None:
    with pytest.raises(arrow_compact.NotClean):
        arrow_compact.convert(_lines(GOOD, line), 0, "x")


def test_clean_lines_take_the_models_defaults_and_totals() -> None:
    report = LoadReport(
        "b-2:x",
        START + 30,
        12.5,
        40.0,
        1e6,
        2e6,
        (TopicLoad("/ns/a", 0.1, 0.2, 1, 2, 3, 4), TopicLoad("/ns/b", 0.7, 1e9 / 3, 0, 1, 0, 9)),
    )
    data = (
        b"\n  \n"  # blank lines are not records
        + history_line(report).encode()
        + b"\n"
        + _lines({"broker_id": "b3", "timestamp": START, "zone": "z1", "topics": None})
        + _lines({"broker_id": "b4", "timestamp": START, "state": "draining"})
    )
    topics, brokers = arrow_compact.convert(data, 3, "date=2026-01-01/hour=00/w.jsonl")
    rows = brokers.to_pylist()
    assert [r["broker_id"] for r in rows] == ["b-2:x", "b3", "b4"]
    assert [r["state"] for r in rows] == ["active", "active", "draining"]
    assert rows[1]["cpu_percent"] == 0.0 and rows[1]["topic_count"] == 0
    first = rows[0]
    assert (
        first["throughput_mbps"],
        first["msg_rate"],
        first["backlog"],
        first["connections"],
    ) == (
        report.total_throughput_mbps,
        report.total_msg_rate,
        report.total_backlog,
        report.total_connections,
    )
    assert first["report_id"] == FAST_ID_BASE + (3 << 32)
    assert first["source"] == "date=2026-01-01/hour=00/w.jsonl"
    assert [(t["broker_id"], t["topic"], t["backlog"]) for t in topics.to_pylist()] == [
        ("b-2:x", "/ns/a", 4),
        ("b-2:x", "/ns/b", 9),
    ]


def test_reports_without_topics_and_empty_files_are_clean() -> None:
    topics, brokers = arrow_compact.convert(_lines({"broker_id": "b", "timestamp": 1}), 0, "x")
    assert topics.num_rows == 0 and brokers.column("topic_count").to_pylist() == [0]


def test_segment_totals_are_the_models_left_fold() -> None:
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 40, size=200)
    values = rng.random(int(lengths.sum())) * 10.0 ** rng.integers(-3, 9, size=int(lengths.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    totals = arrow_compact.segment_total(
        Segments({"v": values}, offsets), lambda items: items["v"], 0.0
    )
    for i in range(len(lengths)):
        items = [{"v": float(v)} for v in values[offsets[i] : offsets[i + 1]]]
        expected = PYTHON_OPS.total(items, lambda item: item["v"], 0.0)
        assert totals[i] == expected  # bit for bit, not approximately
    # report_totals itself runs on segments.
    fields = {
        "byte_rate": values,
        "msg_rate": values[::-1].copy(),
        "backlog": np.arange(len(values)),
        "producers": np.ones(len(values), dtype=np.int64),
        "consumers": np.full(len(values), 2),
    }
    throughput, _, backlog, connections = report_totals(Segments(fields, offsets), SEGMENT_OPS)
    assert throughput[0] == totals[0] / 1_000_000
    assert list(connections) == [3 * n for n in lengths]
    assert backlog[1] == sum(range(offsets[1], offsets[2]))


def _table(root: str, table: str, hour: Hour) -> list[tuple[Any, ...]]:
    rows = pq.read_table(f"{root}/{table}/{hour.name}").to_pylist()
    return sorted(tuple(v for k, v in r.items() if k != "report_id") for r in rows)


def test_the_fast_path_writes_what_the_spark_path_writes(
    spark: SparkSession, tmp_path: Path
) -> None:
    history = tmp_path / "history"
    generate_history(
        GeneratorSpec(brokers=3, topics=40, hours=1.5, seed=5, interval_seconds=60.0),
        history,
    )
    files = compact.history_hours(str(history))
    fast, slow = compact._convert_clean_files(spark, str(history), files, str(tmp_path / "fast"))
    assert slow == {} and len(fast) == 2
    counts = compact._compact_with_spark(spark, str(history), files, str(tmp_path / "spark"))
    # The fast path also writes each file's topic partials (the Spark path does not).
    assert all(found.pop("partials") for found in fast.values())
    assert counts == fast
    for hour in files:
        for table in ("topics", "brokers"):
            assert _table(str(tmp_path / "fast"), table, hour) == _table(
                str(tmp_path / "spark"), table, hour
            )


def test_only_the_hours_with_something_to_quarantine_take_the_spark_path(
    spark: SparkSession, tmp_path: Path
) -> None:
    clean = tmp_path / "date=2026-01-01" / "hour=00"
    dirty = tmp_path / "date=2026-01-01" / "hour=01"
    clean.mkdir(parents=True)
    dirty.mkdir(parents=True)
    (clean / "w.jsonl").write_bytes(_lines(GOOD, {**GOOD, "broker_id": "b2"}))
    later = {**GOOD, "timestamp": START + 3600}
    (dirty / "w.jsonl").write_bytes(_lines(later, {**later, "cpu_percent": 150}))
    (dirty / "v.jsonl").write_bytes(_lines({**later, "broker_id": "b2"}))
    columnar = compacted(spark, tmp_path)
    ids = {
        (r["timestamp"], r["broker_id"]): r["report_id"]
        for r in columnar.read(spark, "brokers").collect()
    }
    assert ids[(START, "b1")] >= FAST_ID_BASE and ids[(START, "b2")] >= FAST_ID_BASE
    assert ids[(START + 3600, "b1")] < FAST_ID_BASE and ids[(START + 3600, "b2")] < FAST_ID_BASE
    (bad,) = columnar.read(spark, "quarantine").collect()
    assert bad["reason"] == "cpu_percent: must be within 0-100, got 150.0"
    assert {r["topic"] for r in columnar.read(spark, "topics").collect()} == {"/ns/t"}
    assert columnar.read(spark, "topics").count() == 4  # the quarantined line's are not
