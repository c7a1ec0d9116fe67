"""Reading the load history: text lines in, typed reports and a quarantine out.

Lines are read as text and parsed with `from_json` against the explicit schema, so a bad
line never fails the job or disappears: it gets a `kind` (`malformed` or `invalid`) and a
`reason` in the words `LoadReport.from_dict` would use (`cpu_percent: must be within
0-100, got 150.0`). Duplicates (same broker and timestamp) are kept once; the others are
quarantined as `duplicate`.

The rules are those of `LoadReport.from_dict`, with two deliberate differences forced by
the JSON reader: a JSON `null` counts as an absent field (so an optional field takes its
default), and infinite numbers are rejected (the model would let `1e400` through as
`inf`, which breaks every statistic downstream).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ballast.model import BrokerMode
from ballast.pipeline.schemas import (
    CORRUPT_COLUMN,
    LENIENT_REPORT_SCHEMA,
    LENIENT_TOPICS_SCHEMA,
    REPORT_NUMBER_FIELDS,
    REPORT_SCHEMA,
    TOPIC_COUNT_FIELDS,
    TOPIC_NUMBER_FIELDS,
)

# The model's name rules (model.py), as Java regular expressions.
_PART = r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}"
BROKER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-:]{0,127}$"
TOPIC_PATTERN = rf"^/{_PART}/{_PART}$"
# A broker id must be a JSON string; the reader would turn 5 or true into "5"/"true".
_BROKER_ID_IS_STRING = r'"broker_id"\s*:\s*"'
MAX_TOPIC_REASONS = 5  # per record; the count of the rest is given
RAW_LIMIT = 10_000  # characters of a bad line kept in the quarantine

REPORT_COLUMNS = (
    "source",
    "line_hash",
    "broker_id",
    *REPORT_NUMBER_FIELDS,
    "state",
    "topics",
)
STATES = tuple(mode.value for mode in BrokerMode)


def read_history_lines(spark: SparkSession, files: Sequence[str]) -> DataFrame:
    """The non-blank lines of the given history files: `source` (the path below the
    history root, `date=…/hour=…/file.jsonl`) and `value` (the text)."""
    lines = spark.read.text(list(files))
    source = F.regexp_extract(F.col("_metadata.file_path"), r"(date=[^/]*/hour=[^/]*/[^/]*)$", 1)
    fallback = F.regexp_extract(F.col("_metadata.file_path"), r"([^/]*)$", 1)
    return lines.select(
        F.when(source != "", source).otherwise(fallback).alias("source"), F.col("value")
    ).filter(F.trim(F.col("value")) != "")


def with_parsed_reports(lines: DataFrame) -> DataFrame:
    """Parse each line against `REPORT_SCHEMA`; a line that is not JSON or has a value of
    the wrong type keeps its text in `_corrupt_record` (the other fields are what could be
    read). Adds `line_hash`, a deterministic tie-breaker for duplicates."""
    parsed = F.from_json(
        F.col("value"),
        REPORT_SCHEMA,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN},
    )
    return lines.select(
        "source",
        "value",
        F.xxhash64("value").alias("line_hash"),
        parsed.alias("r"),
    ).select("source", "value", "line_hash", "r.*")


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
    issues = [
        _issue(broker.isNull() & lenient.broker_id.isNull(), F.lit("broker_id: missing field")),
        _issue(
            broker.isNotNull() & ~F.col("value").rlike(_BROKER_ID_IS_STRING),
            _fmt("broker_id: expected a string, got %s", broker),
        ),
        _issue(
            broker.isNotNull() & ~broker.rlike(BROKER_ID_PATTERN),
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


def _topic_issues(topic: Column, index: Column) -> Column:
    """Every broken rule of one topic entry, joined; "" when it is valid."""
    where = F.concat(F.lit("topics["), index.cast("string"), F.lit("]"))
    name = topic["topic"]
    checks = [
        _issue(name.isNull(), F.concat(where, F.lit(".topic: missing field"))),
        _issue(
            ~name.rlike(TOPIC_PATTERN),
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
    return F.concat_ws("; ", *checks)


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
        "lenient", F.when(corrupt, F.from_json(F.col("value"), LENIENT_REPORT_SCHEMA))
    ).withColumn(
        "lenient_topics",
        F.when(corrupt, F.from_json(F.col("lenient.topics"), LENIENT_TOPICS_SCHEMA)),
    )
    has_bad_topic = F.exists(
        F.col("topics"),
        lambda t: (
            t["topic"].isNull()
            | ~t["topic"].rlike(TOPIC_PATTERN)
            | _bad_number(t["msg_rate"])
            | _bad_number(t["byte_rate"])
            | (F.least(*[t[f] for f in TOPIC_COUNT_FIELDS]) < 0)
        ),
    )
    topic_reasons = F.when(has_bad_topic, _limited(F.transform(F.col("topics"), _topic_issues)))
    type_reasons = F.when(
        corrupt, _limited(F.transform(F.col("lenient_topics"), _topic_type_issues))
    )
    # Nothing could be read at all: the line is not one JSON object (truncated, a list...).
    unreadable = (
        corrupt & F.coalesce(*[F.col(f"lenient.{f.name}") for f in LENIENT_REPORT_SCHEMA]).isNull()
    )
    problems = F.when(
        ~unreadable, F.concat_ws("; ", *_report_issues(), type_reasons, topic_reasons)
    ).otherwise("")
    # Computed once in its own projection: `reason` and `kind` both read it.
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
        with_lenient.withColumn("found", problems)
        .withColumn("reason", reason)
        .withColumn("kind", kind)
        .drop("lenient", "lenient_topics", "found")
    )


def checked_records(parsed: DataFrame) -> DataFrame:
    """The stable shape of a checked line: the report's columns, `kind`, `reason` and the
    line's text when (and only when) it is quarantined."""
    return parsed.transform(with_quarantine_reason).select(
        *REPORT_COLUMNS,
        "kind",
        "reason",
        F.when(F.col("kind").isNotNull(), F.substring(F.col("value"), 1, RAW_LIMIT)).alias("raw"),
    )


def valid_records(checked: DataFrame) -> DataFrame:
    """Lines that passed every rule (duplicates still included)."""
    return checked.filter(F.col("kind").isNull()).select(*REPORT_COLUMNS)


def invalid_records(checked: DataFrame) -> DataFrame:
    """Quarantine rows for lines that failed (see `QUARANTINE_SCHEMA`)."""
    return checked.filter(F.col("kind").isNotNull()).select(
        "source", "kind", "reason", "broker_id", "timestamp", "raw"
    )


def _duplicate_rank(records: DataFrame) -> DataFrame:
    """Rank copies of one (broker, timestamp); the first is kept. Only keys that occur
    more than once are ranked, so the full data is not shuffled to find a few copies."""
    keys = ["broker_id", "timestamp"]
    copies = (
        records.groupBy(*keys).agg(F.count(F.lit(1)).alias("copies")).filter(F.col("copies") > 1)
    )
    marked = records.join(F.broadcast(copies), on=keys, how="left")
    order = (
        Window.partitionBy(*keys)
        .orderBy("line_hash", "source")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    singles = marked.filter(F.col("copies").isNull()).withColumn("copy", F.lit(1))
    multiples = marked.filter(F.col("copies").isNotNull()).withColumn(
        "copy", F.row_number().over(order)
    )
    return singles.unionByName(multiples)


def deduplicated(records: DataFrame) -> DataFrame:
    """One report per (broker, timestamp): the copy with the smallest line hash."""
    return _duplicate_rank(records).filter(F.col("copy") == 1).select(*REPORT_COLUMNS)


def duplicate_records(records: DataFrame) -> DataFrame:
    """Quarantine rows for the copies `deduplicated` drops. `raw` is the parsed record
    re-serialised (the text itself is not kept for valid lines)."""
    extra = _duplicate_rank(records).filter(F.col("copy") > 1)
    payload = F.to_json(F.struct(*[F.col(c) for c in REPORT_COLUMNS[2:]]))
    return extra.select(
        "source",
        F.lit("duplicate").alias("kind"),
        F.format_string(
            "duplicate: another report of broker %s at timestamp %.3f was kept",
            F.col("broker_id"),
            F.col("timestamp"),
        ).alias("reason"),
        "broker_id",
        "timestamp",
        payload.alias("raw"),
    )
