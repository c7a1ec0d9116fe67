"""The `ballast` command line."""

from __future__ import annotations

import typer

from ballast.cli import simulate

app = typer.Typer(
    name="ballast",
    help="Ballast: a self-balancing messaging cluster and load-placement toolkit.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
simulate.register(app)


@app.command("demo")
def demo() -> None:
    """Show automated rebalancing after a scale-out (3 brokers + 2) in virtual time."""
    simulate.run_simulation("scale-out")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
