"""The columnar history: incremental, idempotent, atomic per hour, closed hours only,
and `analyze --from/--to` reads only the hours asked for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from ballast.pipeline import compact
from ballast.pipeline.compact import Hour
from ballast.pipeline.generate import GeneratorSpec, generate_history
from ballast.pipeline.job import AnalyzeOptions, run_analysis

from .support import START

H0, H1, H2 = (Hour("2026-01-01", f"{h:02d}") for h in range(3))
AFTER = START + 4 * 3600  # every hour of the history is closed


@pytest.fixture()
def history(tmp_path: Path) -> Path:
    root = tmp_path / "h"
    generate_history(
        GeneratorSpec(brokers=3, topics=8, hours=3, seed=4, interval_seconds=60), str(root)
    )
    return root


def _run(
    spark: SparkSession, root: Path, **kwargs: object
) -> tuple[compact.CompactionResult, compact.Columnar]:
    return compact.compact(spark, str(root), str(root.parent / "scratch"), **kwargs)  # type: ignore[arg-type]


def test_incremental_idempotent_and_atomic(
    spark: SparkSession, history: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, columnar = _run(spark, history, now=AFTER)
    assert [m.hour for m in first.compacted] == [H0, H1, H2]
    assert first.topic_rows == columnar.read(spark, "topics").count() > 0
    markers = history / "_columnar" / "_committed"
    stamps = {p.name: p.stat().st_mtime_ns for p in markers.iterdir()}

    again, _ = _run(spark, history, now=AFTER)  # a re-run does nothing
    assert again.compacted == () and again.unchanged == 3
    assert {p.name: p.stat().st_mtime_ns for p in markers.iterdir()} == stamps

    # A late line in hour 1 recompacts hour 1 only.
    late = history / H1.name / "generator.jsonl"
    lines = late.read_text().splitlines()
    late.write_text("\n".join([*lines, lines[0][:30]]) + "\n")
    third, columnar = _run(spark, history, now=AFTER)
    assert [m.hour for m in third.compacted] == [H1] and third.quarantined == {"malformed": 1}
    assert columnar.read(spark, "quarantine").count() == 1

    # A crash after hour 0's commit, before hour 2's marker: hour 2 is not visible...
    # (each gets a second writer's file repeating one of its reports: a duplicate)
    for hour in (H0, H2):
        own = (history / hour.name / "generator.jsonl").read_text().splitlines()[0]
        (history / hour.name / "extra.jsonl").write_text(own + "\n")
    real = compact._write_marker

    def crash(root: str, marker: compact.HourMarker) -> None:
        if marker.hour == H2:
            raise RuntimeError("crash")
        real(root, marker)

    monkeypatch.setattr(compact, "_write_marker", crash)
    with pytest.raises(RuntimeError):
        _run(spark, history, now=AFTER)
    monkeypatch.setattr(compact, "_write_marker", real)
    committed = compact.read_markers(str(history / "_columnar"))
    assert set(committed) == {H0, H1}  # hour 2 lost its old marker: never half visible
    assert "extra.jsonl" in " ".join(committed[H0].files)
    # ...and the next run redoes it (and only it).
    fourth, columnar = _run(spark, history, now=AFTER)
    assert [m.hour for m in fourth.compacted] == [H2]
    assert not (history / "_columnar" / "_tmp").exists() or not os.listdir(
        history / "_columnar" / "_tmp"
    )
    assert columnar.read(spark, "brokers").count() == first.reports
    kinds = sorted(r["kind"] for r in columnar.read(spark, "quarantine").collect())
    assert kinds == ["duplicate", "duplicate", "malformed"]


def test_open_hours_are_read_but_never_committed(spark: SparkSession, history: Path) -> None:
    now = START + 2.5 * 3600  # hour 2 is still being written
    result, columnar = _run(spark, history, now=now, include_open=True)
    assert [m.hour for m in result.compacted] == [H0, H1] and result.open_hours == (H2,)
    assert set(columnar.hours) == {H0, H1, H2}
    assert set(compact.read_markers(str(history / "_columnar"))) == {H0, H1}
    assert not (history / "_columnar" / "topics" / H2.name).exists()
    assert columnar.read(spark, "topics", [H2]).count() > 0  # from the scratch copy
    compact.remove_work(columnar)
    plain, _ = _run(spark, history, now=now)  # without include_open: left as JSON
    assert plain.compacted == () and plain.open_hours == (H2,)


def test_from_to_reads_only_those_hours(spark: SparkSession, history: Path, tmp_path: Path) -> None:
    result = run_analysis(
        spark,
        AnalyzeOptions(
            history=str(history),
            out=str(tmp_path / "o"),
            start=START + 3600,
            end=START + 7200,
            now=AFTER,
        ),
    )
    assert result.windows == 12  # 5-minute windows of hour 1 only
    assert result.start >= START + 3600 and result.end < START + 7200
    # Hours 0 and 2 were not needed: not compacted either.
    assert result.compacted_hours == 1
    assert set(compact.read_markers(str(history / "_columnar"))) == {H1}
