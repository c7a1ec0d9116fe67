"""Benchmark of the load-history pipeline: Spark local[2] against a single-process pandas
baseline doing the same aggregations on the same files. Prints JSON.

    python benchmarks/bench_pipeline.py                 # 1M, 10M and 30M topic rows
    python benchmarks/bench_pipeline.py --sizes 1M,10M  # a subset
    python benchmarks/bench_pipeline.py --sizes 50k --no-spark  # what --quick runs
    python benchmarks/bench_pipeline.py --sizes 10M --rounds 3 --no-tuning --no-fidelity

For each size: generate a history (2000 topics, 10 brokers, 30 s reports; the hours
follow from the size), then on local[2]:

- the whole first run of `analyze`: compaction of every hour (JSON → columnar, with
  validation, quarantine and deduplication), then the analysis (windows, strategy
  comparison, topic windows, plan, report); compaction rows/s is topic rows over the
  compaction stage;
- a second `analyze` of the same history: nothing left to compact, so this is the
  analysis from the columnar tables alone (rows/s over the whole job);
- the pandas baseline in a forked process (its seconds and peak RSS): `json.loads` per
  line, flatten, the broker and topic window aggregates, strategy scores and CV. It does
  no validation, quarantine, deduplication, plan or report, so the ratio flatters pandas;
- Spark's peak driver memory: the peak RSS of the driver JVM (in local mode the driver is
  all of Spark), so far in the run (sizes run in increasing order).

Then the tuning figure (`ballast tune`'s replays): one hour of 100 brokers × 10 000
topics (the generator's history: a broker joins, one dies), read once into a
`RecordedHistory`, and a grid of `--tuning-configs` configurations replayed through the
leader's machine as Spark tasks, on `local[1]` and then `local[2]` (a session each, its
start not counted): configurations replayed per minute, and one replay in-process (no
Spark) for reference. Then the replay's fidelity: a live in-process cluster
(`LocalCluster`: the brokers' and the leader's real shells, wall clock, 0.25 s reports,
1 s checks) records its history while two brokers join; the history is replayed with the
same configuration and the share of the live moves reproduced (same topic, same
destination, within a check plus a report interval) is reported with both CV
trajectories. `--tuning-only` runs just these two; `--no-tuning` and `--no-fidelity` skip
them.

`--quick` (the test suite's run) generates the smallest history (50k: a quarter of an hour,
~56k topic rows) and runs the pandas baseline on it WITHOUT Spark (`--no-spark`): each
size's Spark fields are left out, `spark_session_start_seconds` and `spark_master` are null.
Spark on even that size took 80 s of wall time on the loaded 2-core test machine (its own
JVM, ~15 s, then two `analyze` runs, ~45 s and ~17 s), far more than a quick run may; the
Spark job itself is covered by `tests/pipeline/` on the suite's shared session. The
quick tuning figure is the in-process replay of a small history (6 brokers, 120 topics,
a quarter of an hour); `ballast tune` on Spark is covered by `tests/pipeline/test_tune.py`.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import SparkSession

from ballast.balance.scoring import (
    balanced_score,
    fair_score,
    topic_load_score,
    weighted_load_score,
)
from ballast.pipeline.arrow_compact import convert
from ballast.pipeline.generate import GeneratedHistory, GeneratorSpec, generate_history
from ballast.pipeline.job import AnalyzeOptions, run_analysis
from ballast.pipeline.session import build_session
from ballast.pipeline.transforms import add_usage_ewma
from ballast.pipeline.tune import replay_grid
from ballast.simulate.replay import (
    RecordedHistory,
    ReplayOptions,
    fidelity,
    recorded_moves,
    replay,
)
from ballast.simulate.tuning import parse_grid

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cli import emit, parse_args

TOPICS, BROKERS, INTERVAL = 2000, 10, 30.0
WINDOW = 300.0
# 50k: the smallest history the generator makes here (a quarter of an hour, ~55k rows).
SIZES = {"50k": 50_000, "1M": 1_000_000, "10M": 10_000_000, "30M": 30_000_000}


def _hours_for(rows: int) -> float:
    # ~92 % of topics exist on average (15 % are created during the run).
    per_hour = 3600 / INTERVAL * TOPICS * 0.925
    return math.ceil(rows / per_hour * 4) / 4


def pandas_baseline(files: list[str]) -> dict[str, Any]:
    """The job's aggregations in plain pandas/NumPy, one process."""
    started = time.perf_counter()
    brokers: list[tuple[Any, ...]] = []
    t_broker, t_ts, t_topic, t_msg, t_byte, t_conn, t_backlog = [], [], [], [], [], [], []
    for path in files:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                d = json.loads(line)
                topics = d["topics"]
                conn = sum(t["producers"] + t["consumers"] for t in topics)
                brokers.append(
                    (
                        d["broker_id"],
                        d["timestamp"],
                        d["cpu_percent"],
                        d["memory_percent"],
                        d["disk_io_bps"],
                        d["network_io_bps"],
                        len(topics),
                        d["total_throughput_mbps"],
                        conn,
                        d["total_backlog"],
                    )
                )
                for t in topics:
                    t_broker.append(d["broker_id"])
                    t_ts.append(d["timestamp"])
                    t_topic.append(t["topic"])
                    t_msg.append(t["msg_rate"])
                    t_byte.append(t["byte_rate"])
                    t_conn.append(t["producers"] + t["consumers"])
                    t_backlog.append(t["backlog"])
    parsed = time.perf_counter()
    b = pd.DataFrame(
        brokers,
        columns=[
            "broker_id",
            "timestamp",
            "cpu",
            "mem",
            "disk",
            "net",
            "topic_count",
            "thr",
            "conn",
            "backlog",
        ],
    )
    topics = pd.DataFrame(
        {
            "broker_id": t_broker,
            "timestamp": t_ts,
            "topic": pd.Categorical(t_topic),
            "msg_rate": t_msg,
            "byte_rate": t_byte,
            "connections": t_conn,
            "backlog": t_backlog,
        }
    )
    del brokers, t_broker, t_ts, t_topic, t_msg, t_byte, t_conn, t_backlog
    flattened = time.perf_counter()

    # Broker windows.
    b["window_start"] = np.floor(b["timestamp"] / WINDOW) * WINDOW
    b["wtl"] = topic_load_score(b["topic_count"], b["thr"], b["conn"], b["backlog"])
    b["usage"] = np.maximum(b["cpu"], b["mem"])
    g = b.groupby(["window_start", "broker_id"], sort=True)
    stats = {}
    for col in ("cpu", "mem", "thr", "topic_count"):
        stats[f"{col}_mean"] = g[col].mean()
        stats[f"{col}_p95"] = g[col].quantile(0.95)
        stats[f"{col}_max"] = g[col].max()
    for col in ("disk", "net", "wtl"):
        stats[f"{col}_mean"] = g[col].mean()
    stats["usage_mean"] = g["usage"].mean()
    bw = pd.DataFrame(stats).reset_index()
    bw = add_usage_ewma(bw)

    # Strategy scores and statistics per window.
    per_window = bw.groupby("window_start")

    def norm(col: str) -> pd.Series:
        return bw[col] / np.maximum(1.0, per_window[col].transform("max"))

    reports_resources = (per_window["cpu_mean"].transform("max") > 0) | (
        per_window["mem_mean"].transform("max") > 0
    )
    bw["fair"] = fair_score(bw["topic_count_mean"])
    bw["balanced"] = np.where(
        reports_resources,
        balanced_score(bw["wtl_mean"], bw["cpu_mean"], bw["mem_mean"]),
        bw["fair"],
    )
    bw["weighted_load"] = weighted_load_score(
        norm("cpu_mean"),
        norm("mem_mean"),
        norm("disk_mean"),
        norm("net_mean"),
        norm("thr_mean"),
        norm("wtl_mean"),
    )
    comparison = []
    for strategy in ("fair", "balanced", "weighted_load"):
        s = bw.groupby("window_start")[strategy].agg(["count", "mean", "min", "max"])
        s["std"] = bw.groupby("window_start")[strategy].std(ddof=0)
        s["cv"] = np.where((s["count"] >= 2) & (s["mean"] > 0), s["std"] / s["mean"], 0.0)
        comparison.append(s.assign(strategy=strategy))
    strategy_table = pd.concat(comparison)
    brokers_done = time.perf_counter()

    # Topic windows.
    topics["window_start"] = np.floor(topics["timestamp"] / WINDOW) * WINDOW
    topics["load_score"] = topic_load_score(
        1, topics["byte_rate"] / 1e6, topics["connections"], topics["backlog"]
    )
    topics = topics.sort_values(["window_start", "topic", "timestamp"], kind="stable")
    tg = topics.groupby(["window_start", "topic"], sort=True, observed=True)
    tw = pd.DataFrame(
        {
            "broker_id": tg["broker_id"].last(),
            "samples": tg["msg_rate"].size(),
            "msg_rate_mean": tg["msg_rate"].mean(),
            "msg_rate_p95": tg["msg_rate"].quantile(0.95),
            "byte_rate_mean": tg["byte_rate"].mean(),
            "byte_rate_p95": tg["byte_rate"].quantile(0.95),
            "connections_mean": tg["connections"].mean(),
            "load_score_mean": tg["load_score"].mean(),
            "load_score_p95": tg["load_score"].quantile(0.95),
            "backlog_first": tg["backlog"].first(),
            "backlog_last": tg["backlog"].last(),
        }
    )
    # Least-squares slope from centred sums.
    x = topics["timestamp"] - tg["timestamp"].transform("mean")
    y = topics["backlog"] - tg["backlog"].transform("mean")
    sxy = (x * y).groupby([topics["window_start"], topics["topic"]], observed=True).sum()
    sxx = (x * x).groupby([topics["window_start"], topics["topic"]], observed=True).sum()
    tw["backlog_slope"] = (sxy / sxx.where(sxx > 0)).to_numpy()
    done = time.perf_counter()
    return {
        "seconds": round(done - started, 2),
        "parse_seconds": round(parsed - started, 2),
        "flatten_seconds": round(flattened - parsed, 2),
        "broker_and_strategy_seconds": round(brokers_done - flattened, 2),
        "topic_windows_seconds": round(done - brokers_done, 2),
        "broker_windows": len(bw),
        "strategy_rows": len(strategy_table),
        "topic_windows": len(tw),
    }


def _forked(files: list[str]) -> dict[str, Any]:
    """The pandas baseline in a child process: its result plus its peak RSS."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, report, exit without cleanup handlers
        os.close(read)
        try:
            payload = json.dumps(pandas_baseline(files)).encode()
        except BaseException as exc:
            payload = json.dumps({"error": repr(exc)}).encode()
        with os.fdopen(write, "wb") as handle:
            handle.write(payload)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as handle:
        data = handle.read()
    _, _, usage = os.wait4(pid, 0)
    result: dict[str, Any] = json.loads(data)
    result["peak_rss_mb"] = round(usage.ru_maxrss / 1024)  # Linux: KiB
    return result


def _driver_peak_mb(spark: SparkSession) -> int | None:
    """Peak RSS (VmHWM) of the driver JVM, in MB."""
    process = spark.sparkContext._gateway.proc  # type: ignore[union-attr]
    pids = [process.pid]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                    if int(handle.read().rsplit(")", 1)[1].split()[1]) == process.pid:
                        pids.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    peak = None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        kib = int(line.split()[1])
                        peak = max(peak or 0, round(kib / 1024))
        except OSError:
            continue
    return peak


def spark_run(
    spark: SparkSession, history: str, out: str, topic_rows: int
) -> tuple[dict[str, Any], float, float]:
    """Spark's figures for one history: the first `analyze` (compaction included), then a
    second one (the analysis from the columnar tables alone); with both runs' seconds."""
    t0 = time.perf_counter()
    result = run_analysis(spark, AnalyzeOptions(history=history, out=out, window_seconds=WINDOW))
    first_seconds = time.perf_counter() - t0
    compact_seconds = result.timings["compact"]
    t0 = time.perf_counter()
    again = run_analysis(spark, AnalyzeOptions(history=history, out=out, window_seconds=WINDOW))
    analysis_seconds = time.perf_counter() - t0
    columnar_bytes = sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, names in os.walk(os.path.join(history, "_columnar"))
        for f in names
    )
    fields: dict[str, Any] = {
        "columnar_bytes": columnar_bytes,
        "first_run_seconds": round(first_seconds, 2),
        "first_run_rows_per_second": round(topic_rows / first_seconds),
        "compaction_seconds": compact_seconds,
        "compaction_rows_per_second": round(topic_rows / compact_seconds),
        "analysis_seconds": round(analysis_seconds, 2),
        "analysis_rows_per_second": round(topic_rows / analysis_seconds),
        "first_run_stage_seconds": result.timings,
        "analysis_stage_seconds": again.timings,
        "compacted_hours": result.compacted_hours,
        "recompacted_hours_on_second_run": again.compacted_hours,
        "spark_driver_peak_rss_mb": _driver_peak_mb(spark),
        "topic_windows": len(
            pd.read_parquet(os.path.join(out, "topic_windows"), columns=["topic"])
        ),
        "plan_moves": len(result.plan["plan"]["moves"]),
    }
    return fields, first_seconds, analysis_seconds


def _round(
    spark: SparkSession | None, history: str, out: str, gen: GeneratedHistory, no_pandas: bool
) -> dict[str, Any]:
    """One round of a size: Spark's two runs and the pandas baseline right after, with
    the load average seen (other work on the machine slows both)."""
    fields: dict[str, Any] = {}
    if spark is not None:
        spark_fields, first_seconds, analysis_seconds = spark_run(
            spark, history, out, gen.topic_rows
        )
        fields.update(spark_fields)
    if not no_pandas:
        gc.collect()
        baseline = _forked(list(gen.files))
        fields["pandas"] = baseline
        if "seconds" in baseline:
            fields["pandas_rows_per_second"] = round(gen.topic_rows / baseline["seconds"])
        if "seconds" in baseline and spark is not None:
            # > 1: Spark's whole first run (compaction included) is faster.
            fields["pandas_over_spark_first_run"] = round(baseline["seconds"] / first_seconds, 2)
            fields["pandas_over_spark_analysis"] = round(baseline["seconds"] / analysis_seconds, 2)
        gc.collect()
    fields["load_average_1m"] = round(os.getloadavg()[0], 2)
    return fields


# The tuning figure's history, full size and quick; and the grid whose first
# `--tuning-configs` combinations are replayed.
TUNING_SIZE = {"brokers": 100, "topics": 10_000, "hours": 1.0}
TUNING_QUICK_SIZE = {"brokers": 6, "topics": 120, "hours": 0.25}
TUNING_AXES: dict[str, list[Any]] = {
    "rebalancing.cv_threshold": [0.2, 0.3, 0.4],
    "rebalancing.max_moves_per_hour": [5, 10, 20],
    "assignment_strategy": ["balanced", "fair"],
}


def _recorded(history: str) -> RecordedHistory:
    """The history's reports converted by the compaction's own Arrow path, in-process:
    the figure is the replays', not the compaction's (measured above)."""
    topics, brokers = [], []
    for index, path in enumerate(sorted(Path(history).glob("date=*/hour=*/*.jsonl"))):
        t, b = convert(path.read_bytes(), index, str(path))
        topics.append(t)
        brokers.append(b)
    t_all, b_all = pa.concat_tables(topics), pa.concat_tables(brokers)
    return RecordedHistory.from_columns(
        {c: b_all.column(c).to_numpy(zero_copy_only=False) for c in b_all.column_names},
        {c: t_all.column(c).to_numpy(zero_copy_only=False) for c in t_all.column_names},
    )


def _grid_of(configs: int) -> dict[str, Any]:
    """A grid of `configs` combinations: the first axis values that multiply to it."""
    axes: dict[str, list[Any]] = {}
    left = configs
    for key, values in TUNING_AXES.items():
        take = next(n for n in range(min(left, len(values)), 0, -1) if left % n == 0)
        axes[key] = values[:take]
        left //= take
    if left != 1:
        raise SystemExit(f"--tuning-configs {configs}: use a divisor of 18 (2, 3, 4, 6, 9, 18)")
    return {"base": {"rebalancing": {"enabled": True}}, "grid": axes}


def _live_cluster(history: str, report: float, check: float, topics: int) -> int:
    """A live in-process cluster (`LocalCluster`: the brokers' and the leader's real
    shells over a `MemoryStore`, the wall clock, mixed traffic) records its history: two
    brokers take `topics` topics, two more join and rebalancing spreads the load. Returns
    the moves in the store's rebalancing history."""
    import asyncio

    from ballast.clock import SystemClock
    from ballast.cluster import AdminClient, LocalCluster
    from ballast.cluster.host import mixed_profiles
    from ballast.metadata.memory import MemoryStore

    config = _live_config(report, check)

    async def run() -> int:
        clock = SystemClock()
        async with MemoryStore(clock) as store:
            admin = AdminClient(store, clock, config)
            async with LocalCluster(
                store, clock, config, profiles=mixed_profiles, history_dir=history
            ) as cluster:
                for broker in ("b1", "b2"):
                    await cluster.start_broker(broker)
                await cluster.wait_leader()
                await admin.create_topics(f"/live/t{i:03d}" for i in range(topics))
                await asyncio.sleep(6 * check)
                for broker in ("b3", "b4"):
                    await cluster.start_broker(broker)
                await asyncio.sleep(20 * check)
                return len(await admin.history())

    return asyncio.run(run())


def _live_config(report: float, check: float) -> Any:
    from ballast.config import parse_config

    return parse_config(
        {
            "load_manager": {
                "load_report_interval_seconds": report,
                "assignment_strategy": "balanced",
                "rebalancing": {
                    "enabled": True,
                    "check_interval_seconds": check,
                    "cooldown_seconds": 0,
                    "min_topic_age_seconds": 0,
                    "max_moves_per_hour": 10_000,
                },
            },
            "broker": {"registration_ttl_seconds": 2.0, "leader_ttl_seconds": 2.0},
            "metrics": {"enabled": False},
        }
    )


def live_fidelity(workdir: str, report: float = 0.25, check: float = 1.0) -> dict[str, Any]:
    """The share of a live cluster's moves a replay with its configuration reproduces
    (same topic, same destination, within one check interval plus one report interval),
    and both CV trajectories."""
    history = os.path.join(workdir, "history-live")
    shutil.rmtree(history, ignore_errors=True)
    store_moves = _live_cluster(history, report, check, topics=60)
    recorded = _recorded(history)
    shutil.rmtree(history, ignore_errors=True)
    live = recorded_moves(recorded)
    result = replay(
        recorded, _live_config(report, check).load_manager, ReplayOptions(recorded_cv=True)
    )
    tolerance = check + recorded.report_interval
    match = fidelity(live, result.moves, tolerance)
    step = max(1, len(result.samples) // 12)
    return {
        "report_interval_seconds": report,
        "check_interval_seconds": check,
        "reports": recorded.reports,
        "store_moves": store_moves,
        "live_moves": match.live_moves,
        "replay_moves": match.replay_moves,
        "reproduced": match.reproduced,
        "share": round(match.share, 3),
        "tolerance_seconds": round(tolerance, 3),
        "cv": [
            {
                "t": round(s.t - recorded.start, 1),
                "replay": round(s.cv, 3),
                "live": round(s.recorded_cv or 0.0, 3),
            }
            for s in result.samples[::step]
        ],
    }


def tuning_run(
    workdir: str, size: dict[str, float], configs: int, masters: list[str], driver_memory: str
) -> dict[str, Any]:
    """Configurations replayed per minute: in-process, then on each Spark master."""
    history = os.path.join(workdir, "history-tuning")
    shutil.rmtree(history, ignore_errors=True)
    spec = GeneratorSpec(
        brokers=int(size["brokers"]), topics=int(size["topics"]), hours=size["hours"], seed=1
    )
    gen = generate_history(spec, history)
    t0 = time.perf_counter()
    recorded = _recorded(history)
    read_seconds = time.perf_counter() - t0
    shutil.rmtree(history, ignore_errors=True)
    grid = parse_grid(_grid_of(configs), "bench grid")
    t0 = time.perf_counter()
    one = replay(recorded, grid.config(grid.combinations()[0]), ReplayOptions())
    one_seconds = time.perf_counter() - t0
    entry: dict[str, Any] = {
        **size,
        "reports": recorded.reports,
        "topic_rows": gen.topic_rows,
        "read_seconds": round(read_seconds, 2),
        "configurations": len(grid.combinations()),
        "in_process_replay_seconds": round(one_seconds, 2),
        "in_process_configurations_per_minute": round(60 / one_seconds, 2),
        "moves_of_first_configuration": len(one.moves),
    }
    for master in masters:
        spark = build_session(master, app_name="ballast-bench-tune", driver_memory=driver_memory)
        try:
            t0 = time.perf_counter()
            outcomes = replay_grid(spark, recorded, grid)
            seconds = time.perf_counter() - t0
        finally:
            spark.stop()
        entry[master] = {
            "seconds": round(seconds, 2),
            "configurations_per_minute": round(len(outcomes) * 60 / seconds, 2),
        }
        print(json.dumps({master: entry[master]}), file=sys.stderr, flush=True)
    if "local[1]" in entry and "local[2]" in entry:
        entry["local2_over_local1"] = round(
            entry["local[2]"]["configurations_per_minute"]
            / entry["local[1]"]["configurations_per_minute"],
            2,
        )
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", default="1M,10M,30M", help=f"comma-separated: {', '.join(SIZES)}"
    )
    parser.add_argument(
        "--driver-memory",
        default="1g",
        help="the Spark driver's heap (the goal: the whole job with the driver under 2 GB RSS)",
    )
    parser.add_argument("--workdir", default=None, help="where to generate (default: a temp dir)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds per size on the same history, each compacting again (with several: "
        "each round's figures under `rounds`, the ratios their median)",
    )
    parser.add_argument("--no-pandas", action="store_true", help="skip the pandas baseline")
    parser.add_argument(
        "--no-spark", action="store_true", help="skip Spark: generate and the pandas baseline"
    )
    parser.add_argument("--no-tuning", action="store_true", help="skip the tuning figure")
    parser.add_argument(
        "--tuning-only",
        action="store_true",
        help="only the tuning figure and the replay's fidelity (no analyze sizes)",
    )
    parser.add_argument(
        "--no-fidelity", action="store_true", help="skip the live cluster's fidelity figure"
    )
    parser.add_argument(
        "--tuning-configs", type=int, default=4, help="configurations replayed per master"
    )
    args = parse_args(
        parser, quick={"sizes": "50k", "no_spark": True, "tuning_configs": 2, "no_fidelity": True}
    )
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {unknown}: choose from {', '.join(SIZES)}")
    if args.tuning_only:
        sizes = []
    workdir = args.workdir or tempfile.mkdtemp(prefix="ballast-bench-")
    started = time.perf_counter()
    spark = None
    if not args.no_spark and sizes:
        spark = build_session(
            "local[2]", app_name="ballast-bench", driver_memory=args.driver_memory
        )
    session_seconds = round(time.perf_counter() - started, 2) if spark is not None else None
    results = []
    tuning: dict[str, Any] | None = None
    replay_fidelity: dict[str, Any] | None = None
    try:
        for size in sizes:
            history = os.path.join(workdir, f"history-{size}")
            out = os.path.join(workdir, f"out-{size}")
            shutil.rmtree(history, ignore_errors=True)
            t0 = time.perf_counter()
            gen = generate_history(
                GeneratorSpec(
                    brokers=BROKERS,
                    topics=TOPICS,
                    hours=_hours_for(SIZES[size]),
                    seed=1,
                    interval_seconds=INTERVAL,
                ),
                history,
            )
            gen_seconds = time.perf_counter() - t0
            entry: dict[str, Any] = {
                "size": size,
                "topic_rows": gen.topic_rows,
                "reports": gen.reports,
                "history_bytes": sum(os.path.getsize(f) for f in gen.files),
                "generate_seconds": round(gen_seconds, 2),
            }
            rounds = []
            for _ in range(args.rounds):
                # Each round starts from the JSON alone: its first run compacts again.
                shutil.rmtree(os.path.join(history, "_columnar"), ignore_errors=True)
                rounds.append(_round(spark, history, out, gen, args.no_pandas))
            entry.update(rounds[-1])
            if args.rounds > 1:
                entry["rounds"] = rounds
                for ratio in ("pandas_over_spark_first_run", "pandas_over_spark_analysis"):
                    if ratio in rounds[0]:
                        entry[ratio] = round(float(np.median([r[ratio] for r in rounds])), 2)
            results.append(entry)
            print(json.dumps(entry), file=sys.stderr, flush=True)
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(history, ignore_errors=True)
        if spark is not None:
            spark.stop()
            spark = None
        if not args.no_tuning:
            # Sessions one after the other: one SparkContext per process.
            tuning = tuning_run(
                workdir,
                TUNING_QUICK_SIZE if args.quick else TUNING_SIZE,
                args.tuning_configs,
                [] if args.no_spark else ["local[1]", "local[2]"],
                args.driver_memory,
            )
            print(json.dumps({"tuning": tuning}), file=sys.stderr, flush=True)
        if not args.no_fidelity:
            replay_fidelity = live_fidelity(workdir)
            print(json.dumps({"fidelity": replay_fidelity}), file=sys.stderr, flush=True)
    finally:
        if spark is not None:
            spark.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    emit(
        {
            "benchmark": "pipeline",
            "machine": {
                "cpus": os.cpu_count(),
                "spark_master": "local[2]" if spark is not None else None,
                "driver_memory": args.driver_memory,
            },
            "spark_session_start_seconds": session_seconds,
            "results": results,
            "tuning": tuning,
            "replay_fidelity": replay_fidelity,
        }
    )


if __name__ == "__main__":
    main()
