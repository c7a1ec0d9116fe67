"""Topic windows from mergeable partial aggregates, written at compaction.

Compaction's fast path holds every topic row of a file in memory anyway; it also writes
the file's *partials*: one row per (5-minute bucket, topic) with what the topic window
report needs, in a form two partials combine into one exactly (`merge`):

- sample count, sums (means are sum / count at the end), first and last timestamp with
  the backlog there (and the owner: the broker of the last report);
- per rate and the load score, the two largest values counting repeats (`_top`,
  `_second`): a window of at most `TOP_TWO_MAX_SAMPLES` samples has its NumPy-linear p95
  between those two, so the p95s come out bit for bit (`transforms._top_two_p95`);
- the backlog trend's centred moments (means of time and backlog, co-moment, time's
  second moment), combined with Chan's formula: no cancellation on epoch timestamps.

A row of the topics table is itself a partial of one sample, so a file's partials are
`merge` of its rows, and an analysis's windows are `merge` of the partials of the hours
it reads (`topic_windows`): one function, whether it combines rows or partials. The
analysis then reads ~10x fewer rows than the topics table holds and needs no shuffle:
with windows that divide an hour, every window lies in one hour, so each hour's partials
are combined in one task (`windows_of_hours`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import to_arrow_schema

from ballast.balance.scoring import topic_load_score
from ballast.model import throughput_mbps, topic_connections
from ballast.pipeline.schemas import TOPIC_PARTIALS_SCHEMA, TOPIC_WINDOWS_SCHEMA
from ballast.pipeline.transforms import P95, TOP_TWO_MAX_SAMPLES

# The bucket of a partial: the analysis's default window. A window of this size (5 min)
# is one bucket; other window sizes read the topic rows instead (job.py).
PARTIAL_SECONDS = 300.0
METRICS = ("msg_rate", "byte_rate", "load_score")
SUMS = ("msg_rate", "byte_rate", "connections", "load_score")
PARTIALS = to_arrow_schema(TOPIC_PARTIALS_SCHEMA)
# The job's topic windows (the written table plus `first_seen`), as Arrow.
WINDOWS = pa.schema(
    [
        *to_arrow_schema(TOPIC_WINDOWS_SCHEMA, timezone="UTC"),
        pa.field("first_seen", pa.float64()),
    ]
)


@dataclass(frozen=True)
class _Groups:
    """Rows reordered so that each group's rows are consecutive (in their own order)."""

    order: np.ndarray  # row permutation
    starts: np.ndarray  # each group's first position in `order`
    ids: np.ndarray  # the group of each position in `order`

    @classmethod
    def of(cls, keys: np.ndarray) -> _Groups:
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        new = np.empty(len(ordered), dtype=bool)
        new[:1] = True
        np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
        return cls(order, np.flatnonzero(new), np.cumsum(new) - 1)

    def total(self, values: np.ndarray) -> np.ndarray:
        return np.add.reduceat(values, self.starts) if len(values) else values

    def first_where(self, hit: np.ndarray) -> np.ndarray:
        """Each group's first position where `hit` holds (every group has one)."""
        positions = np.where(hit, np.arange(len(hit)), len(hit))
        return np.minimum.reduceat(positions, self.starts)


def _strings(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """A string column as integer codes into its distinct values."""
    encoded = pc.dictionary_encode(column)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    return encoded.indices.to_numpy(zero_copy_only=False), encoded.dictionary


def _numbers(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy()


def _top_two(
    groups: _Groups, top: np.ndarray, second: np.ndarray, samples: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The two largest of each group's values, counting repeats, from its parts' two
    largest (`second` NaN for a part of one sample; NaN for a group of one sample)."""
    largest = np.maximum.reduceat(top, groups.starts)
    at = largest[groups.ids]
    # NaN compares false: a missing second neither repeats the largest nor undercuts it.
    repeats = groups.total((top == at).astype(np.int64) + (second == at))
    below = np.maximum(np.where(top < at, top, -np.inf), np.where(second < at, second, -np.inf))
    runner_up = np.maximum.reduceat(below, groups.starts)
    second_out = np.where(repeats >= 2, largest, np.where(samples >= 2, runner_up, np.nan))
    return largest, second_out


def merge(parts: pa.Table, keys: np.ndarray) -> dict[str, np.ndarray | pa.Array]:
    """Combine the partials (`PARTIALS` columns) that share a key: one partial per key,
    as columns, in key order; `topic` and `broker_id` as Arrow strings."""
    groups = _Groups.of(keys)
    o, starts = groups.order, groups.starts
    samples = _numbers(parts, "samples")[o]
    count = groups.total(samples)
    out: dict[str, np.ndarray | pa.Array] = {"samples": count}
    for name in SUMS:
        out[f"{name}_sum"] = groups.total(_numbers(parts, f"{name}_sum")[o])
    # First and last report (the first of equal timestamps, as Spark's min_by/max_by).
    first_ts = _numbers(parts, "first_timestamp")[o]
    earliest = np.minimum.reduceat(first_ts, starts)
    first = groups.first_where(first_ts == earliest[groups.ids])
    last_ts = _numbers(parts, "last_timestamp")[o]
    latest = np.maximum.reduceat(last_ts, starts)
    last = groups.first_where(last_ts == latest[groups.ids])
    out |= {
        "first_timestamp": earliest,
        "backlog_first": _numbers(parts, "backlog_first")[o][first],
        "last_timestamp": latest,
        "backlog_last": _numbers(parts, "backlog_last")[o][last],
        "bucket_start": _numbers(parts, "bucket_start")[o][starts],
    }
    topic_codes, topics = _strings(parts.column("topic"))
    broker_codes, brokers = _strings(parts.column("broker_id"))
    out["topic"] = topics.take(pa.array(topic_codes[o][starts]))
    out["broker_id"] = brokers.take(pa.array(broker_codes[o][last]))
    for metric in METRICS:
        out[f"{metric}_top"], out[f"{metric}_second"] = _top_two(
            groups,
            _numbers(parts, f"{metric}_top")[o],
            _numbers(parts, f"{metric}_second")[o],
            count,
        )
    # Centred moments of (timestamp, backlog), Chan et al.'s pairwise update applied to
    # every part at once around the group's own means. Means are kept relative to the
    # bucket's start and the first backlog: an epoch timestamp's mean is only exact to
    # 2e-7 s, which on a 5-minute window would show in the slope's ninth digit.
    n = samples.astype(np.float64)
    n_all = count.astype(np.float64)
    bucket = _numbers(parts, "bucket_start")[o]
    first_backlog = _numbers(parts, "backlog_first")[o]
    x = _numbers(parts, "timestamp_mean")[o] + (bucket - out["bucket_start"][groups.ids])
    y = _numbers(parts, "backlog_mean")[o] + (first_backlog - out["backlog_first"][groups.ids])
    x_mean = groups.total(n * x) / n_all
    y_mean = groups.total(n * y) / n_all
    dx, dy = x - x_mean[groups.ids], y - y_mean[groups.ids]
    comoment = _numbers(parts, "backlog_comoment")[o]
    m2 = _numbers(parts, "timestamp_m2")[o]
    out |= {
        "timestamp_mean": x_mean,
        "backlog_mean": y_mean,
        "backlog_comoment": groups.total(comoment + n * dx * dy),
        "timestamp_m2": groups.total(m2 + n * dx * dx),
    }
    return out


def _buckets(timestamps: np.ndarray, seconds: float) -> np.ndarray:
    # Spark's `with_window`: floor(timestamp / window) * window, in doubles.
    return np.floor(timestamps / seconds) * seconds


def _keys(starts: np.ndarray, topics: pa.ChunkedArray | pa.Array, seconds: float) -> np.ndarray:
    codes, names = _strings(topics)
    index = np.round((starts - starts.min()) / seconds).astype(np.int64) if len(starts) else starts
    return index.astype(np.int64) * max(len(names), 1) + codes


def _as_table(columns: dict[str, np.ndarray | pa.Array], schema: pa.Schema) -> pa.Table:
    return pa.table({f.name: columns[f.name] for f in schema}, schema=schema)


def rows_as_partials(topics: pa.Table) -> pa.Table:
    """Each row of the topics table (`TOPIC_TABLE_SCHEMA`) as a partial of one sample."""
    timestamp = _numbers(topics, "timestamp")
    byte_rate, msg_rate = _numbers(topics, "byte_rate"), _numbers(topics, "msg_rate")
    backlog = _numbers(topics, "backlog")
    connections = topic_connections(_numbers(topics, "producers"), _numbers(topics, "consumers"))
    # The core's formula on NumPy: the same floats as on Spark's columns (`topic_rows`).
    load_score = topic_load_score(1, throughput_mbps(byte_rate), connections, backlog)
    values = {"msg_rate": msg_rate, "byte_rate": byte_rate, "load_score": load_score}
    none = np.full(len(timestamp), np.nan)
    zero = np.zeros(len(timestamp))
    bucket = _buckets(timestamp, PARTIAL_SECONDS)
    return _as_table(
        {
            "bucket_start": bucket,
            "topic": topics.column("topic"),
            "broker_id": topics.column("broker_id"),
            "samples": np.ones(len(timestamp), dtype=np.int64),
            "first_timestamp": timestamp,
            "backlog_first": backlog,
            "last_timestamp": timestamp,
            "backlog_last": backlog,
            **{f"{name}_sum": v for name, v in values.items()},
            "connections_sum": connections,
            **{f"{name}_top": v for name, v in values.items()},
            **{f"{name}_second": none for name in values},
            "timestamp_mean": timestamp - bucket,  # exact: both near, the bucket whole
            "backlog_mean": zero,  # relative to the first (and only) backlog
            "backlog_comoment": zero,
            "timestamp_m2": zero,
        },
        PARTIALS,
    )


def file_partials(topics: pa.Table) -> pa.Table:
    """One file's topic rows → its partials, one per (bucket, topic)."""
    rows = rows_as_partials(topics)
    if rows.num_rows == 0:
        return rows
    keys = _keys(_numbers(rows, "bucket_start"), rows.column("topic"), PARTIAL_SECONDS)
    return _as_table(merge(rows, keys), PARTIALS)


def _position(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    position = (samples - 1).astype(np.float64) * P95
    low = np.floor(position).astype(np.int64)
    return low, position - low


def _p95(top: np.ndarray, second: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """`transforms.percentile_linear` from the two largest values (n <= 21), with its
    arithmetic: the same floats. NaN (null) for a larger window."""
    low, frac = _position(samples)
    below = np.where(low == samples - 1, top, second)
    step = top - below
    value = np.where(frac >= 0.5, top - step * (1 - frac), below + step * frac)
    return np.where(samples <= TOP_TWO_MAX_SAMPLES, value, np.nan)


def topic_windows(parts: pa.Table, window_seconds: float) -> pa.Table:
    """The topic window report (`transforms.topic_window_report` with `first_seen`) of
    partials whose windows they hold whole (`window_seconds` a multiple of the bucket)."""
    if parts.num_rows == 0:
        return WINDOWS.empty_table()
    starts = _buckets(_numbers(parts, "bucket_start"), window_seconds)
    merged = merge(parts, _keys(starts, parts.column("topic"), window_seconds))
    n = np.asarray(merged["samples"])
    count = n.astype(np.float64)
    window = _buckets(np.asarray(merged["bucket_start"]), window_seconds)
    # Spark's regr_slope: covar_pop / var_pop, null when var_pop is 0 (one timestamp).
    variance = np.asarray(merged["timestamp_m2"]) / count
    covariance = np.asarray(merged["backlog_comoment"]) / count
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = covariance / variance
    first, last = np.asarray(merged["backlog_first"]), np.asarray(merged["backlog_last"])
    micros = np.round(window * 1e6).astype(np.int64)
    columns: dict[str, np.ndarray | pa.Array] = {
        "window_start": micros,
        "window_end": micros + round(window_seconds * 1e6),
        "topic": merged["topic"],
        "broker_id": merged["broker_id"],
        "samples": n,
        "connections_mean": np.asarray(merged["connections_sum"]) / count,
        "backlog_first": first,
        "backlog_last": last,
        "backlog_delta": last - first,
        "backlog_slope": pa.array(slope, mask=variance == 0),
        "first_seen": merged["first_timestamp"],
    }
    for metric in METRICS:
        columns[f"{metric}_mean"] = np.asarray(merged[f"{metric}_sum"]) / count
        p95 = _p95(np.asarray(merged[f"{metric}_top"]), np.asarray(merged[f"{metric}_second"]), n)
        columns[f"{metric}_p95"] = pa.array(p95, mask=np.isnan(p95))
    return pa.table(
        {
            f.name: pa.array(columns[f.name], f.type)
            if isinstance(columns[f.name], np.ndarray)
            else columns[f.name]
            for f in WINDOWS
        },
        schema=WINDOWS,
    )


def read_partials(directory: str) -> pa.Table:
    """Every partials file of one hour's partition directory."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(".parquet"))
    tables = [pq.read_table(os.path.join(directory, n), schema=PARTIALS) for n in names]
    return pa.concat_tables(tables) if tables else PARTIALS.empty_table()


def windows_of_hours(
    batches: Iterator[pa.RecordBatch], window_seconds: float
) -> Iterator[pa.RecordBatch]:
    """Spark's `mapInArrow` body: rows naming hours' partials directories → those hours'
    topic windows (each hour on its own: a window that divides an hour lies in one)."""
    for batch in batches:
        for directory in batch.column("path").to_pylist():
            yield from topic_windows(read_partials(directory), window_seconds).to_batches()
