"""Helpers for the pipeline tests: hand-made load reports as history files, compacted
tables or DataFrames."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from ballast.load_history import HistoryWriter
from ballast.model import BrokerMode, LoadReport, TopicLoad
from ballast.pipeline import compact, transforms
from ballast.pipeline.schemas import BROKER_TABLE_SCHEMA, TOPIC_TABLE_SCHEMA

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z, a window boundary for every window size
HOUR0 = compact.Hour("2026-01-01", "00")


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


def write_lines(root: Path, lines: Sequence[str | dict[str, Any]]) -> Path:
    """One file per line (`line-007.jsonl`), in hour 00 of 2026-01-01, so each line's
    `source` tells which one it was."""
    hour = root / HOUR0.name
    hour.mkdir(parents=True, exist_ok=True)
    for i, line in enumerate(lines):
        text = line if isinstance(line, str) else json.dumps(line)
        (hour / f"line-{i:03d}.jsonl").write_text(text + "\n")
    return root


def compacted(spark: SparkSession, root: Path) -> compact.Columnar:
    """Compact every hour of the history at `root` (all closed: it is in the past)."""
    _, columnar = compact.compact(spark, str(root), str(root / "_scratch"))
    return columnar


def _state(item: LoadReport | tuple[LoadReport, str]) -> tuple[LoadReport, str]:
    return item if isinstance(item, tuple) else (item, BrokerMode.ACTIVE.value)


def broker_table(
    spark: SparkSession, reports: Sequence[LoadReport | tuple[LoadReport, str]]
) -> DataFrame:
    """The broker table compaction would write for these (valid, distinct) reports,
    built with the model: transforms tests do not pay for a compaction."""
    rows = []
    for i, item in enumerate(reports):
        r, state = _state(item)
        rows.append(
            (
                i,
                "test",
                r.broker_id,
                float(r.timestamp),
                state,
                float(r.cpu_percent),
                float(r.memory_percent),
                float(r.disk_io_bps),
                float(r.network_io_bps),
                r.topic_count,
                float(r.total_throughput_mbps),
                float(r.total_msg_rate),
                r.total_backlog,
                r.total_connections,
            )
        )
    return spark.createDataFrame(rows, BROKER_TABLE_SCHEMA)


def topic_table(
    spark: SparkSession, reports: Sequence[LoadReport | tuple[LoadReport, str]]
) -> DataFrame:
    """The topic table compaction would write for these reports (see `broker_table`)."""
    rows = [
        (
            i,
            r.broker_id,
            float(r.timestamp),
            t.topic,
            float(t.msg_rate),
            float(t.byte_rate),
            t.producers,
            t.consumers,
            t.subscriptions,
            t.backlog,
        )
        for i, item in enumerate(reports)
        for r in [_state(item)[0]]
        for t in r.topics
    ]
    return spark.createDataFrame(rows, TOPIC_TABLE_SCHEMA)


def broker_rows(
    spark: SparkSession, reports: Sequence[LoadReport | tuple[LoadReport, str]]
) -> DataFrame:
    return broker_table(spark, reports).transform(transforms.broker_rows)


def topic_rows(
    spark: SparkSession, reports: Sequence[LoadReport | tuple[LoadReport, str]]
) -> DataFrame:
    return topic_table(spark, reports).transform(transforms.topic_rows)
