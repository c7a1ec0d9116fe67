"""Every schema the pipeline reads or writes, stated once (never inferred).

`REPORT_SCHEMA` reads a load-history line (`LoadReport.to_dict()` plus optional `state`)
with Spark's JSON reader; `CORRUPT_COLUMN` receives the raw line when it is not valid JSON
or a value has the wrong type. `broker_id` is read as a VARIANT so that a number or `true`
(which a string field would silently turn into "5" / "true") is told apart from a string.
`LENIENT_REPORT_SCHEMA` reads the same fields as strings: comparing it with the typed
parse tells which field had the wrong type (only for lines the typed parse rejected). The
derived totals in the file (`topic_count`, `total_*`) are not read: the pipeline
recomputes them from the topics with the model's own rule (`report_totals`). Unknown
fields are ignored.

The columnar history (`compact.py`) has three tables, each partitioned by
`date=YYYY-MM-DD/hour=HH` exactly like the JSON files: `TOPIC_TABLE_SCHEMA` (one row per
report and topic), `BROKER_TABLE_SCHEMA` (one row per report, with the totals) and
`QUARANTINE_SCHEMA`. The partition columns are not part of these schemas: readers pick
partitions by path (see `compact.py`).
"""

from __future__ import annotations

from pyspark.sql import types as T

CORRUPT_COLUMN = "_corrupt_record"

TOPIC_LOAD_SCHEMA = T.StructType(
    [
        T.StructField("topic", T.StringType()),
        T.StructField("msg_rate", T.DoubleType()),
        T.StructField("byte_rate", T.DoubleType()),
        T.StructField("producers", T.LongType()),
        T.StructField("consumers", T.LongType()),
        T.StructField("subscriptions", T.LongType()),
        T.StructField("backlog", T.LongType()),
    ]
)

# Numeric fields of a report and of a topic, in the order their checks are reported.
REPORT_NUMBER_FIELDS = (
    "timestamp",
    "cpu_percent",
    "memory_percent",
    "disk_io_bps",
    "network_io_bps",
)
TOPIC_NUMBER_FIELDS = ("msg_rate", "byte_rate")
TOPIC_COUNT_FIELDS = ("producers", "consumers", "subscriptions", "backlog")

REPORT_SCHEMA = T.StructType(
    [
        T.StructField("broker_id", T.VariantType()),
        *(T.StructField(name, T.DoubleType()) for name in REPORT_NUMBER_FIELDS),
        T.StructField("state", T.StringType()),
        T.StructField("topics", T.ArrayType(TOPIC_LOAD_SCHEMA)),
        T.StructField(CORRUPT_COLUMN, T.StringType()),
    ]
)

# The same fields, every value read as its JSON text: only used to explain a bad line.
LENIENT_TOPIC_SCHEMA = T.StructType(
    [T.StructField(f.name, T.StringType()) for f in TOPIC_LOAD_SCHEMA]
)
LENIENT_REPORT_SCHEMA = T.StructType(
    [
        T.StructField("broker_id", T.StringType()),
        *(T.StructField(name, T.StringType()) for name in REPORT_NUMBER_FIELDS),
        T.StructField("topics", T.StringType()),
    ]
)
LENIENT_TOPICS_SCHEMA = T.ArrayType(LENIENT_TOPIC_SCHEMA)

# --- the columnar history (written by `ballast history compact`) ------------------------

# `report_id` links a topic row to its report's broker row (unique within a compaction).
TOPIC_TABLE_SCHEMA = T.StructType(
    [
        T.StructField("report_id", T.LongType()),
        T.StructField("broker_id", T.StringType()),
        T.StructField("timestamp", T.DoubleType()),
        *TOPIC_LOAD_SCHEMA.fields,
    ]
)

# One row per valid, deduplicated report: its own fields (defaults filled in) and the
# totals over its topics (`ballast.model.report_totals`).
BROKER_TABLE_SCHEMA = T.StructType(
    [
        T.StructField("report_id", T.LongType()),
        T.StructField("source", T.StringType()),
        T.StructField("broker_id", T.StringType()),
        T.StructField("timestamp", T.DoubleType()),
        T.StructField("state", T.StringType()),
        T.StructField("cpu_percent", T.DoubleType()),
        T.StructField("memory_percent", T.DoubleType()),
        T.StructField("disk_io_bps", T.DoubleType()),
        T.StructField("network_io_bps", T.DoubleType()),
        T.StructField("topic_count", T.LongType()),
        T.StructField("throughput_mbps", T.DoubleType()),
        T.StructField("msg_rate", T.DoubleType()),
        T.StructField("backlog", T.LongType()),
        T.StructField("connections", T.LongType()),
    ]
)

QUARANTINE_SCHEMA = T.StructType(
    [
        T.StructField("source", T.StringType()),
        T.StructField("kind", T.StringType()),  # malformed | invalid | duplicate
        T.StructField("reason", T.StringType()),
        T.StructField("broker_id", T.StringType()),
        T.StructField("timestamp", T.DoubleType()),
        # The line as read (first 10 000 characters); for a duplicate, the kept fields of
        # the parsed record re-serialised (valid lines' text is not kept past parsing).
        T.StructField("raw", T.StringType()),
    ]
)

# Per history file, one row per (5-minute bucket, topic): mergeable partial aggregates of
# the topic windows (`partials.py`), written by compaction's fast path.
TOPIC_PARTIALS_SCHEMA = T.StructType(
    [
        T.StructField("bucket_start", T.DoubleType()),  # epoch seconds
        T.StructField("topic", T.StringType()),
        T.StructField("samples", T.LongType()),
        T.StructField("first_timestamp", T.DoubleType()),
        T.StructField("backlog_first", T.LongType()),
        T.StructField("last_timestamp", T.DoubleType()),
        T.StructField("backlog_last", T.LongType()),
        T.StructField("broker_id", T.StringType()),  # the broker of the last report
        *(
            T.StructField(f"{name}_sum", T.DoubleType())
            for name in ("msg_rate", "byte_rate", "load_score")
        ),
        T.StructField("connections_sum", T.LongType()),
        *(
            T.StructField(f"{name}_{which}", T.DoubleType())
            for name in ("msg_rate", "byte_rate", "load_score")
            for which in ("top", "second")  # the two largest, counting repeats
        ),
        T.StructField("timestamp_mean", T.DoubleType()),  # after bucket_start
        T.StructField("backlog_mean", T.DoubleType()),  # above backlog_first
        T.StructField("backlog_comoment", T.DoubleType()),  # sum of centred products
        T.StructField("timestamp_m2", T.DoubleType()),  # sum of centred squares
    ]
)

COLUMNAR_SCHEMAS: dict[str, T.StructType] = {
    "topics": TOPIC_TABLE_SCHEMA,
    "brokers": BROKER_TABLE_SCHEMA,
    "quarantine": QUARANTINE_SCHEMA,
    "topic_partials": TOPIC_PARTIALS_SCHEMA,
}

# --- output tables of `ballast analyze` -------------------------------------------------

_STATS = ("mean", "p95", "max")

BROKER_WINDOWS_SCHEMA = T.StructType(
    [
        T.StructField("window_start", T.TimestampType()),
        T.StructField("window_end", T.TimestampType()),
        T.StructField("broker_id", T.StringType()),
        T.StructField("state", T.StringType()),
        T.StructField("samples", T.LongType()),
        *(
            T.StructField(f"{metric}_{stat}", T.DoubleType())
            for metric in ("cpu_percent", "memory_percent", "throughput_mbps", "topic_count")
            for stat in _STATS
        ),
        T.StructField("disk_io_bps_mean", T.DoubleType()),
        T.StructField("network_io_bps_mean", T.DoubleType()),
        T.StructField("msg_rate_mean", T.DoubleType()),
        T.StructField("backlog_mean", T.DoubleType()),
        T.StructField("connections_mean", T.DoubleType()),
        T.StructField("weighted_topic_load_mean", T.DoubleType()),
        T.StructField("usage_mean", T.DoubleType()),
        T.StructField("usage_ewma", T.DoubleType()),
        T.StructField("score_fair", T.DoubleType()),
        T.StructField("score_balanced", T.DoubleType()),
        T.StructField("score_weighted_load", T.DoubleType()),
        T.StructField("score_least_long_term_message_rate", T.DoubleType()),
        T.StructField("score_least_resource_usage_with_weight", T.DoubleType()),
    ]
)

TOPIC_WINDOWS_SCHEMA = T.StructType(
    [
        T.StructField("window_start", T.TimestampType()),
        T.StructField("window_end", T.TimestampType()),
        T.StructField("topic", T.StringType()),
        T.StructField("broker_id", T.StringType()),
        T.StructField("samples", T.LongType()),
        T.StructField("msg_rate_mean", T.DoubleType()),
        T.StructField("msg_rate_p95", T.DoubleType()),
        T.StructField("byte_rate_mean", T.DoubleType()),
        T.StructField("byte_rate_p95", T.DoubleType()),
        T.StructField("connections_mean", T.DoubleType()),
        T.StructField("load_score_mean", T.DoubleType()),
        T.StructField("load_score_p95", T.DoubleType()),
        T.StructField("backlog_first", T.LongType()),
        T.StructField("backlog_last", T.LongType()),
        T.StructField("backlog_delta", T.LongType()),
        T.StructField("backlog_slope", T.DoubleType()),  # per second; null for one sample
    ]
)

STRATEGY_COMPARISON_SCHEMA = T.StructType(
    [
        T.StructField("window_start", T.TimestampType()),
        T.StructField("window_end", T.TimestampType()),
        T.StructField("strategy", T.StringType()),
        T.StructField("brokers", T.LongType()),
        T.StructField("mean", T.DoubleType()),
        T.StructField("std", T.DoubleType()),
        T.StructField("cv", T.DoubleType()),
        T.StructField("min", T.DoubleType()),
        T.StructField("max", T.DoubleType()),
        T.StructField("overloaded", T.ArrayType(T.StringType())),
        T.StructField("underloaded", T.ArrayType(T.StringType())),
        T.StructField("above_threshold", T.BooleanType()),
    ]
)

OUTPUT_SCHEMAS: dict[str, T.StructType] = {
    "broker_windows": BROKER_WINDOWS_SCHEMA,
    "topic_windows": TOPIC_WINDOWS_SCHEMA,
    "strategy_comparison": STRATEGY_COMPARISON_SCHEMA,
    "quarantine": QUARANTINE_SCHEMA,
}
