"""`ballast tune`: which load-manager settings would have kept this cluster balanced with
the fewest moves, on its own recorded traffic.

Spark and the pipeline are imported inside the command, so `ballast --help` does not pay
for starting PySpark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from ballast.cli.spark import spark_session, stage_progress
from ballast.config import ConfigError

STAGES = {
    "compact": "compacting new hours of JSON into the columnar history",
    "read": "reading the range's reports",
    "replay": "replaying configurations",
    "write": "writing tuning.parquet, tuning.json, report.html, recommended.yaml",
}

# Paragraphs are single lines (the help wraps them to the terminal); the example's lines
# stay as they are. Square brackets are escaped: rich would read them as markup.
HELP = "\n\n".join(
    [
        "Replay the recorded load history through the leader's own machine, once per "
        "combination of a grid of load-manager settings, as Spark tasks (one per "
        "combination), and recommend the settings that keep the cluster balanced with the "
        "fewest moves.",
        "GRID is a YAML file: `grid:` maps load_manager settings (by path) to candidate "
        "values; `base:` (optional) is the load_manager section every combination starts "
        "from; `measure:` (optional) is the yardstick, the same for every combination "
        "(strategy, cv_threshold, overload_percent). For example:",
        "  base: {rebalancing: {enabled: true}}\n"
        "  grid:\n"
        "    assignment_strategy: \\[balanced, fair]\n"
        "    rebalancing.cv_threshold: \\[0.2, 0.3, 0.4]\n"
        "    rebalancing.max_moves_per_hour: \\[5, 10, 20]",
        "Brokers appear, drain and disappear as recorded; every topic keeps its recorded "
        "load wherever a replay puts it (docs/pipeline.md says what a replay can and cannot "
        "reproduce). --from/--to pick the range.",
        "Writes to OUT: tuning.parquet and tuning.json (per configuration: moves, moved "
        "load, CV p50/p95/max, minutes above the imbalance threshold, broker-minutes "
        "overloaded), the Pareto front of moves against CV p95 (tuning.png, report.html) "
        "and recommended.yaml, the load_manager section to paste, with the reason it was "
        "chosen.",
    ]
)


def _summary(result: object, console: Console) -> None:
    from ballast.pipeline.tune import TuneResult

    assert isinstance(result, TuneResult)
    by_id = {o.config_id: o for o in result.outcomes}
    table = Table(title="Pareto front: moves against CV p95", title_justify="left")
    columns = ("id", "settings", "moves", "CV p95", "CV max", "min above", "overloaded", "live")
    for column in columns:
        table.add_column(column)
    for config_id in result.pareto:
        o = by_id[config_id]
        mark = " ←" if config_id == result.recommendation.config_id else ""
        table.add_row(
            f"{config_id}{mark}",
            # The setting's own name: the table stays narrow (tuning.json has the paths).
            ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in o.settings.items()),
            str(o.moves),
            f"{o.cv_p95:.1%}",
            f"{o.cv_max:.1%}",
            f"{o.minutes_above_threshold:.0f}",
            f"{o.broker_minutes_overloaded:.0f}",
            f"{o.live_moves_reproduced:.0%}",
        )
    console.print(table)
    console.print(
        f"{len(result.outcomes)} configurations replayed over {result.reports} reports "
        f"({result.brokers} brokers, {result.topics} topics, {result.live_moves} recorded "
        "rebalancing moves; `live`: the share of them a configuration's replay reproduces) in "
        + ", ".join(f"{k} {v:.1f}s" for k, v in result.seconds.items())
    )
    console.print(
        f"recommended: configuration {result.recommendation.config_id}: "
        f"{result.recommendation.reason}"
    )
    for name, path in result.outputs.items():
        console.print(f"  {name}: {path}")


def register(app: typer.Typer) -> None:
    """Add `tune` to `app`."""

    @app.command("tune", help=HELP)
    def tune_cmd(
        history: Annotated[
            str, typer.Option(help="History directory or s3:// URL (the sink's root).")
        ],
        grid: Annotated[Path, typer.Option(help="YAML grid of load_manager settings (see above).")],
        out: Annotated[str, typer.Option(help="Directory for the outputs.")] = "tuning",
        start: Annotated[
            str | None,
            typer.Option(
                "--from", help="Replay from this time on (UTC ISO date/time or epoch seconds)."
            ),
        ] = None,
        end: Annotated[
            str | None, typer.Option("--to", help="Replay up to (not including) this time.")
        ] = None,
        master: Annotated[
            str, typer.Option(help="Spark master: local[*], spark://host:port, yarn, k8s://…")
        ] = "local[*]",
        driver_memory: Annotated[str, typer.Option(help="Spark driver memory.")] = "2g",
        driver_host: Annotated[
            str, typer.Option(help="Driver address executors connect to.")
        ] = "127.0.0.1",
    ) -> None:
        from ballast.pipeline.job import PipelineError, parse_range
        from ballast.pipeline.tune import TuneError, TuneOptions, run_tuning
        from ballast.simulate.tuning import load_grid

        console = Console(stderr=True)
        try:
            first, last = parse_range(start, end)
            options = TuneOptions(
                history=history,
                grid=load_grid(grid),
                out=out,
                start=first,
                end=last,
            )
        except (ConfigError, PipelineError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
        combinations = len(options.grid.combinations())
        console.print(f"{combinations} configuration(s) to replay from {grid}")
        with spark_session(
            console,
            master,
            app_name="ballast-tune",
            driver_memory=driver_memory,
            driver_host=driver_host,
        ) as spark:
            try:
                with stage_progress(console) as progress:
                    task = progress.add_task("tuning", total=None)

                    def on_stage(name: str) -> None:
                        total = combinations if name == "replay" else None
                        progress.update(task, description=STAGES[name], completed=0, total=total)

                    def on_progress(done: int, total: int) -> None:
                        progress.update(task, completed=done, total=total)

                    result = run_tuning(spark, options, on_stage, on_progress)
            except TuneError as exc:
                console.print(f"[red]error:[/red] {exc}")
                raise typer.Exit(1) from None
        _summary(result, Console())
