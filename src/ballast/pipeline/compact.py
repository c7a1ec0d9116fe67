"""The columnar history: each closed hour of JSON lines, parsed once into Parquet.

`ballast history compact` (and `ballast analyze`, for the hours not compacted yet) turns
the sink's JSON lines into tables under `{history}/_columnar/`, partitioned exactly like
the JSON files:

    topics/date=YYYY-MM-DD/hour=HH/*.parquet      one row per (report, topic)
    brokers/date=YYYY-MM-DD/hour=HH/*.parquet     one row per report, with its totals
    quarantine/date=YYYY-MM-DD/hour=HH/*.parquet  malformed, invalid and duplicate lines
    topic_partials/date=…/hour=…/*.parquet        per file, 5-minute bucket and topic: the
                                                  topic windows' partial aggregates (fast
                                                  path only; `partials.py`)
    _committed/date=YYYY-MM-DD_hour=HH.json       the hour's marker (see below)

- **Incremental and idempotent.** An hour is compacted when it has no marker, or when its
  files changed since (the marker lists each file's size: a late append or a new writer's
  file recompacts that hour, and only that hour). A re-run with nothing new does nothing.
- **Atomic per hour.** Every compaction writes into `_tmp/<run>/` first; then, hour by
  hour, the old marker (if any) is removed, the partitions are renamed into place and the
  marker is written last (write-then-rename). Readers only read hours that have a marker,
  so a crash half-way leaves no partial hour visible; the next run removes partition
  directories without a marker and `_tmp/` leftovers, and redoes those hours.
- **Closed hours only.** An hour is closed `grace` seconds (default 5 minutes) after it
  ends; the sink may still append late reports before that. `analyze` parses the open
  hours into its scratch space on every run, reads them with the committed ones, and never
  commits them: they are compacted once closed.
- **Quarantine at this step.** Bad lines get the same kinds and reasons as always
  (`ingest.py`); duplicates (same broker and timestamp; the sink files a report under its
  timestamp's hour, so copies are always in the same hour) are found per hour.
- **JSON is parsed once, by the fastest path that is exact.** Clean files (every line
  one valid report: nearly all of them) are converted by Arrow's JSON reader with
  vectorised checks, one Spark task per file (`arrow_compact.py`). An hour with anything
  to quarantine — a bad line, a duplicate — is compacted whole by the Spark path instead:
  one Spark job reads the JSON and writes flat staging rows, a second, columnar pass
  removes duplicates and writes the final tables. Both write the same rows (tested).
  Executors read the history's local files: on a multi-host cluster the history must be
  on a file system every worker mounts, and `ballast` installed on every worker.

One compaction at a time per history (a lock file, `_columnar/.lock`). A history under
`s3://` (any fsspec URL) is compacted in a local mirror; new partitions are uploaded
first and their markers last, so remote readers see whole hours too.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ballast.pipeline import arrow_compact, ingest, rules, storage
from ballast.pipeline.schemas import (
    BROKER_TABLE_SCHEMA,
    COLUMNAR_SCHEMAS,
    QUARANTINE_SCHEMA,
    TOPIC_LOAD_SCHEMA,
    TOPIC_TABLE_SCHEMA,
)

COLUMNAR_DIR = "_columnar"
TABLES = ("topics", "brokers", "quarantine", "topic_partials")
MARKERS_DIR = "_committed"
TMP_DIR = "_tmp"
DEFAULT_GRACE_SECONDS = 300.0
# Concurrent Parquet writers per task: enough that a task holding many hours' rows writes
# them without first sorting every row by hour.
MAX_CONCURRENT_WRITERS = "128"

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class Hour:
    """One hour of history (UTC), named like its directories: `date=…/hour=…`."""

    date: str  # YYYY-MM-DD
    hour: str  # HH

    @property
    def name(self) -> str:
        return f"date={self.date}/hour={self.hour}"

    @property
    def marker_name(self) -> str:
        return f"date={self.date}_hour={self.hour}.json"

    @property
    def start(self) -> float:
        when = datetime.strptime(f"{self.date} {self.hour}", "%Y-%m-%d %H").replace(tzinfo=UTC)
        return when.timestamp()

    @property
    def end(self) -> float:
        return self.start + 3600.0

    @classmethod
    def of(cls, timestamp: float) -> Hour:
        when = datetime.fromtimestamp(timestamp, tz=UTC)
        return cls(f"{when:%Y-%m-%d}", f"{when:%H}")

    @classmethod
    def from_source(cls, source: str) -> Hour:
        """The hour of a history file's relative path `date=…/hour=…/name.jsonl`."""
        date_part, hour_part = source.split("/")[:2]
        return cls(date_part.removeprefix("date="), hour_part.removeprefix("hour="))

    def overlaps(self, start: float | None, end: float | None) -> bool:
        """Whether this hour holds any instant of [start, end)."""
        return (start is None or self.end > start) and (end is None or self.start < end)


@dataclass(frozen=True)
class HourMarker:
    """What one compacted hour holds, and which files (by size) it was made from."""

    hour: Hour
    files: Mapping[str, int]
    reports: int
    topic_rows: int
    quarantined: Mapping[str, int] = field(default_factory=dict)
    compacted_at: float = 0.0
    # Whether the hour's topic partials (`partials.py`) were written: every file took
    # the fast path with its reports in the hour. Hours compacted before partials
    # existed have none: the analysis reads their topic rows.
    partials: bool = False

    def has(self, table: str) -> bool:
        rows = {
            "topics": self.topic_rows,
            "brokers": self.reports,
            "quarantine": sum(self.quarantined.values()),
            "topic_partials": self.topic_rows if self.partials else 0,
        }
        return rows[table] > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "date": self.hour.date,
            "hour": self.hour.hour,
            "files": dict(sorted(self.files.items())),
            "reports": self.reports,
            "topic_rows": self.topic_rows,
            "quarantined": dict(sorted(self.quarantined.items())),
            "compacted_at": self.compacted_at,
            "partials": self.partials,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HourMarker:
        return cls(
            hour=Hour(str(data["date"]), str(data["hour"])),
            files={str(k): int(v) for k, v in data["files"].items()},
            reports=int(data["reports"]),
            topic_rows=int(data["topic_rows"]),
            quarantined={str(k): int(v) for k, v in data.get("quarantined", {}).items()},
            compacted_at=float(data.get("compacted_at", 0.0)),
            partials=bool(data.get("partials", False)),
        )


@dataclass(frozen=True)
class Columnar:
    """Hours an analysis reads, and where each table's partition of each hour is."""

    hours: Mapping[Hour, HourMarker]
    locations: Mapping[Hour, str]  # hour -> the table root holding its partitions

    def paths(self, table: str, hours: Iterable[Hour] | None = None) -> list[str]:
        """Partition directories of `table` for `hours` (default: all), sorted."""
        chosen = sorted(self.hours if hours is None else hours)
        return [
            os.path.join(self.locations[h], table, h.name)
            for h in chosen
            if h in self.hours and self.hours[h].has(table)
        ]

    def read(
        self, spark: SparkSession, table: str, hours: Iterable[Hour] | None = None
    ) -> DataFrame:
        """The table's rows for `hours`, with its explicit schema (partition pruning is
        the choice of paths: other hours are never listed or opened)."""
        schema = COLUMNAR_SCHEMAS[table]
        paths = self.paths(table, hours)
        if not paths:
            return spark.createDataFrame([], schema)
        return spark.read.schema(schema).parquet(*paths)

    @property
    def files(self) -> int:
        return sum(len(m.files) for m in self.hours.values())


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction did (the CLI prints it)."""

    table: str
    compacted: tuple[HourMarker, ...]
    unchanged: int
    open_hours: tuple[Hour, ...]
    seconds: float

    @property
    def reports(self) -> int:
        return sum(m.reports for m in self.compacted)

    @property
    def topic_rows(self) -> int:
        return sum(m.topic_rows for m in self.compacted)

    @property
    def quarantined(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for marker in self.compacted:
            for kind, count in marker.quarantined.items():
                total[kind] = total.get(kind, 0) + count
        return total


# --- the local table --------------------------------------------------------------------


def read_markers(table_root: str) -> dict[Hour, HourMarker]:
    """Every committed hour's marker under a local table root."""
    directory = os.path.join(table_root, MARKERS_DIR)
    if not os.path.isdir(directory):
        return {}
    markers = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(directory, name), encoding="utf-8") as handle:
            marker = HourMarker.from_dict(json.load(handle))
        markers[marker.hour] = marker
    return markers


def _write_marker(table_root: str, marker: HourMarker) -> None:
    directory = os.path.join(table_root, MARKERS_DIR)
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, marker.hour.marker_name)
    temporary = f"{target}.{uuid.uuid4().hex}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(marker.to_dict(), handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, target)


def _remove_marker(table_root: str, hour: Hour) -> None:
    path = os.path.join(table_root, MARKERS_DIR, hour.marker_name)
    if os.path.exists(path):
        os.remove(path)


@contextmanager
def _locked(table_root: str) -> Iterator[None]:
    os.makedirs(table_root, exist_ok=True)
    with open(os.path.join(table_root, ".lock"), "a+", encoding="utf-8") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove_uncommitted(table_root: str, markers: Mapping[Hour, HourMarker]) -> None:
    """Remove what a crashed compaction left: `_tmp/` and partitions without a marker."""
    shutil.rmtree(os.path.join(table_root, TMP_DIR), ignore_errors=True)
    for table in TABLES:
        base = os.path.join(table_root, table)
        if not os.path.isdir(base):
            continue
        for date_dir in os.listdir(base):
            for hour_dir in os.listdir(os.path.join(base, date_dir)):
                try:
                    hour = Hour.from_source(f"{date_dir}/{hour_dir}")
                except ValueError:
                    continue
                if hour not in markers:
                    shutil.rmtree(os.path.join(base, date_dir, hour_dir), ignore_errors=True)


def _commit(table_root: str, work: str, marker: HourMarker) -> None:
    """Make one hour visible: old marker out, partitions renamed in, marker written."""
    _remove_marker(table_root, marker.hour)
    for table in TABLES:
        target = os.path.join(table_root, table, marker.hour.name)
        shutil.rmtree(target, ignore_errors=True)
        source = os.path.join(work, table, marker.hour.name)
        if os.path.isdir(source):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.rename(source, target)
    _write_marker(table_root, marker)


# --- the Spark part ---------------------------------------------------------------------


def _record_json(reports: DataFrame, topics: DataFrame) -> DataFrame:
    """`raw` for the given report rows: the record re-serialised from the staged rows
    (topics in their original order), as `LoadReport.from_json` reads it."""
    ids = reports.select("report_id")
    entries = (
        topics.join(F.broadcast(ids), on="report_id", how="inner")
        .groupBy("report_id")
        .agg(
            F.array_sort(
                F.collect_list(F.struct("pos", *(F.col(f.name) for f in TOPIC_LOAD_SCHEMA.fields)))
            ).alias("entries")
        )
    )
    record = F.to_json(
        F.struct(
            "broker_id",
            "timestamp",
            "cpu_percent",
            "memory_percent",
            "disk_io_bps",
            "network_io_bps",
            "state",
            F.transform(
                F.coalesce(F.col("entries"), F.array()),
                lambda e: F.struct(*(e[f.name].alias(f.name) for f in TOPIC_LOAD_SCHEMA.fields)),
            ).alias("topics"),
        )
    )
    return reports.join(entries, on="report_id", how="left").withColumn(
        "raw", F.substring(record, 1, ingest.RAW_LIMIT)
    )


def _quarantine_rows(frame: DataFrame, kind: str, reason: Any) -> DataFrame:
    return frame.select(
        "date",
        "hour",
        "source",
        F.lit(kind).alias("kind"),
        reason.alias("reason"),
        "broker_id",
        "timestamp",
        "raw",
    )


def _write_tables(
    spark: SparkSession, stage_dir: str, stage_schema: T.StructType, work: str
) -> None:
    """The second, columnar pass: lines with a bad topic and duplicate copies go to the
    quarantine; the rest become the final tables. Both cases are rare, so the usual run
    only filters on a mostly-null column and copies the staged rows."""
    stage = spark.read.schema(stage_schema).parquet(stage_dir)
    topics = stage.filter(F.col("part") == "topics")
    reports = stage.filter(F.col("part") == "brokers").select(
        "date", "hour", *ingest.REPORT_STAGE_COLUMNS
    )
    quarantine = stage.filter(F.col("part") == "quarantine").select(
        "date", "hour", *(f.name for f in QUARANTINE_SCHEMA.fields)
    )
    dropped: list[DataFrame] = []
    persisted: list[DataFrame] = []

    # Names are checked once per distinct name, numbers on every row (`suspect`).
    names = topics.select("topic").distinct().filter(~rules.is_topic_name(F.col("topic")))
    bad_names = [row["topic"] for row in names.collect()]
    flagged = F.col("suspect")
    if bad_names:
        flagged = flagged | F.col("topic").isin(*bad_names)
    problems = (
        topics.filter(flagged)
        .select("report_id", "pos", ingest.topic_problem(F.col("pos") - 1).alias("problem"))
        .filter(F.col("problem").isNotNull())
        .persist()
    )
    persisted.append(problems)
    if problems.limit(1).count() > 0:
        reasons = problems.groupBy("report_id").agg(
            ingest.limited_reasons(
                F.transform(
                    F.array_sort(F.collect_list(F.struct("pos", "problem"))),
                    lambda e: e["problem"],
                )
            ).alias("topic_reason")
        )
        invalid = reports.join(F.broadcast(reasons), on="report_id", how="inner").persist()
        persisted.append(invalid)
        quarantine = quarantine.unionByName(
            _quarantine_rows(_record_json(invalid, topics), "invalid", F.col("topic_reason"))
        )
        dropped.append(invalid.select("report_id"))
        reports = reports.join(F.broadcast(reasons), on="report_id", how="left_anti")

    # Duplicates: only keys seen more than once are ranked (on their content's hash).
    keys = ["date", "hour", "broker_id", "timestamp"]
    repeated = (
        reports.groupBy(*keys).agg(F.count(F.lit(1)).alias("copies")).filter(F.col("copies") > 1)
    )
    kept = reports
    candidates = reports.join(F.broadcast(repeated), on=keys, how="inner").drop("copies")
    if candidates.limit(1).count() > 0:
        ranked = (
            _record_json(candidates, topics)
            .withColumn("content_hash", F.xxhash64("raw"))
            .transform(ingest.duplicate_ranks)
            .persist()
        )
        persisted.append(ranked)
        copies = ranked.filter(F.col("copy") > 1)
        quarantine = quarantine.unionByName(
            _quarantine_rows(copies, "duplicate", ingest.duplicate_reason())
        )
        dropped.append(copies.select("report_id"))
        kept = reports.join(
            F.broadcast(copies.select("report_id")), on="report_id", how="left_anti"
        )

    if dropped:
        ids = dropped[0]
        for more in dropped[1:]:
            ids = ids.unionByName(more)
        topics = topics.join(F.broadcast(ids), on="report_id", how="left_anti")
    totals = {"msg_rate": F.col("total_msg_rate"), "backlog": F.col("total_backlog")}
    frames = {
        "topics": topics.select(
            "date", "hour", *(F.col(f.name) for f in TOPIC_TABLE_SCHEMA.fields)
        ),
        "brokers": kept.select(
            "date",
            "hour",
            *(totals.get(f.name, F.col(f.name)).alias(f.name) for f in BROKER_TABLE_SCHEMA.fields),
        ),
        "quarantine": quarantine,
    }
    for table, frame in frames.items():
        frame.write.mode("overwrite").partitionBy("date", "hour").parquet(os.path.join(work, table))
    for frame in persisted:
        frame.unpersist()


def _counts(spark: SparkSession, work: str) -> dict[Hour, dict[str, Any]]:
    """Rows per hour of each table written under `work` (one Spark job for all three)."""
    partitions = [T.StructField("date", T.StringType()), T.StructField("hour", T.StringType())]
    parts = []
    for table in TABLES:
        path = os.path.join(work, table)
        if os.path.isdir(path):
            rows = spark.read.schema(T.StructType([*COLUMNAR_SCHEMAS[table].fields, *partitions]))
            kind = F.col("kind") if table == "quarantine" else F.lit(None).cast("string")
            parts.append(
                rows.parquet(path)
                .groupBy("date", "hour", kind.alias("kind"))
                .agg(F.count(F.lit(1)).alias("rows"))
                .withColumn("table", F.lit(table))
            )
    counts: dict[Hour, dict[str, Any]] = {}
    if not parts:
        return counts
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    for row in union.collect():
        entry = counts.setdefault(
            Hour(row["date"], row["hour"]), {"topics": 0, "brokers": 0, "quarantine": {}}
        )
        if row["table"] == "quarantine":
            entry["quarantine"][row["kind"]] = int(row["rows"])
        else:
            entry[row["table"]] = int(row["rows"])
    return counts


def _compact_with_spark(
    spark: SparkSession, history_root: str, files: Mapping[Hour, Mapping[str, int]], work: str
) -> dict[Hour, dict[str, Any]]:
    """The Spark path: the given hours' files into `work/{table}/date=…/hour=…`; returns
    each hour's row counts."""
    paths = [
        os.path.join(history_root, name) for hour in sorted(files) for name in sorted(files[hour])
    ]
    previous = spark.conf.get("spark.sql.maxConcurrentOutputFileWriters", "0") or "0"
    spark.conf.set("spark.sql.maxConcurrentOutputFileWriters", MAX_CONCURRENT_WRITERS)
    try:
        staged = (
            ingest.read_history(spark, paths)
            .transform(ingest.checked_records)
            .transform(ingest.staged_rows)
        )
        stage_dir = os.path.join(work, "_stage")
        staged.write.mode("overwrite").partitionBy("part", "date", "hour").parquet(stage_dir)
        _write_tables(spark, stage_dir, staged.schema, work)
    finally:
        spark.conf.set("spark.sql.maxConcurrentOutputFileWriters", previous)
    shutil.rmtree(os.path.join(work, "_stage"), ignore_errors=True)
    return _counts(spark, work)


def _convert_clean_files(
    spark: SparkSession, history_root: str, files: Mapping[Hour, Mapping[str, int]], work: str
) -> tuple[dict[Hour, dict[str, Any]], dict[Hour, str]]:
    """The fast path (`arrow_compact`), one Spark task per file. Returns the row counts
    of the hours it converted, and for every other hour why it must take the Spark path:
    a file that is not clean, or two reports of one broker with the same timestamp."""
    tasks = [
        arrow_compact.FileTask(
            index=index,
            path=os.path.join(history_root, name),
            source=name,
            topics_dir=os.path.join(work, "topics", hour.name),
            brokers_dir=os.path.join(work, "brokers", hour.name),
            partials_dir=os.path.join(work, "topic_partials", hour.name),
            hour_start=hour.start,
            hour_end=hour.end,
        )
        for index, (hour, name) in enumerate(
            (hour, name) for hour in sorted(files) for name in sorted(files[hour])
        )
    ]
    results = (
        spark.sparkContext.parallelize(tasks, len(tasks)).map(arrow_compact.convert_file).collect()
    )
    by_hour: dict[Hour, list[arrow_compact.FileResult]] = {}
    for result in results:
        by_hour.setdefault(Hour.from_source(result.source), []).append(result)
    counts: dict[Hour, dict[str, Any]] = {}
    slow: dict[Hour, str] = {}
    for hour, converted in by_hour.items():
        unclean = [r for r in converted if not r.clean]
        keys = [key for r in converted for key in r.keys]
        if unclean:
            slow[hour] = f"{unclean[0].source}: {unclean[0].why}"
        elif len(set(keys)) != len(keys):
            slow[hour] = "two reports of one broker with the same timestamp"
        else:
            counts[hour] = {
                "topics": sum(r.topic_rows for r in converted),
                "brokers": sum(r.reports for r in converted),
                "quarantine": {},
                "partials": all(r.partials for r in converted),
            }
            if not counts[hour]["partials"]:
                # Some of the hour's partials only: none are read, so none are kept.
                shutil.rmtree(os.path.join(work, "topic_partials", hour.name), ignore_errors=True)
    for hour in slow:
        for table in ("topics", "brokers", "topic_partials"):
            shutil.rmtree(os.path.join(work, table, hour.name), ignore_errors=True)
    return counts, slow


def compact_files(
    spark: SparkSession, history_root: str, files: Mapping[Hour, Mapping[str, int]], work: str
) -> dict[Hour, HourMarker]:
    """Compact the given hours' files (paths relative to `history_root`, local) into
    `work/{topics,brokers,quarantine}/date=…/hour=…`; return each hour's marker (nothing
    is committed here).

    Clean hours take the fast path; an hour with anything to quarantine is compacted
    again, whole, by the Spark path, which names every problem."""
    files = {hour: hour_files for hour, hour_files in files.items() if hour_files}
    if not files:
        return {}
    now = time.time()
    counts, slow = _convert_clean_files(spark, history_root, files, work)
    if slow:
        for hour, why in sorted(slow.items()):
            log.info("hour %s takes the Spark path (%s)", hour.name, why)
        spark_work = os.path.join(work, "_spark")
        counts.update(
            _compact_with_spark(spark, history_root, {h: files[h] for h in slow}, spark_work)
        )
        for hour in slow:
            for table in TABLES:
                source = os.path.join(spark_work, table, hour.name)
                if os.path.isdir(source):
                    os.makedirs(
                        os.path.dirname(os.path.join(work, table, hour.name)), exist_ok=True
                    )
                    os.rename(source, os.path.join(work, table, hour.name))
        shutil.rmtree(spark_work, ignore_errors=True)
    markers = {}
    for hour, hour_files in files.items():
        found = counts.get(hour, {"topics": 0, "brokers": 0, "quarantine": {}})
        markers[hour] = HourMarker(
            hour=hour,
            files=dict(hour_files),
            reports=found["brokers"],
            topic_rows=found["topics"],
            quarantined=found["quarantine"],
            compacted_at=now,
            partials=found.get("partials", False),
        )
    return markers


# --- listing and planning ---------------------------------------------------------------


def history_hours(
    root: str, options: Mapping[str, Any] | None = None
) -> dict[Hour, dict[str, int]]:
    """The history's files per hour: relative path -> size in bytes."""
    hours: dict[Hour, dict[str, int]] = {}
    for relative, size in storage.history_file_sizes(root, options).items():
        hours.setdefault(Hour.from_source(relative), {})[relative] = size
    return hours


@dataclass(frozen=True)
class _Plan:
    pending: dict[Hour, dict[str, int]]  # closed, to compact and commit
    open: dict[Hour, dict[str, int]]  # still being written: parse, never commit
    unchanged: dict[Hour, HourMarker]  # committed and current


def _plan(
    files: Mapping[Hour, dict[str, int]],
    markers: Mapping[Hour, HourMarker],
    now: float,
    grace: float,
    start: float | None,
    end: float | None,
) -> _Plan:
    pending, open_, unchanged = {}, {}, {}
    for hour in sorted(set(files) | set(markers)):
        if not hour.overlaps(start, end):
            continue
        current = files.get(hour, {})
        marker = markers.get(hour)
        if hour.end + grace > now:
            if current:
                open_[hour] = current
        elif marker is not None and dict(marker.files) == current:
            unchanged[hour] = marker
        elif current:
            pending[hour] = current
        elif marker is not None:
            # Every file of a compacted hour is gone: keep what was compacted.
            unchanged[hour] = marker
    return _Plan(pending, open_, unchanged)


# --- the whole step ---------------------------------------------------------------------


def compact(
    spark: SparkSession,
    history: str,
    scratch: str,
    *,
    now: float | None = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    start: float | None = None,
    end: float | None = None,
    include_open: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[CompactionResult, Columnar]:
    """Compact the closed hours of `history` in [start, end) that need it, and return
    what an analysis of that range reads.

    With `include_open`, hours still being written are parsed into `scratch` too and
    returned for reading, but never committed. `scratch` is a local directory the caller
    removes afterwards. Raises `FileNotFoundError` when `history` does not exist.
    """
    started = time.perf_counter()
    now = time.time() if now is None else now
    options = storage_options or {}
    remote = storage.is_remote(history)
    if remote:
        local_root = os.path.join(scratch, "history")
        table_root = os.path.join(local_root, COLUMNAR_DIR)
        remote_table = f"{history.rstrip('/')}/{COLUMNAR_DIR}"
        storage.download_tree(
            f"{remote_table}/{MARKERS_DIR}", os.path.join(table_root, MARKERS_DIR), options
        )
    else:
        local_root = storage.local_path(history)
        if not os.path.isdir(local_root):
            raise FileNotFoundError(history)
        table_root = os.path.join(local_root, COLUMNAR_DIR)
    files = history_hours(history, options)
    with _locked(table_root):
        markers = read_markers(table_root)
        if not remote:
            _remove_uncommitted(table_root, markers)
        plan = _plan(files, markers, now, grace_seconds, start, end)
        todo = {**plan.pending, **(plan.open if include_open else {})}
        if remote and todo:
            if progress is not None:
                progress("stage")
            storage.download_files(
                history, [name for hour in todo.values() for name in hour], local_root, options
            )
        work = os.path.join(table_root, TMP_DIR, uuid.uuid4().hex)
        if progress is not None and todo:
            progress("compact")
        built = compact_files(spark, local_root, todo, work)
        committed = []
        for hour in sorted(plan.pending):
            _commit(table_root, work, built[hour])
            committed.append(built[hour])
        if not (include_open and plan.open):
            shutil.rmtree(work, ignore_errors=True)
        if remote:
            for marker in committed:
                for table in TABLES:
                    partition = os.path.join(table_root, table, marker.hour.name)
                    if os.path.isdir(partition):
                        storage.replace_tree(
                            partition, f"{remote_table}/{table}/{marker.hour.name}", options
                        )
                storage.upload_file(
                    os.path.join(table_root, MARKERS_DIR, marker.hour.marker_name),
                    f"{remote_table}/{MARKERS_DIR}/{marker.hour.marker_name}",
                    options,
                )
            # The analysis reads the committed hours it does not hold yet.
            for hour in plan.unchanged:
                for table in TABLES:
                    if plan.unchanged[hour].has(table):
                        storage.download_tree(
                            f"{remote_table}/{table}/{hour.name}",
                            os.path.join(table_root, table, hour.name),
                            options,
                        )
    hours: dict[Hour, HourMarker] = {**plan.unchanged, **{m.hour: m for m in committed}}
    locations = {hour: table_root for hour in hours}
    if include_open:
        for hour in plan.open:
            hours[hour] = built[hour]
            locations[hour] = work
    result = CompactionResult(
        table=f"{history.rstrip('/')}/{COLUMNAR_DIR}",
        compacted=tuple(committed),
        unchanged=len(plan.unchanged),
        open_hours=tuple(sorted(plan.open)),
        seconds=round(time.perf_counter() - started, 3),
    )
    return result, Columnar(hours, locations)


def remove_work(columnar: Columnar) -> None:
    """Remove the uncommitted (open-hour) partitions an analysis read."""
    for location in set(columnar.locations.values()):
        if os.path.basename(os.path.dirname(location)) == TMP_DIR:
            shutil.rmtree(location, ignore_errors=True)
