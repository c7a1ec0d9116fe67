"""`ballast tune`: replay the recorded history through the leader's machine once per
configuration of a grid, as Spark tasks, and say which configuration would have kept the
cluster balanced with the fewest moves.

The driver compacts the history (as `analyze` does), reads the range's `brokers` and
`topics` tables into a `RecordedHistory` (arrays) and broadcasts it; each combination of
the grid is one task (one partition each) that replays the whole range under its
`load_manager` section and returns its figures (`simulate.tuning.Outcome`). Replays
share nothing, so they spread over every executor core. Outputs, in `out`:

    tuning.parquet    one row per configuration: its settings and figures
    tuning.json       the same, the Pareto front, the recommendation and the run's inputs
    tuning.png        moves against CV p95, the Pareto front and the recommendation
    report.html       the chart and the table
    recommended.yaml  the load_manager section to paste, with the reason in a comment
"""

from __future__ import annotations

import html
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import yaml
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from ballast.pipeline import compact
from ballast.pipeline.schemas import COLUMNAR_SCHEMAS
from ballast.simulate.replay import (
    RecordedHistory,
    RecordedMove,
    ReplayOptions,
    recorded_moves,
    replay,
)
from ballast.simulate.tuning import (
    Grid,
    Outcome,
    Recommendation,
    outcome,
    pareto_front,
    recommend,
    recommended_section,
)

BROKER_COLUMNS = (
    "report_id",
    "broker_id",
    "timestamp",
    "state",
    "cpu_percent",
    "memory_percent",
    "disk_io_bps",
    "network_io_bps",
)
TOPIC_COLUMNS = (
    "report_id",
    "topic",
    "msg_rate",
    "byte_rate",
    "producers",
    "consumers",
    "subscriptions",
    "backlog",
)
JOB_GROUP = "ballast-tune"
BOLD = ' style="font-weight:bold"'  # the recommended row of the report's table


class TuneError(Exception):
    """A problem with the run's input, explained for the user (no traceback)."""


@dataclass(frozen=True)
class TuneOptions:
    history: str
    grid: Grid
    out: str
    start: float | None = None  # --from (inclusive), epoch seconds
    end: float | None = None  # --to (exclusive)
    now: float | None = None  # the wall clock for "which hours are closed" (tests)
    storage_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TuneResult:
    outcomes: tuple[Outcome, ...]
    pareto: tuple[int, ...]
    recommendation: Recommendation
    reports: int
    brokers: int
    topics: int
    live_moves: int  # the rebalancing moves the history shows
    start: float
    end: float
    outputs: Mapping[str, str]
    seconds: Mapping[str, float]


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat().replace("+00:00", "Z")


def read_history(
    columnar: compact.Columnar, start: float | None, end: float | None
) -> RecordedHistory:
    """The range's reports and topic rows, read on the driver by Arrow: every row goes to
    the driver anyway (each replay needs the whole range), and the partitions are local
    files (a remote history's are mirrored by the compaction), so Spark would only add
    a job per table."""
    hours = [h for h in columnar.hours if h.overlaps(start, end)]

    def table(name: str, columns: tuple[str, ...]) -> pa.Table:
        files = sorted(
            os.path.join(directory, f)
            for directory in columnar.paths(name, hours)
            for f in os.listdir(directory)
            if f.endswith(".parquet")
        )
        schema = to_arrow_schema(COLUMNAR_SCHEMAS[name])
        if not files:
            return schema.empty_table().select(list(columns))
        rows = ds.dataset(files, schema=schema, format="parquet").to_table(columns=list(columns))
        keep = pa.array(np.ones(rows.num_rows, dtype=bool))
        when = rows.column("timestamp") if "timestamp" in columns else None
        if when is not None and start is not None:
            keep = pc.and_(keep, pc.greater_equal(when, start))
        if when is not None and end is not None:
            keep = pc.and_(keep, pc.less(when, end))
        return rows.filter(keep)

    brokers = table("brokers", BROKER_COLUMNS)
    # A topic row belongs to its report: the reports' range picks them.
    topics = table("topics", (*TOPIC_COLUMNS, "timestamp"))
    return RecordedHistory.from_columns(
        {c: brokers.column(c).to_numpy(zero_copy_only=False) for c in BROKER_COLUMNS},
        {c: topics.column(c).to_numpy(zero_copy_only=False) for c in TOPIC_COLUMNS},
    )


def _replay_one(
    recorded: tuple[RecordedHistory, tuple[RecordedMove, ...]],
    grid: Grid,
    config_id: int,
    settings: Mapping[str, Any],
) -> Outcome:
    """One Spark task: one configuration's replay."""
    started = time.perf_counter()
    options = ReplayOptions(
        measure_strategy=grid.measure.strategy, overload_percent=grid.measure.overload_percent
    )
    history, live = recorded
    result = replay(history, grid.config(settings), options)
    seconds = time.perf_counter() - started
    return outcome(config_id, settings, result, grid.measure, seconds, live)


def replay_grid(
    spark: SparkSession,
    history: RecordedHistory,
    grid: Grid,
    progress: Callable[[int, int], None] | None = None,
) -> list[Outcome]:
    """Replay every combination, one Spark task each; `progress(done, total)` is called
    as tasks finish (polled from Spark's status tracker while the job runs)."""
    sc = spark.sparkContext
    combos = list(enumerate(grid.combinations()))
    # The history and the moves it shows, shipped once to every executor.
    shared = sc.broadcast((history, recorded_moves(history)))
    rdd = sc.parallelize(combos, len(combos)).map(
        lambda item: _replay_one(shared.value, grid, item[0], item[1])
    )
    results: list[list[Outcome]] = []
    errors: list[BaseException] = []

    def run() -> None:
        # The job group is per thread: it lets the tracker find this job's stages.
        sc.setJobGroup(JOB_GROUP, f"replaying {len(combos)} configurations")
        try:
            results.append(rdd.collect())
        except BaseException as exc:  # re-raised on the caller's thread
            errors.append(exc)

    worker = threading.Thread(target=run, name="ballast-tune", daemon=True)
    worker.start()
    tracker = sc.statusTracker()
    done = -1
    while worker.is_alive():
        worker.join(0.5)
        if progress is None:
            continue
        finished = 0
        for job in tracker.getJobIdsForGroup(JOB_GROUP):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info is not None else []:
                stage_info = tracker.getStageInfo(stage)
                finished += stage_info.numCompletedTasks if stage_info is not None else 0
        if finished != done:
            done = finished
            progress(min(done, len(combos)), len(combos))
    shared.unpersist()
    if errors:
        raise errors[0]
    if progress is not None:
        progress(len(combos), len(combos))
    return sorted(results[0], key=lambda o: o.config_id)


def _table(outcomes: list[Outcome], pareto: set[int], chosen: int) -> pd.DataFrame:
    rows = []
    for o in outcomes:
        row = {k: v for k, v in asdict(o).items() if k != "settings"}
        row["settings"] = json.dumps(o.settings, sort_keys=True)
        row["pareto"] = o.config_id in pareto
        row["recommended"] = o.config_id == chosen
        rows.append(row)
    return pd.DataFrame(rows)


def _label(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in settings.items())


def write_chart(outcomes: list[Outcome], pareto: list[int], chosen: int, path: str) -> None:
    """Moves against CV p95, one point per configuration; the front joined; the
    recommendation circled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_id = {o.config_id: o for o in outcomes}
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter(
        [o.moves for o in outcomes],
        [o.cv_p95 * 100 for o in outcomes],
        color="tab:gray",
        label="configurations",
        zorder=2,
    )
    front = [by_id[i] for i in pareto]
    ax.plot(
        [o.moves for o in front],
        [o.cv_p95 * 100 for o in front],
        color="tab:blue",
        marker="o",
        label="Pareto front",
        zorder=3,
    )
    best = by_id[chosen]
    ax.scatter(
        [best.moves],
        [best.cv_p95 * 100],
        s=220,
        facecolors="none",
        edgecolors="tab:red",
        linewidths=2,
        label="recommended",
        zorder=4,
    )
    ax.annotate(_label(best.settings), (best.moves, best.cv_p95 * 100), fontsize=8)
    ax.set_xlabel("moves over the range")
    ax.set_ylabel("CV p95 (%)")
    ax.set_title("Moves against imbalance, one replay per configuration")
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _html(result: TuneResult, table: pd.DataFrame, history: str) -> str:
    chosen = result.recommendation
    head = (
        "<th>id</th><th>settings</th><th>moves</th><th>moved MB/s</th><th>CV p50</th>"
        "<th>CV p95</th><th>CV max</th><th>min above threshold</th>"
        "<th>broker-min overloaded</th><th>live moves reproduced</th><th>Pareto</th>"
    )
    rows = "".join(
        f"<tr{BOLD if r.recommended else ''}>"
        f"<td>{r.config_id}</td><td>{html.escape(r.settings)}</td><td>{r.moves}</td>"
        f"<td>{r.moved_mbps:.2f}</td><td>{r.cv_p50:.1%}</td><td>{r.cv_p95:.1%}</td>"
        f"<td>{r.cv_max:.1%}</td><td>{r.minutes_above_threshold:.0f}</td>"
        f"<td>{r.broker_minutes_overloaded:.0f}</td><td>{r.live_moves_reproduced:.0%}</td>"
        f"<td>{'yes' if r.pareto else ''}</td></tr>"
        for r in table.itertuples()
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>ballast tune</title></head>"
        "<body style='font-family:sans-serif'>"
        f"<h1>Tuning on {html.escape(history)}</h1>"
        f"<p>{_iso(result.start)} to {_iso(result.end)}: {result.reports} reports from "
        f"{result.brokers} brokers, {result.topics} topics, {result.live_moves} rebalancing moves; "
        f"{len(result.outcomes)} "
        "configurations replayed through the leader's machine.</p>"
        f"<p><b>Recommended: configuration {chosen.config_id}</b>: "
        f"{html.escape(chosen.reason)} (recommended.yaml).</p>"
        "<img src='tuning.png' alt='moves against CV p95'>"
        f"<table border='1' cellpadding='4'><tr>{head}</tr>{rows}</table></body></html>"
    )


def run_tuning(
    spark: SparkSession,
    options: TuneOptions,
    stage: Callable[[str], None] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> TuneResult:
    """Compact, read, replay every combination and write the outputs (see the module)."""
    seconds: dict[str, float] = {}
    say = stage or (lambda _: None)
    scratch = tempfile.mkdtemp(prefix="ballast-tune-")
    try:
        clock = time.perf_counter()
        say("compact")
        try:
            _, columnar = compact.compact(
                spark,
                options.history,
                scratch,
                now=options.now,
                start=options.start,
                end=options.end,
                include_open=True,
                storage_options=options.storage_options,
            )
        except FileNotFoundError:
            raise TuneError(
                f"history directory {options.history} does not exist: pass the directory "
                "the history sink writes to"
            ) from None
        seconds["compact"] = time.perf_counter() - clock
        clock = time.perf_counter()
        say("read")
        history = read_history(columnar, options.start, options.end)
        compact.remove_work(columnar)
        seconds["read"] = time.perf_counter() - clock
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if history.reports < 2:
        within = ""
        if options.start is not None or options.end is not None:
            low = _iso(options.start) if options.start is not None else "the start"
            high = _iso(options.end) if options.end is not None else "the end"
            within = f" between {low} and {high}"
        raise TuneError(f"{options.history}: fewer than two load reports{within}")
    clock = time.perf_counter()
    say("replay")
    outcomes = replay_grid(spark, history, options.grid, progress)
    seconds["replay"] = time.perf_counter() - clock
    say("write")
    pareto = pareto_front(outcomes)
    chosen = recommend(outcomes)
    os.makedirs(options.out, exist_ok=True)
    outputs = {
        name: os.path.join(options.out, name)
        for name in ("tuning.parquet", "tuning.json", "tuning.png", "report.html")
    }
    outputs["recommended.yaml"] = os.path.join(options.out, "recommended.yaml")
    result = TuneResult(
        outcomes=tuple(outcomes),
        pareto=tuple(pareto),
        recommendation=chosen,
        reports=history.reports,
        brokers=len(history.brokers),
        topics=len(history.topics),
        live_moves=len(recorded_moves(history)),
        start=history.start,
        end=history.end,
        outputs=outputs,
        seconds={k: round(v, 3) for k, v in seconds.items()},
    )
    table = _table(outcomes, set(pareto), chosen.config_id)
    table.to_parquet(outputs["tuning.parquet"], index=False)
    grid = options.grid
    summary = {
        "history": options.history,
        "from": _iso(history.start),
        "to": _iso(history.end),
        "reports": history.reports,
        "brokers": len(history.brokers),
        "topics": len(history.topics),
        "live_moves": result.live_moves,
        "step_seconds": history.report_interval,
        "measure": asdict(grid.measure),
        "base": grid.base,
        "grid": {k: list(v) for k, v in grid.axes},
        "configurations": [asdict(o) for o in outcomes],
        "pareto": pareto,
        "recommended": {
            "config_id": chosen.config_id,
            "settings": outcomes[chosen.config_id].settings,
            "reason": chosen.reason,
        },
        "seconds": result.seconds,
    }
    with open(outputs["tuning.json"], "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2, default=str)
    write_chart(outcomes, pareto, chosen.config_id, outputs["tuning.png"])
    with open(outputs["report.html"], "w", encoding="utf-8") as handle:
        handle.write(_html(result, table, options.history))
    section = recommended_section(grid, outcomes[chosen.config_id].settings)
    with open(outputs["recommended.yaml"], "w", encoding="utf-8") as handle:
        handle.write(
            f"# Recommended by `ballast tune` on {options.history}, "
            f"{_iso(history.start)} to {_iso(history.end)}, out of {len(outcomes)} "
            "configurations replayed through the leader's machine.\n"
            f"# Why: {chosen.reason}.\n"
            "# Settings not listed keep their defaults.\n"
        )
        yaml.safe_dump(section, handle, sort_keys=False)
    return result
