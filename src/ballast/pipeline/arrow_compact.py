"""Compaction's fast path: a clean history file turned into columnar files by Arrow.

Almost every history file is clean: the sink wrote it, every line is one JSON object that
`LoadReport.from_dict` accepts. Such a file does not need Spark's row-by-row checks and
quarantine machinery; Arrow's C++ JSON reader parses it against the explicit schema and
the checks run vectorised, on whole columns (no per-row Python). `convert_file` runs in a
Spark task, one file per task, and writes the file's rows of the topics and brokers
tables as Parquet with the tables' own schemas.

A file is *clean* when Arrow parses it with the explicit schema (a value of the wrong
type, a truncated line, `[1, 2]`, a repeated key: not clean), it holds exactly one object
per non-blank line, and every rule holds on every line: broker ids and topic names
(`ballast.model`'s patterns), finite non-negative numbers, percentages within 0-100, a
known state, no missing required field. Absent optional fields take the model's defaults,
like the Spark path. Anything else — and an hour with two reports of the same broker and
timestamp — goes to the Spark path (`ingest.py`, `compact.py`), which names every problem
and quarantines the line; the fast path never decides a reason, so the quarantine's
reasons are the same whichever path an hour takes. `tests/pipeline/test_compact.py`
checks that both paths write the same tables for the same clean history.

Report totals are `ballast.model.report_totals` itself, applied to the flattened topic
columns with `SEGMENT_OPS` (a left fold per report in list order, so the floats are the
model's, bit for bit).
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from ballast.model import BrokerMode, Ops, report_totals
from ballast.pipeline import partials
from ballast.pipeline.rules import BROKER_ID_REGEX, TOPIC_NAME_REGEX
from ballast.pipeline.schemas import (
    BROKER_TABLE_SCHEMA,
    CORRUPT_COLUMN,
    REPORT_SCHEMA,
    TOPIC_LOAD_SCHEMA,
    TOPIC_TABLE_SCHEMA,
)

# Fast-path report ids live above every id Spark's `monotonically_increasing_id` gives
# (partition << 33 | row), so the two paths never hand out the same id in a compaction.
FAST_ID_BASE = 1 << 62
# Arrow splits a file into blocks of this size to parse them in parallel; a line longer
# than a block is parsed again as one block.
BLOCK_SIZE = 8 << 20
STATES = tuple(mode.value for mode in BrokerMode)
PERCENT_FIELDS = ("cpu_percent", "memory_percent")
RATE_FIELDS = ("disk_io_bps", "network_io_bps")
# The tables' schemas are the Spark schemas (stated once, in `schemas.py`), in Arrow.
TOPIC_TABLE = to_arrow_schema(TOPIC_TABLE_SCHEMA)
BROKER_TABLE = to_arrow_schema(BROKER_TABLE_SCHEMA)
# A line as Arrow parses it: REPORT_SCHEMA with the broker id as text (any other JSON type
# fails the parse, so the file takes the Spark path, which names the type).
LINE_SCHEMA = pa.schema(
    [
        pa.field("broker_id", pa.string()),
        *(
            to_arrow_schema(T.StructType([f])).field(0)
            for f in REPORT_SCHEMA.fields
            if f.name not in ("broker_id", CORRUPT_COLUMN)
        ),
    ]
)
TOPIC_FIELDS = tuple(f.name for f in TOPIC_LOAD_SCHEMA.fields)


@dataclass(frozen=True)
class FileTask:
    """One history file to convert, and where its rows go."""

    index: int  # the file's number in this compaction (report ids)
    path: str  # absolute local path
    source: str  # the path below the history root: date=…/hour=…/name.jsonl
    topics_dir: str  # the hour's partition directory of the topics table
    brokers_dir: str  # … and of the brokers table
    partials_dir: str  # … and of the topic partials (`partials.py`)
    hour_start: float  # the hour the file is filed under, [start, end) in epoch seconds
    hour_end: float


@dataclass(frozen=True)
class FileResult:
    """What `convert_file` did: converted (with the reports' keys), or why not."""

    source: str
    clean: bool
    why: str = ""  # when not clean: the first thing the fast path could not accept
    reports: int = 0
    topic_rows: int = 0
    keys: tuple[tuple[str, float], ...] = ()  # (broker_id, timestamp) per report
    # Whether the file's topic partials were written: every report lies in its hour, so
    # the hour's windows are whole in its partials (else the analysis reads its rows).
    partials: bool = False


@dataclass(frozen=True)
class Segments:
    """Items cut into consecutive segments (one per report): flat field columns plus
    offsets, the shape `SEGMENT_OPS` folds."""

    fields: dict[str, np.ndarray]
    offsets: np.ndarray  # len(segments) + 1

    def __getitem__(self, name: str) -> np.ndarray:
        return self.fields[name]


def segment_total(items: Segments, term: Callable[[Any], Any], zero: Any) -> np.ndarray:
    """zero + term(item 1) + term(item 2) + … per segment, added in list order like
    the model's loop (NumPy's own sums are pairwise, so not the same floats): one
    vectorised step per position, over the segments that reach it."""
    values = np.asarray(term(items))
    lengths = np.diff(items.offsets)
    order = np.argsort(-lengths, kind="stable")  # the segments still going are a prefix
    starts = items.offsets[:-1][order]
    ascending = np.sort(lengths)
    running = np.full(len(lengths), zero, dtype=np.result_type(values, np.asarray(zero)))
    longest = int(ascending[-1]) if len(lengths) else 0
    reaching = len(lengths) - np.searchsorted(ascending, np.arange(longest), side="right")
    for position, live in enumerate(reaching.tolist()):
        running[:live] += values[starts[:live] + position]
    totals = np.empty_like(running)
    totals[order] = running
    return totals


SEGMENT_OPS = Ops(
    where=np.where,
    maximum=np.maximum,
    total=segment_total,
    field=lambda items, name: items[name],
)


class NotClean(Exception):
    """The file must take the Spark path (the message says why, for the logs)."""


def _parse(data: bytes) -> pa.Table:
    for block_size in (BLOCK_SIZE, len(data) + 1):
        try:
            return pj.read_json(
                io.BytesIO(data),
                read_options=pj.ReadOptions(block_size=max(block_size, 1 << 16)),
                parse_options=pj.ParseOptions(
                    explicit_schema=LINE_SCHEMA, unexpected_field_behavior="ignore"
                ),
            )
        except pa.ArrowInvalid as exc:
            problem = str(exc)
            if "straddling" not in problem and "block size" not in problem:
                break
    raise NotClean(f"not parsed by Arrow: {problem.splitlines()[0][:200]}")


def _require(ok: bool | np.bool_, why: str) -> None:
    if not ok:
        raise NotClean(why)


def _numbers(column: pa.Array, name: str, required: bool) -> np.ndarray:
    """A numeric column as NumPy, absent values as 0; not clean if a value is negative or
    not finite (or absent when `required`)."""
    _require(not (required and column.null_count), f"{name}: missing")
    values = (column.fill_null(0) if column.null_count else column).to_numpy(zero_copy_only=False)
    if values.dtype.kind == "f":
        _require(bool(np.isfinite(values).all()), f"{name}: not finite")
    _require(bool((values >= 0).all()), f"{name}: negative")
    return values


def _every(condition: pa.Array) -> bool:
    """Whether a boolean column holds only true (an empty one does)."""
    return pc.all(condition, skip_nulls=False, min_count=0).as_py() is True


def _all_match(names: pa.Array, regex: str, name: str) -> None:
    # RE2 reads the whole-value regexes Spark's `rlike` uses (`rules.py`) the same way.
    _require(names.null_count == 0, f"{name}: missing")
    _require(_every(pc.match_substring_regex(pc.unique(names), regex)), f"{name}: invalid")


def _non_blank_lines(data: bytes) -> int:
    """How many lines hold something. The sink's lines all start with `{`: counting
    line starts (C-speed `bytes.count`) is enough then; anything else is counted line
    by line."""
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    objects = data.count(b"\n{") + data.startswith(b"{")
    if objects == lines:
        return objects
    return sum(1 for line in data.split(b"\n") if line.strip())


def convert(data: bytes, index: int, source: str) -> tuple[pa.Table, pa.Table]:
    """A clean file's bytes → (topics table rows, brokers table rows); raises `NotClean`."""
    lines = _parse(data)
    _require(lines.num_rows == _non_blank_lines(data), "not one JSON object per line")
    count = lines.num_rows

    def column(name: str) -> pa.Array:
        return lines.column(name).combine_chunks()

    broker = column("broker_id")
    _all_match(broker, BROKER_ID_REGEX, "broker_id")
    timestamp = _numbers(column("timestamp"), "timestamp", required=True)
    report = {
        name: _numbers(column(name), name, required=False)
        for name in (*PERCENT_FIELDS, *RATE_FIELDS)
    }
    for name in PERCENT_FIELDS:
        _require(bool((report[name] <= 100).all()), f"{name}: above 100")
    state = column("state")
    state = state.fill_null(BrokerMode.ACTIVE.value) if state.null_count else state
    _require(_every(pc.is_in(state, pa.array(STATES))), "state: unknown")

    topics = column("topics")  # an absent list is an empty one, as in the model
    lengths = pc.list_value_length(topics).fill_null(0).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(topics)
    _require(flat.null_count == 0, "topics: null entry")
    entries = dict(zip(TOPIC_FIELDS, flat.flatten(), strict=True))
    names = entries.pop("topic")
    _all_match(names, TOPIC_NAME_REGEX, "topic")
    fields = {name: _numbers(values, name, required=False) for name, values in entries.items()}
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    throughput, msg_rate, backlog, connections = report_totals(
        Segments(fields, offsets), SEGMENT_OPS
    )
    report_ids = FAST_ID_BASE + (index << 32) + np.arange(count, dtype=np.int64)
    parent = np.repeat(np.arange(count, dtype=np.int64), lengths)
    topic_table = pa.table(
        {
            "report_id": report_ids[parent],
            "broker_id": broker.take(pa.array(parent)),
            "timestamp": timestamp[parent],
            "topic": names,
            **fields,
        },
        schema=TOPIC_TABLE,
    )
    broker_table = pa.table(
        {
            "report_id": report_ids,
            "source": pa.array([source] * count, pa.string()),
            "broker_id": broker,
            "timestamp": timestamp,
            "state": state,
            **report,
            "topic_count": lengths.astype(np.int64),
            "throughput_mbps": throughput,
            "msg_rate": msg_rate,
            "backlog": backlog,
            "connections": connections,
        },
        schema=BROKER_TABLE,
    )
    return topic_table, broker_table


def _write(table: pa.Table, directory: str, name: str) -> None:
    if table.num_rows == 0:
        return
    os.makedirs(directory, exist_ok=True)
    pq.write_table(table, os.path.join(directory, name), compression="snappy")


def convert_file(task: FileTask) -> FileResult:
    """Convert one file if it is clean (writing its Parquet files), else say why not.

    Runs in a Spark task; only the small `FileResult` travels back to the driver."""
    with open(task.path, "rb") as handle:
        data = handle.read()
    if not data or data.isspace():  # isspace stops at the first character; strip copies
        return FileResult(task.source, clean=True, partials=True)
    try:
        topics, brokers = convert(data, task.index, task.source)
    except NotClean as exc:
        return FileResult(task.source, clean=False, why=str(exc))
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"part-{task.index:05d}-{os.path.basename(task.source)}")
    _write(topics, task.topics_dir, f"{name}.parquet")
    _write(brokers, task.brokers_dir, f"{name}.parquet")
    timestamps = brokers.column("timestamp")
    in_hour = brokers.num_rows == 0 or (
        pc.min(timestamps).as_py() >= task.hour_start and pc.max(timestamps).as_py() < task.hour_end
    )
    if in_hour:
        # The rows are in memory now: their windows' partial aggregates cost little more
        # than this, against the analysis reading and shuffling every row again.
        _write(partials.file_partials(topics), task.partials_dir, f"{name}.parquet")
    keys = tuple(
        zip(
            brokers.column("broker_id").to_pylist(),
            brokers.column("timestamp").to_pylist(),
            strict=True,
        )
    )
    return FileResult(
        task.source,
        clean=True,
        reports=brokers.num_rows,
        topic_rows=topics.num_rows,
        keys=keys,
        partials=in_hour,
    )
