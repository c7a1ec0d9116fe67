"""`ballast history generate|compact` and `ballast analyze`: the load-history pipeline's
commands.

Spark and the pipeline modules are imported inside the commands, so `ballast --help`
does not pay for starting PySpark. Run stand-alone with `python -m ballast.cli.pipeline`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ballast.cli.spark import spark_session, stage_progress
from ballast.config import ConfigError, Strategy, load_config

if TYPE_CHECKING:
    from ballast.pipeline.job import AnalysisResult

STAGE_LABELS = {
    "compact": "compacting new hours of JSON into the columnar history",
    "read": "reading the columnar history",
    "quarantine": "writing the quarantine",
    "brokers": "broker windows and scores",
    "strategies": "comparing strategies",
    "topics": "topic windows",
    "plan": "planning moves",
    "report": "writing report.html",
    "upload": "uploading outputs",
}

# Options `history compact` and `analyze` share.
HistoryOption = Annotated[
    str, typer.Option(help="History directory or s3:// URL (the sink's root).")
]
MasterOption = Annotated[
    str, typer.Option(help="Spark master: local[*], spark://host:port, yarn, k8s://…")
]
ExecutorMemoryOption = Annotated[
    str | None, typer.Option(help="spark.executor.memory on a cluster (default: Spark's).")
]
StorageOption = Annotated[
    list[str] | None,
    typer.Option(help="fsspec option KEY=VALUE for s3:// paths (repeatable)."),
]


def _storage_options(pairs: list[str] | None, console: Console) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            console.print(f"[red]error:[/red] --storage-option {pair!r}: expected KEY=VALUE")
            raise typer.Exit(2)
        options[key] = value
    return options


def print_summary(result: AnalysisResult, console: Console) -> None:
    """The end-of-run table: inputs, outcome, strategies, plan and where things are."""
    table = Table(title="ballast analyze", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("history files", str(result.files))
    table.add_row(
        "compacted now",
        f"{result.compacted_hours} hour(s)"
        + (f"; {result.open_hours} open hour(s) read from JSON" if result.open_hours else ""),
    )
    table.add_row("records", f"{result.records} ({result.reports} valid reports)")
    quarantined = sum(result.quarantined.values())
    detail = ", ".join(f"{k} {v}" for k, v in sorted(result.quarantined.items()))
    table.add_row("quarantined", f"{quarantined}" + (f" ({detail})" if detail else ""))
    table.add_row("brokers", f"{len(result.brokers)}: {', '.join(result.brokers)}")
    table.add_row("topics", str(result.topics))
    table.add_row("windows", str(result.windows))
    for row in result.strategies:
        table.add_row(
            f"CV {row['strategy']}",
            f"mean {row['mean_cv']:.1%}, max {row['max_cv']:.1%}, last {row['last_cv']:.1%} "
            f"({row['windows_above_threshold']}/{row['windows']} windows above threshold)",
        )
    plan = result.plan["plan"]
    table.add_row(
        "plan",
        f"{len(plan['moves'])} move(s) under {plan['strategy']}: CV "
        f"{plan['before']['cv']:.1%} → {plan['after']['cv']:.1%}; {plan['reason']}",
    )
    for name, path in result.outputs.items():
        table.add_row(name, path)
    table.add_row("time", ", ".join(f"{k} {v:.1f}s" for k, v in result.timings.items()))
    console.print(table)
    for warning in result.warnings:
        console.print(f"[yellow]note:[/yellow] {warning}")


def register(app: typer.Typer) -> None:
    """Add `history generate`, `history compact` and `analyze` to `app`."""
    history_app = typer.Typer(
        help="Load-history files: the data the pipeline analyses.", no_args_is_help=True
    )
    app.add_typer(history_app, name="history")

    @history_app.command("generate")
    def generate_cmd(
        out: Annotated[
            str, typer.Option(help="Directory or s3:// URL to write the history under.")
        ],
        brokers: Annotated[
            int, typer.Option(help="Brokers (≥3 adds a late joiner and a failure).")
        ] = 4,
        topics: Annotated[int, typer.Option(help="Topics, with Zipf-skewed popularity.")] = 200,
        hours: Annotated[float, typer.Option(help="Length of the history in hours.")] = 24.0,
        seed: Annotated[
            int, typer.Option(help="Random seed: the same seed gives the same files.")
        ] = 0,
        interval: Annotated[
            float, typer.Option(help="Seconds between a broker's load reports.")
        ] = 30.0,
        storage_option: Annotated[
            list[str] | None,
            typer.Option(help="fsspec option KEY=VALUE for remote --out (repeatable)."),
        ] = None,
    ) -> None:
        """Write a synthetic load history in the history sink's exact format.

        Files go to OUT/date=YYYY-MM-DD/hour=HH/generator.jsonl, one LoadReport JSON per
        line. The cluster has a diurnal cycle, Zipf topic popularity, growing topics and
        backlogs, topics created over time, a broker that joins half-way and one that
        dies at three quarters (with 3 or more brokers).
        """
        from ballast.pipeline.generate import GeneratorError, GeneratorSpec, generate_history

        console = Console(stderr=True)
        spec = GeneratorSpec(
            brokers=brokers, topics=topics, hours=hours, seed=seed, interval_seconds=interval
        )
        try:
            spec.validate()
            with Progress(
                TextColumn("generating"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} hours"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress:
                task = progress.add_task("generate", total=None)
                result = generate_history(
                    spec,
                    out,
                    _storage_options(storage_option, console),
                    on_hour=lambda done, total: progress.update(task, completed=done, total=total),
                )
        except GeneratorError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
        console.print(
            f"wrote {result.reports} reports ({result.topic_rows} topic rows) from "
            f"{len(result.brokers)} brokers in {len(result.files)} file(s) under {out}"
        )
        for broker, at in result.joined.items():
            console.print(f"  {broker} joins at {at:.0f}")
        for broker, at in result.died.items():
            console.print(f"  {broker} dies at {at:.0f}")

    @history_app.command("compact")
    def compact_cmd(
        history: HistoryOption,
        master: MasterOption = "local[*]",
        grace: Annotated[
            str, typer.Option(help="An hour is closed this long after it ends (late reports).")
        ] = "5m",
        driver_memory: Annotated[str, typer.Option(help="Spark driver memory.")] = "2g",
        executor_memory: ExecutorMemoryOption = None,
        driver_host: Annotated[
            str, typer.Option(help="Driver address executors connect to.")
        ] = "127.0.0.1",
        storage_option: StorageOption = None,
    ) -> None:
        """Turn every closed hour of JSON lines into the columnar history (Parquet).

        Writes HISTORY/_columnar/{topics,brokers,quarantine}/date=…/hour=…, once per hour.

        Incremental: only new or changed hours. Idempotent: a re-run does nothing.

        Atomic per hour: a crash leaves no partial hour visible.

        Clean files are converted by Arrow on the executors; an hour with anything to
        quarantine goes through Spark's JSON reader, which names every problem.

        Hours still being written stay JSON until they close. `analyze` runs this step.
        """
        import shutil
        import tempfile

        from ballast.pipeline import compact
        from ballast.pipeline.job import PipelineError, parse_duration

        console = Console(stderr=True)
        try:
            grace_seconds = parse_duration(grace)
        except PipelineError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
        options = _storage_options(storage_option, console)
        with spark_session(
            console,
            master,
            app_name="ballast-compact",
            driver_memory=driver_memory,
            executor_memory=executor_memory,
            driver_host=driver_host,
        ) as spark:
            scratch = tempfile.mkdtemp(prefix="ballast-compact-")
            try:
                with console.status("compacting"):
                    result, _ = compact.compact(
                        spark,
                        history,
                        scratch,
                        grace_seconds=grace_seconds,
                        storage_options=options,
                    )
            except FileNotFoundError:
                console.print(
                    f"[red]error:[/red] history directory {history} does not exist: pass the "
                    "directory the history sink writes to"
                )
                raise typer.Exit(1) from None
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        out = Console()
        quarantined = result.quarantined
        detail = ", ".join(f"{k} {v}" for k, v in sorted(quarantined.items()))
        if result.compacted:
            out.print(
                f"compacted {len(result.compacted)} hour(s) into {result.table}: "
                f"{result.reports} reports, {result.topic_rows} topic rows, "
                f"{sum(quarantined.values())} quarantined"
                + (f" ({detail})" if detail else "")
                + f" in {result.seconds:.1f}s"
            )
        else:
            out.print(f"nothing to compact: {result.unchanged} hour(s) already compacted")
        if result.compacted and result.unchanged:
            out.print(f"{result.unchanged} hour(s) were already compacted and unchanged")
        if result.open_hours:
            names = ", ".join(h.name for h in result.open_hours)
            out.print(f"{len(result.open_hours)} hour(s) still open, left as JSON: {names}")

    @app.command("analyze")
    def analyze_cmd(
        history: HistoryOption,
        out: Annotated[
            str,
            typer.Option(help="Output directory or s3:// URL (tables, plan.json, report.html)."),
        ],
        master: MasterOption = "local[*]",
        window: Annotated[
            str, typer.Option(help="Tumbling window for aggregates: 30s, 5m, 1h…")
        ] = "5m",
        horizon: Annotated[
            str, typer.Option(help="History the plan's p95 loads are taken over.")
        ] = "1h",
        stale_after: Annotated[
            str | None,
            typer.Option(
                help="A broker silent this long before the end has left (default: window, ≥90s)."
            ),
        ] = None,
        strategy: Annotated[
            Strategy | None,
            typer.Option(help="Strategy for the plan (default: the configuration's)."),
        ] = None,
        config: Annotated[
            Path | None,
            typer.Option(help="Broker YAML whose load_manager.rebalancing rules the plan obeys."),
        ] = None,
        max_moves: Annotated[
            int | None, typer.Option(help="At most this many moves in the plan.")
        ] = None,
        driver_memory: Annotated[
            str, typer.Option(help="Spark driver memory (local mode: all of Spark).")
        ] = "2g",
        executor_memory: ExecutorMemoryOption = None,
        shuffle_partitions: Annotated[int, typer.Option(help="spark.sql.shuffle.partitions.")] = 8,
        driver_host: Annotated[
            str,
            typer.Option(
                help="Driver address executors connect to (a reachable IP on multi-host clusters)."
            ),
        ] = "127.0.0.1",
        storage_option: StorageOption = None,
        start: Annotated[
            str | None,
            typer.Option(
                "--from", help="Analyse from this time on (UTC ISO date/time or epoch seconds)."
            ),
        ] = None,
        end: Annotated[
            str | None,
            typer.Option("--to", help="Analyse up to (not including) this time."),
        ] = None,
    ) -> None:
        """Analyse a load history with Spark: windows, strategy comparison, rebalance plan.

        Writes Parquet tables broker_windows, topic_windows, strategy_comparison and
        quarantine (bad lines with the reason), plan.json (moves to review and apply) and
        report.html with PNG charts. The history's closed hours are compacted into its
        columnar form first (once; see `history compact`), and only the hours in
        --from/--to are read. s3:// inputs are staged locally through fsspec and outputs
        uploaded the same way (Spark's own s3a needs jars pyspark lacks).
        """
        from ballast.pipeline.job import (
            AnalyzeOptions,
            PipelineError,
            parse_duration,
            parse_range,
            run_analysis,
        )

        console = Console(stderr=True)
        try:
            first, last = parse_range(start, end)
            options = AnalyzeOptions(
                history=history,
                out=out,
                window_seconds=parse_duration(window),
                horizon_seconds=parse_duration(horizon),
                stale_after_seconds=parse_duration(stale_after) if stale_after else None,
                strategy=strategy,
                config=load_config(config),
                max_moves=max_moves,
                storage_options=_storage_options(storage_option, console),
                start=first,
                end=last,
            )
        except (PipelineError, ConfigError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
        with spark_session(
            console,
            master,
            driver_memory=driver_memory,
            shuffle_partitions=shuffle_partitions,
            executor_memory=executor_memory,
            driver_host=driver_host,
        ) as spark:
            try:
                with stage_progress(console) as progress:
                    task = progress.add_task("analysing", total=len(STAGE_LABELS))
                    started: list[str] = []

                    def on_stage(name: str) -> None:
                        if started:
                            progress.advance(task)
                        started.append(name)
                        progress.update(task, description=STAGE_LABELS.get(name, name))

                    result = run_analysis(spark, options, on_stage)
            except PipelineError as exc:
                console.print(f"[red]error:[/red] {exc}")
                raise typer.Exit(1) from None
        print_summary(result, Console())


def main() -> None:
    """`python -m ballast.cli.pipeline …`: these commands without the rest of the CLI."""
    app = typer.Typer(name="ballast", no_args_is_help=True, pretty_exceptions_enable=False)
    register(app)
    app()


if __name__ == "__main__":
    main()
