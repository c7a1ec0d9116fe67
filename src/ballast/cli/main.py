"""The `ballast` command line."""

from __future__ import annotations

import typer

from ballast.cli import (
    cluster,
    console,
    data,
    gateway,
    namespaces,
    pipeline,
    plan,
    quotas,
    schemas,
    simulate,
    tune,
)

app = typer.Typer(
    name="ballast",
    help="Ballast: a self-balancing messaging cluster and load-placement toolkit.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
cluster.register(app)
namespaces.register(cluster.admin_app)  # namespaces, bundles, anti-affinity, domains
gateway.register_tokens(cluster.admin_app)
schemas.register(cluster.admin_app)  # schemas; topics set-schema / schema
schemas.register_dead_letters(namespaces.namespaces_app)
quotas.register_quotas(namespaces.namespaces_app)
gateway.register(app)
console.register(app, cluster.admin_app)
data.register(app)
simulate.register(app)
pipeline.register(app)
plan.register(app)
tune.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
