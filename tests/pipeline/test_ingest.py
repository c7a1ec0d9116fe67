"""Reading the history: every bad line is quarantined with its reason, never dropped.

Lines go through the real path: files on disk, compaction into the columnar history,
and the quarantine table it writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from ballast.load_history import history_line
from ballast.model import LoadReport, TopicLoad

from .support import START, compacted, write_history, write_lines

GOOD = {"broker_id": "b1", "timestamp": START, "cpu_percent": 10, "topics": [{"topic": "/ns/t"}]}


def _reasons(
    spark: SparkSession, root: Path, lines: list[Any]
) -> list[tuple[str | None, str | None]]:
    """(kind, reason) per line, in line order; (None, None) for a line that was kept."""
    columnar = compacted(spark, write_lines(root, lines))
    bad = {
        r["source"]: (r["kind"], r["reason"]) for r in columnar.read(spark, "quarantine").collect()
    }
    kept = {r["source"] for r in columnar.read(spark, "brokers").collect()}
    sources = [f"date=2026-01-01/hour=00/line-{i:03d}.jsonl" for i in range(len(lines))]
    assert all((s in bad) != (s in kept) for s in sources), "every line is kept or quarantined"
    return [bad.get(s, (None, None)) for s in sources]


def test_each_rule_gives_its_reason(spark: SparkSession, tmp_path: Path) -> None:
    lines: list[Any] = [
        GOOD,
        '{"broker_id":"b1","timestamp":1767225600,"topics":[{"topic":"/ns/t","msg_rate":1',
        {**GOOD, "cpu_percent": "high"},
        {**GOOD, "topics": [{"topic": "/ns/t", "producers": 2.5}]},
        {"cpu_percent": 5},
        {**GOOD, "topics": [{"topic": "/ns/t", "msg_rate": -3}]},
        {**GOOD, "cpu_percent": 150},
        {**GOOD, "state": "sleeping"},
        {**GOOD, "broker_id": 5},
        {**GOOD, "topics": [{"topic": "no-slash"}, {"msg_rate": 1}]},
        {**GOOD, "timestamp": -1},
        "[1, 2]",
        {**GOOD, "topics": {"topic": "/ns/t"}},
        {**GOOD, "memory_percent": float("nan")},
    ]
    assert _reasons(spark, tmp_path, lines) == [
        (None, None),
        ("malformed", "malformed JSON: not one complete JSON object (truncated line?)"),
        ("invalid", "cpu_percent: expected a number, got high"),
        ("invalid", "topics[0].producers: expected a non-negative integer, got 2.5"),
        ("invalid", "broker_id: missing field; timestamp: missing field"),
        ("invalid", "topics[0].msg_rate: must be a finite non-negative number, got -3.0"),
        ("invalid", "cpu_percent: must be within 0-100, got 150.0"),
        ("invalid", "state: 'sleeping' is not one of: active, draining, drained"),
        ("invalid", "broker_id: expected a string, got 5"),
        (
            "invalid",
            "topics[0].topic: invalid topic name 'no-slash' (expected /namespace/topic); "
            "topics[1].topic: missing field",
        ),
        ("invalid", "timestamp: must be a finite non-negative number, got -1.0"),
        ("malformed", "malformed JSON: not one complete JSON object (truncated line?)"),
        ("invalid", 'topics: expected a list of topic objects, got {"topic":"/ns/t"}'),
        ("invalid", "memory_percent: must be a finite non-negative number, got NaN"),
    ]


def test_the_model_agrees_on_what_is_invalid(spark: SparkSession, tmp_path: Path) -> None:
    """Every line the pipeline quarantines as invalid, LoadReport.from_dict rejects too."""
    lines = [
        {**GOOD, "cpu_percent": 101},
        {**GOOD, "disk_io_bps": -1},
        {**GOOD, "topics": [{"topic": "/ns/t", "backlog": -1}]},
        {**GOOD, "broker_id": "a/b"},
        {**GOOD, "topics": [{"topic": "/ns/t", "consumers": "3"}]},
        {"broker_id": "b1"},
    ]
    for kind, _ in _reasons(spark, tmp_path, lines):
        assert kind == "invalid"
    for line in lines:
        try:
            LoadReport.from_dict(line)
        except ValueError:
            continue
        raise AssertionError(f"the model accepts {line}")


def test_many_topic_problems_are_summarised(spark: SparkSession, tmp_path: Path) -> None:
    line = {**GOOD, "topics": [{"topic": f"/ns/t{i}", "msg_rate": -1} for i in range(8)]}
    ((kind, reason),) = _reasons(spark, tmp_path, [line])
    assert kind == "invalid"
    assert reason is not None
    assert reason.count("must be a finite non-negative number") == 5
    assert reason.endswith("; and 3 more topic problems")


def test_files_blank_lines_extra_fields_and_duplicates(spark: SparkSession, tmp_path: Path) -> None:
    r1 = LoadReport("b1", START, 10, 20, topics=(TopicLoad("/ns/a", 5.0, 100.0, 1, 1, 1, 0),))
    r2 = LoadReport("b2", START + 30, 30, 40)
    write_history(tmp_path, [r1, (r2, "draining")])
    hour = tmp_path / "date=2026-01-01" / "hour=00"
    extra = json.loads(history_line(r1))
    extra["timestamp"] = START + 60
    extra["zone"] = {"rack": "r1"}  # unknown fields are tolerated
    other = hour / "other.jsonl"
    other.write_text(
        "\n"  # blank lines are not records
        + history_line(r1)  # the same report again (a sink retry)
        + "\n   \n"
        + json.dumps(extra)
        + "\n"
        + history_line(r2)[:40]  # the crash-truncated last line
    )
    columnar = compacted(spark, tmp_path)
    kept = columnar.read(spark, "brokers").select("source", "broker_id", "timestamp", "state")
    assert sorted((r["broker_id"], r["timestamp"], r["state"]) for r in kept.collect()) == [
        ("b1", START, "active"),
        ("b1", START + 60, "active"),
        ("b2", START + 30, "draining"),
    ]
    quarantine = columnar.read(spark, "quarantine").collect()
    got = sorted((q["kind"], q["source"], q["broker_id"]) for q in quarantine)
    # Identical copies tie on the content hash; the source breaks the tie (other < test).
    assert got == [
        ("duplicate", "date=2026-01-01/hour=00/test.jsonl", "b1"),
        ("malformed", "date=2026-01-01/hour=00/other.jsonl", None),
    ]
    dup = next(q for q in quarantine if q["kind"] == "duplicate")
    assert (
        dup["reason"] == f"duplicate: another report of broker b1 at timestamp {START:.3f} was kept"
    )
    assert LoadReport.from_json(dup["raw"]) == r1
    malformed = next(q for q in quarantine if q["kind"] == "malformed")
    assert malformed["raw"] == history_line(r2)[:40]
    # The kept copy's topic rows are there once.
    topics = columnar.read(spark, "topics").collect()
    assert [(t["broker_id"], t["timestamp"], t["topic"]) for t in topics] == [
        ("b1", START, "/ns/a"),
        ("b1", START + 60, "/ns/a"),
    ]
