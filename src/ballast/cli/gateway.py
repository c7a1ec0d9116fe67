"""`ballast gateway` (the front door clients use) and `ballast admin tokens create`.

``ballast gateway --etcd URL --listen HOST:PORT [--advertise HOST:PORT] [--config FILE]``
serves Danube's client protocol: lookups from the metadata store, everything else
forwarded to the owning broker; it prints ``GATEWAY-STARTED <address>`` once serving.
The `tls` and `auth` sections of the configuration apply as on brokers.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Annotated

import typer

from ballast.config import BallastConfig, ConfigError, load_config
from ballast.metadata import MetadataError
from ballast.metadata.factory import open_store

__all__ = ["register", "register_tokens"]


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


async def run_gateway(etcd: str, config: BallastConfig, listen: str) -> None:
    """Serve a gateway until SIGINT/SIGTERM."""
    from ballast.gateway.gateway import serve_gateway

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    store = open_store(etcd)
    async with store:

        def started(address: str) -> None:
            # Scripts and tests wait for this line.
            print(f"GATEWAY-STARTED {address}", flush=True)

        await serve_gateway(store, config, listen, stop, started)


def register(app: typer.Typer) -> None:
    """Add `gateway` to `app`."""

    @app.command("gateway")
    def gateway_cmd(
        etcd: Annotated[
            str,
            typer.Option("--etcd", envvar="BALLAST_ETCD", help="etcd endpoints (the brokers')."),
        ] = "http://127.0.0.1:2379",
        listen: Annotated[
            str | None,
            typer.Option("--listen", help="host:port to serve on (port 0: a free one)."),
        ] = None,
        advertise: Annotated[
            str | None,
            typer.Option("--advertise", help="host:port lookups give clients (default: listen)."),
        ] = None,
        config: Annotated[
            Path | None, typer.Option("--config", help="YAML with tls, auth, gateway sections.")
        ] = None,
        metrics_port: Annotated[
            int | None,
            typer.Option(
                "--metrics-port",
                help="Prometheus port for ballast_gateway_* series, on the listen host (0: none).",
            ),
        ] = None,
        log_level: Annotated[str, typer.Option("--log-level")] = "INFO",
    ) -> None:
        """Run a gateway: clients use it as service_url and survive a broker's death."""
        logging.basicConfig(
            level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        try:
            cfg = load_config(config)
        except ConfigError as exc:
            raise _fail(str(exc), 2) from None
        update: dict[str, object] = {}
        if listen is not None:
            update["listen"] = listen
        if advertise is not None:
            update["advertise"] = advertise
        if metrics_port is not None:
            update["metrics_port"] = metrics_port
        if update:
            cfg = cfg.model_copy(update={"gateway": cfg.gateway.model_copy(update=update)})
        try:
            asyncio.run(run_gateway(etcd, cfg, cfg.gateway.listen))
        except (ValueError, OSError, MetadataError) as exc:
            raise _fail(str(exc), 2) from None


def check_admin_token(token: str | None, config: Path | None) -> str | None:
    """With ``auth.mode: jwt`` in `config`, the token must grant ``admin``; its subject.

    Errors say UNAUTHENTICATED (missing, expired, forged) or PERMISSION_DENIED (no admin
    permission). Without an auth configuration nothing is checked (None).
    """
    from ballast.wire.auth import AuthError, Permission, TokenAuthority

    if config is None:
        return None
    settings = load_config(config).auth
    if settings.mode != "jwt":
        return None
    authority = TokenAuthority(settings)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    try:
        claims = authority.authorize(metadata, "*", (Permission.ADMIN,))
    except AuthError as exc:
        raise ValueError(f"{exc.code.name}: {exc.message}") from None
    return claims.subject


def register_tokens(admin_app: typer.Typer) -> None:
    """Add `tokens create` to the admin commands, and the admin token check."""

    @admin_app.callback()
    def admin_options(
        ctx: typer.Context,
        token: Annotated[
            str | None,
            typer.Option("--token", envvar="BALLAST_TOKEN", help="JWT with the admin permission."),
        ] = None,
        auth_config: Annotated[
            Path | None,
            typer.Option(
                "--auth-config",
                envvar="BALLAST_AUTH_CONFIG",
                help="YAML whose auth section verifies --token (mode: jwt).",
            ),
        ] = None,
    ) -> None:
        """Operate a running cluster (with auth configured: --token with admin permission)."""
        if ctx.invoked_subcommand == "tokens":
            return  # issuing needs the signing key, not a token
        try:
            check_admin_token(token, auth_config)
        except (ConfigError, ValueError) as exc:
            raise _fail(str(exc), 2) from None

    tokens_app = typer.Typer(help="Issue JWT tokens for clients.", no_args_is_help=True)

    @tokens_app.command("create")
    def tokens_create(
        subject: Annotated[str, typer.Option("--subject", help="Who the token is for.")],
        namespace: Annotated[
            str, typer.Option("--namespace", help="Namespace the permissions apply to (* = all).")
        ],
        permissions: Annotated[
            str, typer.Option("--permissions", help="Comma-separated: produce,consume,admin.")
        ],
        ttl: Annotated[
            float, typer.Option("--ttl", min=0, help="Lifetime in seconds (0: no expiry).")
        ] = 3600,
        config: Annotated[
            Path | None,
            typer.Option("--config", help="YAML whose auth section holds the signing key."),
        ] = None,
    ) -> None:
        """Print a signed token (HS256 secret or RS256 private key from the config)."""
        from ballast.wire.auth import TokenAuthority, parse_permissions

        try:
            cfg = load_config(config)
            perms = parse_permissions(permissions)
            if cfg.auth.mode != "jwt":
                raise ValueError(
                    "the configuration has no auth section with mode: jwt "
                    "(pass --config with auth.secret or auth.private_key_file)"
                )
            token = TokenAuthority(cfg.auth).issue(
                subject, {namespace: perms}, ttl_seconds=ttl or None
            )
        except (ConfigError, ValueError) as exc:
            raise _fail(str(exc), 2) from None
        typer.echo(token)

    admin_app.add_typer(tokens_app, name="tokens")
