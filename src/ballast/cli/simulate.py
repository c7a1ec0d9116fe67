"""`ballast simulate`: run the decision core on a simulated cluster in virtual time."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress

from ballast.config import ConfigError
from ballast.simulate.engine import SimResult, simulate
from ballast.simulate.report import print_result, write_csv, write_png
from ballast.simulate.scenario import builtin_names, load_scenario


def run_simulation(
    scenario: str,
    seed: int | None = None,
    hours: float | None = None,
    csv_path: Path | None = None,
    png_path: Path | None = None,
    console: Console | None = None,
) -> SimResult:
    """Load, run and present one scenario; raises `typer.Exit(2)` on a bad scenario."""
    console = console or Console()
    overrides: dict[str, object] = {}
    if seed is not None:
        overrides["seed"] = seed
    if hours is not None:
        overrides["duration_hours"] = hours
    try:
        sc = load_scenario(scenario, overrides)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    console.print(f"[bold]{sc.name}[/bold]: {sc.description.strip()}")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("simulating", total=1.0)
        result = simulate(sc, lambda f: progress.update(task, completed=f))
    print_result(result, console)
    if csv_path is not None:
        write_csv(result, csv_path)
        console.print(f"timeline written to {csv_path}")
    if png_path is not None:
        write_png(result, png_path)
        console.print(f"chart written to {png_path}")
    return result


def register(app: typer.Typer) -> None:
    """Add the `simulate` command to `app`."""

    @app.command("simulate")
    def simulate_cmd(
        scenario: Annotated[
            str,
            typer.Argument(
                help=f"Built-in scenario ({', '.join(builtin_names())}) or a YAML scenario file."
            ),
        ] = "scale-out",
        seed: Annotated[int | None, typer.Option(help="Override the scenario's seed.")] = None,
        hours: Annotated[
            float | None, typer.Option(help="Override the virtual duration in hours.")
        ] = None,
        csv: Annotated[Path | None, typer.Option(help="Write the timeline as CSV here.")] = None,
        png: Annotated[Path | None, typer.Option(help="Write a PNG chart here.")] = None,
        list_: Annotated[bool, typer.Option("--list", help="List built-in scenarios.")] = False,
    ) -> None:
        """Run the real decision core on a simulated cluster with a virtual clock.

        Hours of rebalancing take seconds; the same seed gives the same result.
        """
        if list_:
            for name in builtin_names():
                typer.echo(name)
            return
        run_simulation(scenario, seed, hours, csv, png)
