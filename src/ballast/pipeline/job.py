"""`ballast analyze`: the whole job, from the history to tables, plan and report.

Stages (each timed, and announced through `progress` for the console):

1. compact    turn the closed hours not compacted yet into the columnar history (once,
              committed: `compact.py`); hours still being written are parsed into the
              job's scratch space and read too, never committed;
2. read       the columnar tables of the hours in --from/--to (other hours' partitions
              are never opened), filtered to the exact time range;
3. quarantine the quarantine of those hours (malformed, invalid, duplicate);
4. brokers    broker windows: aggregates, Pulsar's smoothed usage, strategy scores;
5. strategies CV, min, max, overloaded/underloaded brokers per window and strategy;
6. topics     topic windows: rates, p95, backlog trend (kept for the plan's first-seen);
7. policies   Danube's policy and Pulsar's shedders replayed on the windows starting in
              the planning horizon (the history the plan looks at: a cost that does not
              grow with the history's length);
8. plan       the latest assignment with p95 loads → `plan_rebalance` → plan.json; only
              the hours of the planning horizon are read;
9. report     report.html with PNG charts;
10. upload    for remote outputs, copy everything up through fsspec.

JSON is never parsed here except for hours not compacted yet; every analysis reads
Parquet with explicit schemas.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ballast.balance.plan import plan_rebalance
from ballast.balance.rankings import score_brokers
from ballast.config import BallastConfig, RebalancingConfig, Strategy
from ballast.load_history import HISTORY_GLOB
from ballast.pipeline import compact, partials, report, shedding, snapshot, storage, transforms
from ballast.pipeline.compact import DEFAULT_GRACE_SECONDS
from ballast.pipeline.schemas import (
    BROKER_WINDOWS_SCHEMA,
    QUARANTINE_SCHEMA,
    STRATEGY_COMPARISON_SCHEMA,
    TOPIC_WINDOWS_SCHEMA,
)

TABLES = ("broker_windows", "topic_windows", "strategy_comparison", "quarantine")
TOP_TOPICS = 15


class PipelineError(Exception):
    """A problem with the job's input or options, explained for the user (no traceback)."""


@dataclass(frozen=True)
class AnalyzeOptions:
    """What `ballast analyze` was asked to do."""

    history: str
    out: str
    window_seconds: float = 300.0
    horizon_seconds: float = 3600.0
    stale_after_seconds: float | None = None  # default: the window, at least 90 s
    strategy: Strategy | None = None  # default: the configuration's assignment strategy
    config: BallastConfig = field(default_factory=BallastConfig)
    max_moves: int | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    start: float | None = None  # --from (inclusive), epoch seconds
    end: float | None = None  # --to (exclusive)
    now: float | None = None  # the wall clock for "which hours are closed" (tests)
    grace_seconds: float = DEFAULT_GRACE_SECONDS


@dataclass(frozen=True)
class AnalysisResult:
    """What the job found and wrote; the CLI prints it as a summary table."""

    files: int
    records: int
    reports: int
    quarantined: dict[str, int]
    brokers: tuple[str, ...]
    topics: int
    windows: int
    start: float
    end: float
    strategies: list[dict[str, Any]]
    plan: dict[str, Any]
    outputs: dict[str, str]
    warnings: tuple[str, ...]
    timings: dict[str, float]
    compacted_hours: int = 0
    open_hours: int = 0


def parse_duration(text: str) -> float:
    """`30s`, `5m`, `1h`, `1d` or plain seconds → seconds (positive)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
    value = text.strip().lower()
    scale = units.get(value[-1:])
    number = value[:-1] if scale else value
    try:
        seconds = float(number) * (scale or 1)
    except ValueError:
        raise PipelineError(
            f"invalid duration {text!r}: use a number with s, m, h or d (e.g. 5m)"
        ) from None
    if not seconds > 0:
        raise PipelineError(f"invalid duration {text!r}: must be positive")
    return seconds


def parse_time(text: str) -> float:
    """`2026-01-01`, `2026-01-01T05:30`, `2026-01-01T05:30:00Z` (no zone means UTC) or
    epoch seconds → epoch seconds."""
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise PipelineError(
            f"invalid time {text!r}: use an ISO date or time in UTC (2026-01-01, "
            "2026-01-01T05:30, 2026-01-01T05:30:00Z) or epoch seconds"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def parse_range(start: str | None, end: str | None) -> tuple[float | None, float | None]:
    """`--from` / `--to` as epoch seconds (`parse_time`; None: open); the start must come
    before the end."""
    first = parse_time(start) if start else None
    last = parse_time(end) if end else None
    if first is not None and last is not None and first >= last:
        raise PipelineError(f"--from {start} is not before --to {end}")
    return first, last


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat().replace("+00:00", "Z")


class _Stages:
    """Times each stage and tells the caller which one is starting."""

    def __init__(self, progress: Callable[[str], None] | None) -> None:
        self.progress = progress
        self.timings: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.progress is not None:
            self.progress(name)
        started = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = round(time.perf_counter() - started, 3)


def _write(frame: DataFrame, path: str, order: list[str], single_file: bool) -> None:
    """Write a table sorted by `order`: small tables as one sorted file, readable anywhere;
    big ones file by file (each file sorted, the files as the aggregation partitioned the
    rows: deterministic, without a global sort's sampling job and extra shuffle)."""
    frame = frame.coalesce(1) if single_file else frame
    frame.sortWithinPartitions(*order).write.mode("overwrite").parquet(path)


def _select(frame: DataFrame, schema: Any) -> DataFrame:
    return transforms.conform(frame, [f.name for f in schema.fields])


def _in_range(frame: DataFrame, start: float | None, end: float | None) -> DataFrame:
    if start is not None:
        frame = frame.filter(F.col("timestamp") >= F.lit(float(start)))
    if end is not None:
        frame = frame.filter(F.col("timestamp") < F.lit(float(end)))
    return frame


def _range_text(options: AnalyzeOptions) -> str:
    if options.start is None and options.end is None:
        return ""
    start = _iso(options.start) if options.start is not None else "the beginning"
    end = _iso(options.end) if options.end is not None else "the end"
    return f" between {start} and {end}"


def _compact(
    spark: SparkSession, options: AnalyzeOptions, scratch: str
) -> tuple[compact.CompactionResult, compact.Columnar]:
    if not storage.is_remote(options.history) and not os.path.isdir(
        storage.local_path(options.history)
    ):
        raise PipelineError(
            f"history directory {options.history} does not exist: pass the directory the "
            "history sink writes to (or create one with `ballast history generate`)"
        )
    result, columnar = compact.compact(
        spark,
        options.history,
        scratch,
        now=options.now,
        grace_seconds=options.grace_seconds,
        start=options.start,
        end=options.end,
        include_open=True,
        storage_options=options.storage_options,
    )
    if not columnar.hours:
        raise PipelineError(
            f"no load history under {options.history}{_range_text(options)}: expected files "
            f"named {options.history.rstrip('/')}/{HISTORY_GLOB} (date=YYYY-MM-DD/hour=HH, "
            "UTC); is the history sink enabled, or try `ballast history generate`"
        )
    return result, columnar


def _quarantine_summary(quarantine: DataFrame) -> list[dict[str, Any]]:
    rows = (
        quarantine.groupBy("kind")
        .agg(F.count(F.lit(1)).alias("records"), F.min("reason").alias("example"))
        .orderBy("kind")
        .collect()
    )
    return [row.asDict() for row in rows]


def _topic_summary(topic_windows: DataFrame) -> pd.DataFrame:
    """Per topic: when it was first seen, its mean and p95 throughput (MB/s) over the
    windows, and its backlog change over the history (one row per topic)."""
    weighted = F.col("byte_rate_mean") * F.col("samples")
    return (
        topic_windows.groupBy("topic")
        .agg(
            F.min("first_seen").alias("first_seen"),
            (F.sum(weighted) / F.sum("samples") / 1e6).alias("mbps_mean"),
            (transforms.percentile_linear("byte_rate_mean") / 1e6).alias("mbps_p95"),
            (
                F.max_by("backlog_last", "window_start") - F.min_by("backlog_first", "window_start")
            ).alias("backlog_change"),
        )
        .toPandas()
    )


def _top_topics(summary: pd.DataFrame) -> pd.DataFrame:
    """The report's busiest topics by mean throughput (ties by name)."""
    return (
        summary.sort_values(["mbps_mean", "topic"], ascending=[False, True], kind="stable")
        .head(TOP_TOPICS)[["topic", "mbps_mean", "mbps_p95", "backlog_change"]]
        .reset_index(drop=True)
    )


def _strategy_summary(comparison: pd.DataFrame) -> list[dict[str, Any]]:
    summary = []
    for strategy in Strategy:
        rows = comparison[comparison["strategy"] == strategy.value].sort_values("window_start")
        if rows.empty:
            continue
        summary.append(
            {
                "strategy": strategy.value,
                "mean_cv": float(rows["cv"].mean()),
                "max_cv": float(rows["cv"].max()),
                "last_cv": float(rows["cv"].iloc[-1]),
                "windows_above_threshold": int(rows["above_threshold"].sum()),
                "windows": len(rows),
            }
        )
    return summary


@dataclass
class _Run:
    """One run of the job: what every stage reads (the session, the options and what
    follows from them, where to write) and the cached frames to release at the end."""

    spark: SparkSession
    options: AnalyzeOptions
    stage: _Stages
    out: str
    window: float
    horizon: float
    stale_after: float
    strategy: Strategy
    persisted: list[DataFrame] = field(default_factory=list)

    @property
    def rules(self) -> RebalancingConfig:
        return self.options.config.load_manager.rebalancing

    def path(self, table: str) -> str:
        return os.path.join(self.out, table)

    def keep(self, frame: DataFrame) -> DataFrame:
        """Cache `frame` for the rest of the run (released when the run ends)."""
        frame = frame.persist()
        self.persisted.append(frame)
        return frame


@dataclass(frozen=True)
class _History:
    """The history in range: valid broker rows (cached), topic rows, the quarantine."""

    brokers: DataFrame
    topics: DataFrame
    quarantine: DataFrame
    quarantine_summary: list[dict[str, Any]]
    quarantined: dict[str, int]
    reports: int
    records: int
    files: int
    now: float  # the history's end: the latest report
    broker_ids: list[str]


@dataclass(frozen=True)
class _TopicWindows:
    frame: DataFrame  # cached
    count: int
    top: pd.DataFrame
    first_seen: dict[str, float]


@dataclass(frozen=True)
class _Planned:
    built: snapshot.BuiltSnapshot
    moves: int
    document: dict[str, Any]
    path: str


def run_analysis(
    spark: SparkSession,
    options: AnalyzeOptions,
    progress: Callable[[str], None] | None = None,
) -> AnalysisResult:
    """Run the whole job; raise `PipelineError` (with what to do) for unusable input.

    The stages of the module docstring, composed: each is a function of the run and of
    what the stages before it produced."""
    window = float(options.window_seconds)
    scratch = tempfile.mkdtemp(prefix="ballast-analyze-")
    remote_out = storage.is_remote(options.out)
    out = (
        os.path.join(scratch, "out")
        if remote_out
        else os.path.abspath(storage.local_path(options.out))
    )
    os.makedirs(out, exist_ok=True)
    run = _Run(
        spark,
        options,
        _Stages(progress),
        out,
        window,
        horizon=max(float(options.horizon_seconds), window),
        stale_after=options.stale_after_seconds or max(window, 90.0),
        strategy=options.strategy or options.config.load_manager.assignment_strategy,
    )
    columnar: compact.Columnar | None = None
    try:
        with run.stage("compact"):
            compaction, columnar = _compact(spark, options, scratch)
        history = _read(run, columnar)
        _write_quarantine(run, history)
        scored, brokers_pdf = _broker_windows(run, history)
        comparison_pdf = _strategy_comparison(run, scored)
        since = history.now - run.horizon
        topics = _topic_windows(run, columnar, history)
        policies = _replay_policies(run, topics, brokers_pdf, since)
        planned = _plan(run, columnar, history, topics, since)
        all_brokers = tuple(sorted(brokers_pdf["broker_id"].unique()))
        start = float(brokers_pdf["window_start"].min().timestamp())
        warnings = _warnings(run, all_brokers, planned, history, compaction)
        strategies = _strategy_summary(comparison_pdf)
        summary = {
            "history": options.history,
            "period": f"{_iso(start)} → {_iso(planned.built.now)}",
            "window": f"{window:g} s",
            "records read": history.records,
            "valid reports": history.reports,
            "quarantined": sum(history.quarantined.values()),
            "brokers": ", ".join(all_brokers),
            "topics": topics.count,
            "plan": f"{planned.moves} move(s), strategy {run.strategy.value}",
            "policies (moves, CV end, converged after)": shedding.summary_line(policies),
        }
        report_path = _report(run, summary, comparison_pdf, brokers_pdf, topics, planned, history)
        outputs = {name: run.path(name) for name in TABLES}
        outputs |= {
            "plan": planned.path,
            "report": report_path,
            "policy_comparison": run.path("policy_comparison.json"),
        }
        if remote_out:
            outputs = _upload(run, outputs)
        return AnalysisResult(
            files=history.files,
            records=history.records,
            reports=history.reports,
            quarantined=history.quarantined,
            brokers=all_brokers,
            topics=topics.count,
            windows=int(brokers_pdf["window_start"].nunique()),
            start=start,
            end=planned.built.now,
            strategies=strategies,
            plan=planned.document,
            outputs=outputs,
            warnings=tuple(warnings),
            timings=run.stage.timings,
            compacted_hours=len(compaction.compacted),
            open_hours=len(compaction.open_hours),
        )
    finally:
        for frame in run.persisted:
            frame.unpersist()
        if columnar is not None:
            compact.remove_work(columnar)
        shutil.rmtree(scratch, ignore_errors=True)


def _read(run: _Run, columnar: compact.Columnar) -> _History:
    """Stage 2: the columnar tables of the hours in range, filtered to the exact range."""
    spark, options = run.spark, run.options
    with run.stage("read"):
        quarantine = columnar.read(spark, "quarantine")
        quarantine_summary = _quarantine_summary(quarantine)
        brokers = run.keep(
            _in_range(columnar.read(spark, "brokers"), options.start, options.end).transform(
                transforms.broker_rows
            )
        )
        # One job: materialises the cache and gives the count and the history's end.
        totals = brokers.agg(
            F.count(F.lit(1)).alias("reports"),
            F.max("timestamp").alias("now"),
            F.collect_set("broker_id").alias("broker_ids"),
        ).first()
        assert totals is not None
        topics = _in_range(columnar.read(spark, "topics"), options.start, options.end).transform(
            transforms.topic_rows
        )
    quarantined = {row["kind"]: int(row["records"]) for row in quarantine_summary}
    reports = int(totals["reports"])
    records = reports + sum(quarantined.values())
    if records == 0:
        raise PipelineError(
            f"the {columnar.files} history file(s) under {options.history}{_range_text(options)} "
            "hold no records (every line is blank): nothing to analyse yet"
        )
    return _History(
        brokers,
        topics,
        quarantine,
        quarantine_summary,
        quarantined,
        reports,
        records,
        columnar.files,
        # No valid report: no end either; `_write_quarantine` stops the run first.
        float(totals["now"]) if reports else 0.0,
        totals["broker_ids"],
    )


def _write_quarantine(run: _Run, history: _History) -> None:
    """Stage 3: the quarantine table; a history without one valid report stops here."""
    options = run.options
    with run.stage("quarantine"):
        _write(
            _select(history.quarantine, QUARANTINE_SCHEMA),
            run.path("quarantine"),
            ["source", "kind", "timestamp", "raw"],
            True,
        )
    if history.reports == 0:
        summary = history.quarantine_summary
        first = summary[0]["example"] if summary else ""
        raise PipelineError(
            f"none of the {history.records} records under {options.history}"
            f"{_range_text(options)} is a valid load report; see "
            f"{options.out.rstrip('/')}/quarantine for every reason (e.g. {first})"
        )


def _broker_windows(run: _Run, history: _History) -> tuple[DataFrame, pd.DataFrame]:
    """Stage 4: broker windows (aggregates, smoothed usage, strategy scores), written and
    kept, with the driver's copy."""
    with run.stage("brokers"):
        # Broker rows are few (one per report) and so are their windows: one partition
        # each, so the group-by and the scores' window functions need no shuffle (and
        # the strategy comparison, read from `scored`, none either).
        windows_pdf = (
            history.brokers.coalesce(1)
            .transform(transforms.with_window, run.window)
            .transform(transforms.broker_window_report)
            .toPandas()
        )
        windows_pdf = transforms.add_usage_ewma(windows_pdf)
        unscored_schema = T.StructType(
            [f for f in BROKER_WINDOWS_SCHEMA.fields if not f.name.startswith("score_")]
        )
        unscored = run.spark.createDataFrame(
            windows_pdf[unscored_schema.fieldNames()], schema=unscored_schema
        ).coalesce(1)
        scored = run.keep(
            _select(unscored.transform(transforms.with_strategy_scores), BROKER_WINDOWS_SCHEMA)
        )
        _write(scored, run.path("broker_windows"), ["window_start", "broker_id"], True)
        brokers_pdf: pd.DataFrame = scored.toPandas()
    return scored, brokers_pdf


def _strategy_comparison(run: _Run, scored: DataFrame) -> pd.DataFrame:
    """Stage 5: CV, extremes, overloaded / underloaded brokers per window and strategy."""
    with run.stage("strategies"):
        # Kept for the two reads (the table and the driver's copy): computed once.
        comparison = run.keep(
            _select(
                scored.transform(transforms.strategy_scores_long)
                .coalesce(1)  # one partition, known as such: no shuffle for the windows
                .transform(transforms.strategy_comparison_report, run.rules.cv_threshold),
                STRATEGY_COMPARISON_SCHEMA,
            )
        )
        _write(comparison, run.path("strategy_comparison"), ["window_start", "strategy"], True)
        return comparison.toPandas()


# Set on a window computed from rows that lies in an hour read from partials (job.py).
_CROSSED = "_crossed_hours"


def _partial_hours(run: _Run, columnar: compact.Columnar) -> list[compact.Hour]:
    """The hours whose topic windows come from their partials: windows of the partials'
    bucket (then no window crosses an hour), hours wholly in --from/--to, partials
    written at compaction."""
    if run.window != partials.PARTIAL_SECONDS:
        return []
    start, end = run.options.start, run.options.end
    return [
        hour
        for hour, marker in sorted(columnar.hours.items())
        if marker.has("topic_partials")
        and (start is None or hour.start >= start)
        and (end is None or hour.end <= end)
    ]


def _windows_from_partials(run: _Run, paths: list[str]) -> DataFrame:
    """The topic windows of the hours whose partials directories are `paths`: each hour
    combined on its own in a Python task (`partials.windows_of_hours`), no shuffle."""
    schema = T.StructType(
        [*TOPIC_WINDOWS_SCHEMA.fields, T.StructField("first_seen", T.DoubleType())]
    )
    # A few hours per task, in order: enough tasks to keep every core busy.
    slices = max(1, min(len(paths), run.spark.sparkContext.defaultParallelism * 4))
    listing = run.spark.sparkContext.parallelize([(p,) for p in paths], slices).toDF("path string")
    combine = functools.partial(partials.windows_of_hours, window_seconds=run.window)
    return listing.mapInArrow(combine, schema)


def _windows_of_rows(run: _Run, history: _History, rows: DataFrame, small: bool) -> DataFrame:
    return rows.transform(transforms.with_window, run.window).transform(
        transforms.topic_window_report,
        with_first_seen=True,
        brokers=history.broker_ids,
        small_windows=small,
    )


def _topic_report(
    run: _Run,
    columnar: compact.Columnar,
    history: _History,
    small: bool,
    partial_hours: list[compact.Hour],
) -> DataFrame:
    """The topic windows (cached): those of `partial_hours` from their partials, the
    others from their rows; `_CROSSED` marks a window of rows in a partials hour."""
    if not partial_hours:
        windows = _windows_of_rows(run, history, history.topics, small)
        return windows.withColumn(_CROSSED, F.lit(False)).persist()
    paths = columnar.paths("topic_partials", partial_hours)
    windows = _windows_from_partials(run, paths).withColumn(_CROSSED, F.lit(False))
    rows_hours = [hour for hour in sorted(columnar.hours) if hour not in partial_hours]
    if rows_hours:
        rows = _in_range(
            columnar.read(run.spark, "topics", rows_hours), run.options.start, run.options.end
        ).transform(transforms.topic_rows)
        # A report filed under another hour than its own (the sink never does that; a
        # copied file might) makes a window in an hour read from its partials: that
        # window would be counted twice.
        hours = [int(hour.start // 3600) for hour in partial_hours]
        crossed = F.floor(F.unix_seconds("window_start") / 3600).isin(hours)
        of_rows = _windows_of_rows(run, history, rows, small).withColumn(_CROSSED, crossed)
        windows = windows.unionByName(of_rows)
    return windows.persist()


def _checked_report(
    run: _Run, columnar: compact.Columnar, history: _History, partial_hours: list[compact.Hour]
) -> tuple[DataFrame, int, bool]:
    """The fast report with its largest window and whether a window crossed into a
    partials hour (one job, which also fills the cache the next steps read)."""
    frame = _topic_report(run, columnar, history, True, partial_hours)
    row = frame.agg(F.max("samples"), F.max(F.col(_CROSSED).cast("int"))).first()
    assert row is not None
    return frame, int(row[0] or 0), bool(row[1])


def _topic_windows(run: _Run, columnar: compact.Columnar, history: _History) -> _TopicWindows:
    """Stage 6: topic windows, written and kept; the per-topic summary."""
    with run.stage("topics"):
        # Aggregated once and kept: the table, the per-topic summary and the policy
        # replay's windows all read this result, never the topic rows again.
        topic_windows, largest, crossed = _checked_report(
            run, columnar, history, _partial_hours(run, columnar)
        )
        if crossed:
            topic_windows.unpersist()
            topic_windows, largest, _ = _checked_report(run, columnar, history, [])
        # The fast p95s hold when no window has more than 21 samples of a topic (the
        # usual case); else every window is computed again the exact way.
        if largest > transforms.TOP_TWO_MAX_SAMPLES:
            topic_windows.unpersist()
            topic_windows = _topic_report(run, columnar, history, False, [])
        run.persisted.append(topic_windows)
        _write(
            _select(topic_windows, TOPIC_WINDOWS_SCHEMA),
            run.path("topic_windows"),
            ["window_start", "topic"],
            False,
        )
        # One row per topic (the plan's snapshot holds every topic anyway): the count,
        # the report's top topics and each topic's first-seen time in one job.
        summary = _topic_summary(topic_windows)
        first_seen = dict(
            zip(
                summary["topic"].tolist(),
                summary["first_seen"].astype(float).tolist(),
                strict=True,
            )
        )
        return _TopicWindows(topic_windows, len(summary), _top_topics(summary), first_seen)


def _replay_policies(
    run: _Run, topics: _TopicWindows, brokers_pdf: pd.DataFrame, since: float
) -> list[dict[str, Any]]:
    """Stage 7: Danube's policy and Pulsar's shedders side by side.

    Replayed over the planning horizon's windows only (those starting in it): the same
    history the plan looks at, and a cost that does not grow with the history's length."""
    with run.stage("policies"):
        horizon_topics = (
            topics.frame.filter(F.col("window_start") >= F.timestamp_seconds(F.lit(since)))
            .select(*shedding.TOPIC_WINDOW_COLUMNS)
            .toPandas()
        )
        horizon_brokers = brokers_pdf[brokers_pdf["window_start"] >= pd.Timestamp(since, unit="s")]
        policies: list[dict[str, Any]] = shedding.compare_policies(
            horizon_brokers, horizon_topics, run.options.config.load_manager, run.strategy
        )
        with open(run.path("policy_comparison.json"), "w", encoding="utf-8") as fh:
            json.dump(policies, fh, indent=2)
        return policies


def _plan(
    run: _Run,
    columnar: compact.Columnar,
    history: _History,
    topics: _TopicWindows,
    since: float,
) -> _Planned:
    """Stage 8: the latest assignment with p95 loads → `plan_rebalance` → plan.json."""
    spark, options, now, stale_after = run.spark, run.options, history.now, run.stale_after
    with run.stage("plan"):
        # Only the hours the plan looks at are read (partition pruning by path).
        recent_hours = [h for h in columnar.hours if h.overlaps(since, None)]
        live_hours = [h for h in columnar.hours if h.overlaps(now - stale_after, None)]
        recent_topics = _in_range(
            columnar.read(spark, "topics", recent_hours), options.start, options.end
        )
        live_topics = _in_range(
            columnar.read(spark, "topics", live_hours), options.start, options.end
        )
        # Both per broker: collected together (one result, fewer jobs).
        latest = [
            r.asDict()
            for r in snapshot.latest_report_rows(
                history.brokers.coalesce(1),  # few rows: aggregated without a shuffle
                live_topics.filter(F.col("timestamp") >= now - stale_after),
            )
            .join(
                snapshot.broker_p95_report(history.brokers.coalesce(1), since),
                on="broker_id",
                how="left",
            )
            .collect()
        ]
        parts = snapshot.SnapshotParts(
            latest=latest,
            broker_p95=latest,
            topic_p95=[
                r.asDict() for r in snapshot.topic_p95_report(recent_topics, since).collect()
            ],
            first_seen=topics.first_seen,
        )
        built = snapshot.build_snapshot(parts, stale_after)
        core_started = time.perf_counter()
        plan = plan_rebalance(
            built.snapshot,
            run.rules,
            run.strategy,
            built.now,
            options.max_moves,
            pulsar=options.config.load_manager.pulsar,
        )
        # Reported apart: the core's own planning time, not Spark's.
        run.stage.timings["plan_core"] = round(time.perf_counter() - core_started, 3)
        document = _plan_document(
            options, built, plan.to_dict(), run.strategy, run.window, run.horizon, stale_after
        )
        path = run.path("plan.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2)
    return _Planned(built, len(plan.moves), document, path)


def _warnings(
    run: _Run,
    all_brokers: tuple[str, ...],
    planned: _Planned,
    history: _History,
    compaction: compact.CompactionResult,
) -> list[str]:
    """What the user should know about the history the run read."""
    warnings: list[str] = []
    if len(all_brokers) == 1:
        warnings.append(
            f"the history has only one broker ({all_brokers[0]}): CV is 0 by definition "
            "and there is nothing to rebalance; add brokers' histories to compare strategies"
        )
    for broker, last in planned.built.departed.items():
        warnings.append(f"broker {broker} stopped reporting at {_iso(last)}: left out of the plan")
    if history.quarantined:
        total = sum(history.quarantined.values())
        kinds = ", ".join(f"{k}: {v}" for k, v in history.quarantined.items())
        warnings.append(
            f"{total} record(s) quarantined ({kinds}): see {run.options.out.rstrip('/')}/quarantine"
        )
    if compaction.open_hours:
        warnings.append(
            f"{len(compaction.open_hours)} hour(s) still being written were read from JSON "
            "(compacted once closed)"
        )
    return warnings


def _report(
    run: _Run,
    summary: dict[str, Any],
    comparison_pdf: pd.DataFrame,
    brokers_pdf: pd.DataFrame,
    topics: _TopicWindows,
    planned: _Planned,
    history: _History,
) -> str:
    """Stage 9: report.html with its charts; returns its path."""
    with run.stage("report"):
        path: str = report.write_report(
            run.out,
            summary,
            comparison_pdf,
            brokers_pdf,
            topics.top,
            planned.document,
            history.quarantine_summary,
            run.rules.cv_threshold,
            transforms.SCORE_COLUMNS[run.strategy],
        )
        return path


def _upload(run: _Run, outputs: dict[str, str]) -> dict[str, str]:
    """Stage 10 (remote outputs): replace the tables up there; the outputs' remote URLs."""
    with run.stage("upload"):
        target = run.options.out.rstrip("/")
        for name in (*TABLES, "charts"):
            storage.remove_tree(f"{target}/{name}", run.options.storage_options)
        storage.upload_tree(run.out, target, run.options.storage_options)
    return {name: f"{target}/{os.path.relpath(p, run.out)}" for name, p in outputs.items()}


def _plan_document(
    options: AnalyzeOptions,
    built: snapshot.BuiltSnapshot,
    plan: dict[str, Any],
    strategy: Strategy,
    window: float,
    horizon: float,
    stale_after: float,
) -> dict[str, Any]:
    """plan.json: the plan plus everything needed to review it."""
    snap = built.snapshot
    scores = {s.value: score_brokers(snap, s) for s in Strategy}
    rules = options.config.load_manager.rebalancing
    return {
        "version": 1,
        "history": options.history,
        "now": built.now,
        "now_utc": _iso(built.now),
        "strategy": strategy.value,
        "inputs": {
            "loads": f"p95 over the last {horizon:g} s of history, per topic and per broker",
            "window_seconds": window,
            "horizon_seconds": horizon,
            "stale_after_seconds": stale_after,
        },
        "rules": {
            "target_cv": rules.target_cv,
            "cv_threshold": rules.cv_threshold,
            "min_topic_age_seconds": rules.min_topic_age_seconds,
            "blacklist_topics": list(rules.blacklist_topics),
            "max_moves": options.max_moves,
            "brokers": "only active brokers send or receive topics",
        },
        "plan": plan,
        "brokers": [
            {
                "broker_id": b,
                "state": snap.state(b).mode.value,
                "last_report": snap.reports[b].timestamp,
                "topics": len(snap.topics_of(b)),
                "scores": {name: values[b] for name, values in scores.items()},
            }
            for b in snap.brokers
        ],
        "departed_brokers": [
            {"broker_id": b, "last_report": t, "last_report_utc": _iso(t)}
            for b, t in built.departed.items()
        ],
        "apply": (
            "Review, then apply the moves in order: unload each topic from from_broker with "
            "to_broker as the target (the admin rebalance/unload commands); re-run the "
            "analysis on fresh history before applying an old plan."
        ),
    }
