"""`ballast console` (the HTTP admin API and web console) and `ballast admin
prometheus-targets` (Prometheus file_sd from the broker registrations)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from ballast.cli.cluster import DEFAULT_ETCD, EtcdOption, _fail, _run_admin
from ballast.cluster.admin import AdminClient
from ballast.config import ConfigError, load_config
from ballast.metadata import MetadataError, MetadataUnavailableError

CONSOLE_HELP = """Serve the operator's console: HTTP admin API and live web console.

\b
Open http://HOST:PORT/ in a browser for:
- the live cluster view: brokers with state, leader, score, CPU,
  memory, throughput and topics, pushed by server-sent events fed by
  one watch on the store;
- balance over time (CV, min/mean/max) with the moves on one axis;
- topic search, and a topic page with every broker's verdict;
- rebalance: a dry-run plan with its predicted CV, applied on
  confirmation;
- drain / activate a broker, with confirmation and progress.

\b
The API is under /api, its OpenAPI document at /openapi.json: the
operations of `ballast admin` as JSON, errors as {"error": "..."}
with the CLI's messages. With auth.mode: jwt in --config every API
call needs "Authorization: Bearer TOKEN" granting admin (ballast
admin tokens create --namespace '*' --permissions admin ...).
Prometheus discovers brokers at /api/prometheus/targets (http_sd).
"""


def register(app: typer.Typer, admin_app: typer.Typer) -> None:
    """Add `console` to `app` and `prometheus-targets` to `admin_app`."""

    @app.command("console", help=CONSOLE_HELP)
    def console_cmd(
        etcd: EtcdOption = DEFAULT_ETCD,
        listen: Annotated[
            str, typer.Option("--listen", help="HOST:PORT to serve on (port 0: a free port).")
        ] = "127.0.0.1:8080",
        config: Annotated[
            Path | None,
            typer.Option(
                "--config",
                envvar="BALLAST_AUTH_CONFIG",
                help="Broker YAML: rebalancing rules for plans, auth section for tokens.",
            ),
        ] = None,
    ) -> None:
        from ballast.console.serve import serve_console

        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
        try:
            cfg = load_config(config)
        except ConfigError as exc:
            raise _fail(str(exc), 2) from None

        def started(url: str) -> None:
            typer.echo(f"ballast console: {url}/ (OpenAPI: {url}/openapi.json)", err=True)
            typer.echo(f"CONSOLE-STARTED {url}")

        try:
            asyncio.run(serve_console(etcd, listen, cfg, on_started=started))
        except MetadataUnavailableError as exc:
            raise _fail(f"cannot reach the metadata store at {etcd}: {exc}", 2) from None
        except (ValueError, OSError, MetadataError) as exc:
            raise _fail(str(exc), 2) from None

    @admin_app.command("prometheus-targets")
    def prometheus_targets_cmd(
        output: Annotated[
            Path | None,
            typer.Option("--output", "-o", help="file_sd JSON file to write (default: stdout)."),
        ] = None,
        etcd: EtcdOption = DEFAULT_ETCD,
    ) -> None:
        """Prometheus file_sd targets: every registered broker's metrics endpoint.

        Scrape them with file_sd_configs: [{files: [FILE]}].

        Re-run when brokers come and go: Prometheus re-reads the file.

        Or let Prometheus ask the console: http_sd_configs on /api/prometheus/targets.
        """
        from ballast.console.targets import prometheus_targets

        async def read(admin: AdminClient) -> list[dict[str, Any]]:
            return prometheus_targets(await admin.view())

        groups = _run_admin(etcd, None, read)
        text = json.dumps(groups, indent=2, sort_keys=True) + "\n"
        if output is None:
            typer.echo(text, nl=False)
            return
        tmp = output.with_name(f".{output.name}.tmp")
        try:
            tmp.write_text(text)
            os.replace(tmp, output)  # atomic: Prometheus never reads half a file
        except OSError as exc:
            raise _fail(f"--output {output}: cannot write ({exc.strerror})", 2) from None
        typer.echo(f"{output}: {len(groups)} broker target(s)", err=True)
