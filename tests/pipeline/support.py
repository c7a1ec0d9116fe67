"""Helpers for the pipeline tests: hand-made load reports as history files or DataFrames."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from ballast.model import LoadReport, TopicLoad
from ballast.pipeline import ingest, transforms
from ballast.pipeline.history import HistoryWriter, history_line

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z, a window boundary for every window size


def report(
    broker: str,
    timestamp: float,
    cpu: float = 0.0,
    mem: float = 0.0,
    disk: float = 0.0,
    net: float = 0.0,
    topics: Sequence[TopicLoad] = (),
) -> LoadReport:
    return LoadReport(broker, timestamp, cpu, mem, disk, net, tuple(topics))


def write_history(root: Path, reports: Sequence[LoadReport | tuple[LoadReport, str]]) -> Path:
    """Write reports (optionally with a state) through the real sink writer."""
    with HistoryWriter(root, writer="test") as writer:
        for item in reports:
            if isinstance(item, tuple):
                writer.append(item[0], item[1])
            else:
                writer.append(item)
    return root


def lines_frame(spark: SparkSession, lines: Sequence[str | dict[str, Any]]) -> DataFrame:
    """Lines as `read_history_lines` would give them (source = position)."""
    rows = [
        (f"line-{i}", line if isinstance(line, str) else json.dumps(line))
        for i, line in enumerate(lines)
    ]
    return spark.createDataFrame(rows, "source string, value string")


def checked(spark: SparkSession, lines: Sequence[str | dict[str, Any]]) -> DataFrame:
    return (
        lines_frame(spark, lines)
        .transform(ingest.with_parsed_reports)
        .transform(ingest.checked_records)
    )


def reports_frame(
    spark: SparkSession, reports: Sequence[LoadReport | tuple[LoadReport, str]]
) -> DataFrame:
    """Valid, deduplicated reports with defaults, from LoadReports (through JSON)."""
    lines = [
        history_line(*item) if isinstance(item, tuple) else history_line(item) for item in reports
    ]
    valid = ingest.valid_records(checked(spark, lines))
    return ingest.deduplicated(valid).transform(transforms.with_report_defaults)
