"""The `ballast` command line."""

from __future__ import annotations

import typer

import ballast.cli.plan
from ballast.cli import cluster, pipeline, simulate

app = typer.Typer(
    name="ballast",
    help="Ballast: a self-balancing messaging cluster and load-placement toolkit.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
cluster.register(app)
simulate.register(app)
pipeline.register(app)
ballast.cli.plan.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
