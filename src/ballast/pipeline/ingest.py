"""Reading the load history: JSON lines in, checked reports and a quarantine out.

Files are read once by Spark's JSON reader against the explicit schema, so a bad line never
fails the job or disappears: it gets a `kind` (`malformed` or `invalid`) and a `reason` in
the words `LoadReport.from_dict` would use (`cpu_percent: must be within 0-100, got
150.0`). Duplicates (same broker and timestamp) are kept once; the others are quarantined
as `duplicate` (`compact.py` does that, per hour).

The rules are those of `LoadReport.from_dict` (names through the model's own patterns,
totals through `report_totals`), with two deliberate differences forced by the JSON
reader: a JSON `null` counts as an absent field (so an optional field takes its default),
and infinite numbers are rejected (the model would let `1e400` through as `inf`, which
breaks every statistic downstream).

`staged_rows` turns each checked line into flat rows in one pass — the report's row, one
row per topic, or one quarantine row — so the JSON is parsed exactly once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ballast.model import BrokerMode, report_totals
from ballast.pipeline.rules import SPARK_OPS, is_broker_id, is_topic_name
from ballast.pipeline.schemas import (
    CORRUPT_COLUMN,
    LENIENT_REPORT_SCHEMA,
    LENIENT_TOPICS_SCHEMA,
    REPORT_NUMBER_FIELDS,
    REPORT_SCHEMA,
    TOPIC_COUNT_FIELDS,
    TOPIC_LOAD_SCHEMA,
    TOPIC_NUMBER_FIELDS,
)

MAX_TOPIC_REASONS = 5  # per record; the count of the rest is given
RAW_LIMIT = 10_000  # characters of a bad line kept in the quarantine
SOURCE_PATTERN = r"(date=[^/]*/hour=[^/]*/[^/]*)$"
STATES = tuple(mode.value for mode in BrokerMode)

# Columns of a parsed line, before checks.
PARSED_COLUMNS = (
    "source",
    "date",
    "hour",
    "report_id",
    "broker_type",
    "broker_variant",
    "broker_id",
    *REPORT_NUMBER_FIELDS,
    "state",
    "topics",
    CORRUPT_COLUMN,
)
# Columns of a checked line.
CHECKED_COLUMNS = (
    "source",
    "date",
    "hour",
    "report_id",
    "broker_id",
    *REPORT_NUMBER_FIELDS,
    "state",
    "topics",
    "kind",
    "reason",
    "raw",
)
# Columns of the flat staging rows (`staged_rows`), partitioned by `part`.
REPORT_STAGE_COLUMNS = (
    "report_id",
    "source",
    "broker_id",
    "timestamp",
    "state",
    "cpu_percent",
    "memory_percent",
    "disk_io_bps",
    "network_io_bps",
    "topic_count",
    "throughput_mbps",
    "total_msg_rate",
    "total_backlog",
    "connections",
    "kind",
    "reason",
    "raw",
)
TOPIC_STAGE_COLUMNS = ("pos", *(f.name for f in TOPIC_LOAD_SCHEMA.fields))


def read_history(spark: SparkSession, files: Sequence[str]) -> DataFrame:
    """Parse the given history files (`date=…/hour=…/*.jsonl`) against `REPORT_SCHEMA`.

    One row per non-blank line: `source` (the path below the history root), the `date`
    and `hour` of its directory, a `report_id` unique within this read, the broker id as
    text plus its JSON type, the typed fields, and `_corrupt_record` (the line's text)
    when the line is not JSON or a value has the wrong type.
    """
    raw = (
        spark.read.schema(REPORT_SCHEMA)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_COLUMN)
        .json(list(files))
    )
    path = F.col("_metadata.file_path")
    source = F.regexp_extract(path, SOURCE_PATTERN, 1)
    return raw.select(
        F.when(source != "", source)
        .otherwise(F.regexp_extract(path, r"([^/]*)$", 1))
        .alias("source"),
        F.regexp_extract(path, r"/date=([^/]*)/hour=[^/]*/[^/]*$", 1).alias("date"),
        F.regexp_extract(path, r"/hour=([^/]*)/[^/]*$", 1).alias("hour"),
        F.monotonically_increasing_id().alias("report_id"),
        F.schema_of_variant("broker_id").alias("broker_type"),
        F.col("broker_id").alias("broker_variant"),
        F.try_variant_get("broker_id", "$", "string").alias("broker_id"),
        *REPORT_NUMBER_FIELDS,
        "state",
        "topics",
        CORRUPT_COLUMN,
    )


def _bad_number(value: Column) -> Column:
    return F.isnan(value) | (value < 0) | (value == float("inf"))


def _issue(condition: Column, message: Column) -> Column:
    return F.when(condition, message)


def _fmt(template: str, *values: Column) -> Column:
    return F.format_string(template, *[v.cast("string") for v in values])


def _report_issues() -> list[Column]:
    """One column per rule on the report's own fields; null when the rule holds."""
    lenient = F.col("lenient")
    corrupt = F.col(CORRUPT_COLUMN).isNotNull()
    broker = F.col("broker_id")
    kind = F.col("broker_type")
    present = kind.isNotNull() & (kind != "VOID")  # a JSON null is an absent field
    issues = [
        _issue(~present & lenient.broker_id.isNull(), F.lit("broker_id: missing field")),
        _issue(
            present & (kind != "STRING"),
            F.concat(F.lit("broker_id: expected a string, got "), F.to_json("broker_variant")),
        ),
        _issue(
            (kind == "STRING") & ~is_broker_id(broker),
            _fmt(
                "broker_id: invalid broker id '%s' (letters, digits, '_', '.', '-', ':'; "
                "at most 128)",
                broker,
            ),
        ),
    ]
    for name in REPORT_NUMBER_FIELDS:
        value, text = F.col(name), lenient[name]
        if name == "timestamp":
            issues.append(_issue(value.isNull() & text.isNull(), F.lit("timestamp: missing field")))
        issues.append(
            _issue(
                corrupt & value.isNull() & text.isNotNull(),
                _fmt(f"{name}: expected a number, got %s", text),
            )
        )
        issues.append(
            _issue(
                _bad_number(value),
                _fmt(f"{name}: must be a finite non-negative number, got %s", value),
            )
        )
        if name in ("cpu_percent", "memory_percent"):
            issues.append(
                _issue(
                    ~_bad_number(value) & (value > 100),
                    _fmt(f"{name}: must be within 0-100, got %s", value),
                )
            )
    issues.append(
        _issue(
            F.col("state").isNotNull() & ~F.col("state").isin(*STATES),
            _fmt(f"state: '%s' is not one of: {', '.join(STATES)}", F.col("state")),
        )
    )
    issues.append(
        _issue(
            corrupt & F.col("topics").isNull() & lenient.topics.isNotNull(),
            _fmt(
                "topics: expected a list of topic objects, got %s",
                F.substring(lenient.topics, 1, 80),
            ),
        )
    )
    return issues


def _topic_issue_list(topic: Any, index: Column) -> list[Column]:
    """One column per rule on one topic entry (null when the rule holds). `topic` is a
    struct column (inside a higher-order function) or a row accessor for flat rows."""
    where = F.concat(F.lit("topics["), index.cast("string"), F.lit("]"))
    name = topic["topic"]
    checks = [
        _issue(name.isNull(), F.concat(where, F.lit(".topic: missing field"))),
        _issue(
            ~is_topic_name(name),
            F.concat(
                where,
                F.lit(".topic: invalid topic name '"),
                name,
                F.lit("' (expected /namespace/topic)"),
            ),
        ),
    ]
    for field in TOPIC_NUMBER_FIELDS:
        checks.append(
            _issue(
                _bad_number(topic[field]),
                F.concat(
                    where,
                    _fmt(f".{field}: must be a finite non-negative number, got %s", topic[field]),
                ),
            )
        )
    for field in TOPIC_COUNT_FIELDS:
        checks.append(
            _issue(
                topic[field] < 0,
                F.concat(
                    where, _fmt(f".{field}: expected a non-negative integer, got %s", topic[field])
                ),
            )
        )
    return checks


def _topic_issues(topic: Column, index: Column) -> Column:
    """Every broken rule of one topic entry, joined; "" when it is valid."""
    return F.concat_ws("; ", *_topic_issue_list(topic, index))


class _Flat:
    """Field access on a flat topic row, like a struct's `t[name]`."""

    def __getitem__(self, name: str) -> Column:
        return F.col(name)


def topic_problem(position: Column) -> Column:
    """On a flat topic row (`position` 0-based): every broken rule joined, or null when
    the topic is valid. Only run on the few rows `suspect_topic` or a bad name flagged."""
    found = F.concat_ws("; ", *_topic_issue_list(_Flat(), position))
    return F.when(found != "", found)


def suspect_topic(topic: Any) -> Column:
    """The cheap part of the topic rules (no text, no regex): a missing name or a bad
    number. Names are checked once per distinct name (`compact.py`)."""
    return (
        topic["topic"].isNull()
        | _bad_number(topic["msg_rate"])
        | _bad_number(topic["byte_rate"])
        | (F.least(*[topic[f] for f in TOPIC_COUNT_FIELDS]) < 0)
    )


def _topic_type_issues(text: Column, index: Column) -> Column:
    """For a line the typed parse rejected: which topic fields had the wrong type."""
    where = F.concat(F.lit("topics["), index.cast("string"), F.lit("]"))
    typed = F.element_at(F.col("topics"), index + 1)
    checks = []
    for field in (*TOPIC_NUMBER_FIELDS, *TOPIC_COUNT_FIELDS):
        expected = "a number" if field in TOPIC_NUMBER_FIELDS else "a non-negative integer"
        checks.append(
            _issue(
                text[field].isNotNull() & typed[field].isNull(),
                F.concat(where, _fmt(f".{field}: expected {expected}, got %s", text[field])),
            )
        )
    return F.concat_ws("; ", *checks)


def limited_reasons(messages: Column) -> Column:
    """Join per-topic messages (already non-empty), keeping the first few and counting
    the rest; null for none."""
    return _limited(messages)


def _limited(messages: Column) -> Column:
    """Join non-empty messages, keeping the first few and counting the rest."""
    kept = F.filter(messages, lambda m: m != "")
    head = F.array_join(F.slice(kept, 1, MAX_TOPIC_REASONS), "; ")
    extra = F.size(kept) - MAX_TOPIC_REASONS
    return F.when(F.size(kept) == 0, F.lit(None)).otherwise(
        F.when(extra > 0, F.concat(head, _fmt("; and %s more topic problems", extra))).otherwise(
            head
        )
    )


def with_quarantine_reason(parsed: DataFrame) -> DataFrame:
    """Add `kind` (null, `malformed` or `invalid`) and `reason` (null when valid).

    Only lines the typed parse rejected are parsed a second time, leniently (every value
    as text), to name the field whose type was wrong.
    """
    corrupt = F.col(CORRUPT_COLUMN).isNotNull()
    with_lenient = parsed.withColumn(
        "lenient", F.when(corrupt, F.from_json(F.col(CORRUPT_COLUMN), LENIENT_REPORT_SCHEMA))
    ).withColumn(
        "lenient_topics",
        F.when(corrupt, F.from_json(F.col("lenient.topics"), LENIENT_TOPICS_SCHEMA)),
    )
    has_bad_topic = F.exists(
        F.col("topics"), lambda t: suspect_topic(t) | ~is_topic_name(t["topic"])
    )
    topic_reasons = F.when(has_bad_topic, _limited(F.transform(F.col("topics"), _topic_issues)))
    type_reasons = F.when(
        corrupt, _limited(F.transform(F.col("lenient_topics"), _topic_type_issues))
    )
    # Nothing could be read at all: the line is not one JSON object (truncated, a list...).
    unreadable = (
        corrupt & F.coalesce(*[F.col(f"lenient.{f.name}") for f in LENIENT_REPORT_SCHEMA]).isNull()
    )
    report_problems = F.when(
        ~unreadable, F.concat_ws("; ", *_report_issues(), type_reasons)
    ).otherwise("")
    # The topics of a line that is already invalid are checked here (rare, so the array
    # functions' cost does not matter); those of every other line on the flat topic rows
    # (`topic_problem`), and `compact.py` quarantines the line if one fails.
    problems = F.when(
        F.col("report_found") != "",
        F.concat_ws("; ", F.col("report_found"), topic_reasons),
    ).otherwise("")
    # Computed once in their own projections: `reason` and `kind` both read `found`.
    found = F.col("found")
    reason = (
        F.when(found != "", found)
        .when(corrupt, F.lit("malformed JSON: not one complete JSON object (truncated line?)"))
        .otherwise(F.lit(None))
    )
    kind = (
        F.when(corrupt & (found == ""), F.lit("malformed"))
        .when(found != "", F.lit("invalid"))
        .otherwise(F.lit(None))
    )
    return (
        with_lenient.withColumn("report_found", report_problems)
        .withColumn("found", problems)
        .withColumn("reason", reason)
        .withColumn("kind", kind)
        .drop("lenient", "lenient_topics", "report_found", "found")
    )


def _record_json() -> Column:
    """The fields read from a line, re-serialised (for lines whose text is not kept)."""
    return F.to_json(
        F.struct(
            F.col("broker_variant").alias("broker_id"),
            *REPORT_NUMBER_FIELDS,
            "state",
            "topics",
        )
    )


def checked_records(parsed: DataFrame) -> DataFrame:
    """The stable shape of a checked line: the report's columns, `kind`, `reason` and,
    when (and only when) it is quarantined, `raw`: the line's text for a malformed line
    (or one with a value of the wrong type), the fields read for an invalid one."""
    quarantined = F.col("kind").isNotNull()
    raw = F.coalesce(F.col(CORRUPT_COLUMN), _record_json())
    return parsed.transform(with_quarantine_reason).select(
        *CHECKED_COLUMNS[:-1],
        F.when(quarantined, F.substring(raw, 1, RAW_LIMIT)).alias("raw"),
    )


def _zero(column: Column, kind: str = "double") -> Column:
    return F.coalesce(column, F.lit(0).cast(kind))


# The model's rule for totals, on Spark: an absent (null) field counts as its default, 0.
_TOTALS_OPS = dataclasses.replace(
    SPARK_OPS,
    field=lambda item, name: F.coalesce(
        item[name], F.lit(0.0) if name in TOPIC_NUMBER_FIELDS else F.lit(0).cast("long")
    ),
)


def staged_rows(checked: DataFrame) -> DataFrame:
    """Flat rows, one pass over the checked lines, partitioned by `part`:

    - `brokers`: one row per line valid so far, with `LoadReport`'s defaults filled in
      and the totals of `ballast.model.report_totals` (the model's own function);
    - `topics`: one row per topic of such a line: its 1-based position `pos`, its fields
      (absent ones 0) and `suspect` (a number or the name breaks a rule: see
      `suspect_topic`; names are checked per distinct name afterwards);
    - `quarantine`: one row per malformed or invalid line.

    Every row has `date`, `hour`, `report_id`, `broker_id` and `timestamp`. Only plain
    column expressions run per topic (Spark compiles them); the array functions run per
    line.
    """
    valid = F.col("kind").isNull()
    throughput, msg_rate, backlog, connections = report_totals(F.col("topics"), _TOTALS_OPS)
    topics = F.coalesce(F.col("topics"), F.array())
    lines = checked.select(
        "date",
        "hour",
        "report_id",
        "source",
        "broker_id",
        "timestamp",
        F.coalesce(F.col("state"), F.lit(BrokerMode.ACTIVE.value)).alias("state"),
        *(_zero(F.col(c)).alias(c) for c in REPORT_NUMBER_FIELDS[1:]),
        F.when(valid, F.size(topics).cast("long")).alias("topic_count"),
        F.when(valid, throughput).alias("throughput_mbps"),
        F.when(valid, msg_rate).alias("total_msg_rate"),
        F.when(valid, backlog).alias("total_backlog"),
        F.when(valid, connections).alias("connections"),
        "kind",
        "reason",
        "raw",
        F.when(valid, topics).alias("topics"),
    )
    head = F.array(F.lit(None).cast(TOPIC_LOAD_SCHEMA))
    exploded = lines.select(
        *REPORT_STAGE_COLUMNS,
        "date",
        "hour",
        F.posexplode(F.when(valid, F.concat(head, F.col("topics"))).otherwise(head)),
    )
    first = F.col("pos") == 0
    part = F.when(~valid, F.lit("quarantine")).when(first, F.lit("brokers")).otherwise("topics")
    defaults = {
        f.name: _zero(F.col(f"col.{f.name}"), "double" if f.name in TOPIC_NUMBER_FIELDS else "long")
        for f in TOPIC_LOAD_SCHEMA.fields
        if f.name != "topic"
    }
    return exploded.select(
        part.alias("part"),
        "date",
        "hour",
        *(
            F.col(c)
            if c in ("report_id", "broker_id", "timestamp")
            else F.when(first, F.col(c)).alias(c)
            for c in REPORT_STAGE_COLUMNS
        ),
        F.when(~first, F.col("pos")).alias("pos"),
        F.col("col.topic").alias("topic"),
        *(
            F.when(~first, defaults[f.name]).alias(f.name)
            for f in TOPIC_LOAD_SCHEMA.fields
            if f.name != "topic"
        ),
        F.when(~first, suspect_topic(F.col("col"))).alias("suspect"),
    )


def duplicate_ranks(reports: DataFrame) -> DataFrame:
    """Number the copies of each (hour, broker, timestamp): `copy` 1 is kept, the
    others are duplicates. The tie-break is deterministic: the smallest hash of the
    record's content (`content_hash`), then the source file, then the read order."""
    order = (
        Window.partitionBy("date", "hour", "broker_id", "timestamp")
        .orderBy("content_hash", "source", "report_id")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    return reports.withColumn("copy", F.row_number().over(order))


def duplicate_reason() -> Column:
    """The quarantine reason of a duplicate copy."""
    return F.format_string(
        "duplicate: another report of broker %s at timestamp %.3f was kept",
        F.col("broker_id"),
        F.col("timestamp"),
    )
