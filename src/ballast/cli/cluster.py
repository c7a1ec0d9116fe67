"""`ballast broker`, `ballast admin …` and `ballast demo`: thin wrappers over `ballast.cluster`.

Every admin command takes ``--etcd URL`` (default ``$BALLAST_ETCD`` or the local etcd) and
``--json`` (machine-readable output instead of rich tables). Errors name what is wrong and
what to do, and exit with status 1 (bad request) or 2 (store unreachable / bad input file).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ballast.clock import SystemClock
from ballast.cluster.admin import AdminClient, AdminError
from ballast.config import ConfigError, load_config
from ballast.metadata import MetadataError, MetadataUnavailableError
from ballast.metadata.factory import open_store

DEFAULT_ETCD = "http://127.0.0.1:2379"

EtcdOption = Annotated[
    str,
    typer.Option("--etcd", envvar="BALLAST_ETCD", help="etcd endpoints, comma-separated."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", help="Broker YAML (rebalancing rules used for plans)."),
]

T = TypeVar("T")


def _when(ts: float) -> str:
    """An epoch timestamp as UTC ISO time, to the millisecond."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def _console() -> Console:
    return Console()


def _fail(message: str, code: int) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/red] {escape(message)}", highlight=False)
    return typer.Exit(code)


def _say_serving(_broker: str, serving: str) -> None:
    typer.echo(serving)  # the default log level (WARNING) says nothing on a good start


def _run_admin(etcd: str, config: Path | None, action: Callable[[AdminClient], Awaitable[T]]) -> T:
    """Open the store, run one admin action, turn failures into a clear exit."""
    try:
        cfg = load_config(config)
    except ConfigError as exc:
        raise _fail(str(exc), 2) from None

    async def run() -> T:
        try:
            store = open_store(etcd)
        except ValueError as exc:
            raise _fail(str(exc), 2) from None
        async with store:
            return await action(AdminClient(store, SystemClock(), cfg))

    try:
        return asyncio.run(run())
    except AdminError as exc:
        raise _fail(str(exc), 1) from None
    except MetadataUnavailableError as exc:
        raise _fail(f"cannot reach the metadata store at {etcd}: {exc}", 2) from None
    except MetadataError as exc:
        raise _fail(str(exc), 2) from None


def _emit(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


# -- admin brokers ---------------------------------------------------------------------------

brokers_app = typer.Typer(help="List, drain and activate brokers.", no_args_is_help=True)


@brokers_app.command("list")
def brokers_list(etcd: EtcdOption = DEFAULT_ETCD, as_json: JsonOption = False) -> None:
    """Brokers: state, topics owned, load score, leader."""
    infos = _run_admin(etcd, None, lambda a: a.brokers())
    if as_json:
        _emit([i.to_dict() for i in infos])
        return
    table = Table("broker", "state", "topics", "score", "leader", "url", title="brokers")
    for i in infos:
        table.add_row(
            i.broker_id,
            i.state,
            str(i.topics),
            _num(i.score),
            "★" if i.leader else "",
            i.broker_url,
        )
    _console().print(table)


@brokers_app.command("drain")
def brokers_drain(
    broker: Annotated[str, typer.Argument(help="Broker id.")],
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Drain a broker: its topics move away, then it is marked drained."""
    _run_admin(etcd, None, lambda a: a.drain(broker))
    if as_json:
        _emit({"broker_id": broker, "state": "draining"})
    else:
        _console().print(f"{broker}: draining (the leader moves its topics, then marks it drained)")


@brokers_app.command("activate")
def brokers_activate(
    broker: Annotated[str, typer.Argument(help="Broker id.")],
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Make a broker active again (it receives topics)."""
    _run_admin(etcd, None, lambda a: a.activate(broker))
    if as_json:
        _emit({"broker_id": broker, "state": "active"})
    else:
        _console().print(f"{broker}: active")


# -- admin topics ----------------------------------------------------------------------------

topics_app = typer.Typer(help="Create, list, describe and unload topics.", no_args_is_help=True)


@topics_app.command("create")
def topics_create(
    topics: Annotated[list[str], typer.Argument(help="Topic names, /namespace/topic.")],
    hint: Annotated[
        str | None, typer.Option("--hint", help="Preferred broker (honoured if active).")
    ] = None,
    partitions: Annotated[
        int, typer.Option("--partitions", min=0, help="Create TOPIC-part-0..N-1 instead.")
    ] = 0,
    reliable: Annotated[
        bool, typer.Option("--reliable", help="Reliable topics (stored, survive moves).")
    ] = False,
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Create topics (or partitioned topics); the leader places each on a broker."""
    meta = {"dispatch_strategy": "reliable" if reliable else "non_reliable"}
    names = [f"{t}-part-{i}" for t in topics for i in range(partitions)] if partitions else topics

    async def create(admin: AdminClient) -> list[str]:
        return [await admin.create_topic(t, hint=hint, meta=meta) for t in names]

    created = _run_admin(etcd, None, create)
    if as_json:
        _emit({"created": created})
    else:
        for t in created:
            _console().print(f"created {t}")


@topics_app.command("list")
def topics_list(etcd: EtcdOption = DEFAULT_ETCD, as_json: JsonOption = False) -> None:
    """Topics with their owner, state and age."""
    infos = _run_admin(etcd, None, lambda a: a.topics())
    if as_json:
        _emit([i.to_dict() for i in infos])
        return
    table = Table("topic", "owner", "state", "age", title=f"{len(infos)} topics")
    for i in infos:
        table.add_row(i.topic, i.owner or "-", i.state, _age(i.age_seconds))
    _console().print(table)


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@topics_app.command("describe")
def topics_describe(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """A topic's owner, state and age, and why each broker would (not) get it now."""
    detail = _run_admin(etcd, None, lambda a: a.describe(topic))
    if as_json:
        _emit(detail.to_dict())
        return
    info, placement = detail.info, detail.placement
    console = _console()
    console.print(f"[bold]{info.topic}[/bold]")
    console.print(
        f"  owner: {info.owner or '-'}   state: {info.state}   age: {_age(info.age_seconds)}"
    )
    if info.marker is not None:
        m = info.marker
        console.print(
            f"  marker: {m.reason.value} from={m.from_broker} to={m.to_broker} ready={m.ready}"
        )
    if detail.storage is not None:
        st = detail.storage
        offsets = f"offsets {st.first_offset}..{st.last_offset}" if st.objects else "empty"
        console.print(
            f"  storage: {st.objects} objects, {_bytes(st.bytes)}, {offsets} "
            f"({st.descriptor_keys} descriptor keys in etcd, the rest in the index object)"
        )
    pressure = detail.pressure
    if pressure is not None:
        console.print(
            f"  backpressure (broker {escape(str(pressure.get('broker')))}): held "
            f"{pressure.get('held_bytes')} of {pressure.get('topic_budget_bytes')} bytes, "
            f"{pressure.get('refused_sends')} send(s) refused for a full budget"
        )
        for sub, figures in sorted((pressure.get("subscriptions") or {}).items()):
            console.print(
                f"    subscription {escape(sub)}: {figures.get('buffered_bytes')} bytes read "
                f"ahead, {figures.get('dropped')} dropped (slow consumer)"
            )
    # Served: the placement is what an unload would do; otherwise what the leader will do.
    label = "if unloaded now" if info.owner is not None and info.marker is None else "placement now"
    console.print(f"  {label}: {placement.broker or '-'} — {escape(placement.reason)}")
    table = Table("broker", "score", "verdict")
    for broker, score in sorted(placement.scores.items()):
        verdict = placement.rejected.get(
            broker, "candidate" if broker in placement.candidates else ""
        )
        table.add_row(broker, _num(score), escape(verdict))
    for broker, why in sorted(placement.rejected.items()):
        if broker not in placement.scores:
            table.add_row(broker, "-", why)
    console.print(table)


@topics_app.command("unload")
def topics_unload(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="Destination broker (active, registered): the owner's seal hands the topic "
            "to it directly, without waiting for the leader to place it.",
        ),
    ] = None,
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Unload a topic from its owner (sealed first); the leader places it elsewhere, or
    the seal hands it to the `--to` broker."""
    owner = _run_admin(etcd, None, lambda a: a.unload_topic(topic, to))
    if as_json:
        _emit({"topic": topic, "from_broker": owner, "to_broker": to})
    else:
        _console().print(f"{topic}: unloading from {owner}" + (f" to {to}" if to else ""))


# -- admin cluster ---------------------------------------------------------------------------

cluster_app = typer.Typer(help="Balance, rebalance, history and leader.", no_args_is_help=True)


@cluster_app.command("balance")
def cluster_balance(etcd: EtcdOption = DEFAULT_ETCD, as_json: JsonOption = False) -> None:
    """CV, mean, std, min, max and each active broker's classification."""
    report = _run_admin(etcd, None, lambda a: a.balance())
    if as_json:
        _emit(report.to_dict())
        return
    s = report.stats
    console = _console()
    console.print(
        f"strategy {report.strategy.value}: CV {s.cv:.1%}  mean {s.mean:.2f}  std {s.std:.2f}  "
        f"min {s.min:.2f}  max {s.max:.2f}"
    )
    table = Table("broker", "score", "class")
    for broker, score in sorted(s.scores.items()):
        table.add_row(broker, _num(score), s.classification(broker))
    console.print(table)
    if report.leader_decision:
        console.print(f"leader's last decision: {escape(report.leader_decision)}")


@cluster_app.command("rebalance")
def cluster_rebalance(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan only; move nothing.")] = False,
    max_moves: Annotated[
        int | None, typer.Option("--max-moves", min=0, help="At most this many moves.")
    ] = None,
    plan: Annotated[
        Path | None, typer.Option("--plan", help="Apply a saved plan (JSON) instead.")
    ] = None,
    config: ConfigOption = None,
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Plan moves toward target_cv and (unless --dry-run) start them."""
    if plan is not None:
        outcomes = _run_admin(etcd, config, lambda a: a.apply_plan(plan))
        if as_json:
            _emit({"outcomes": [o.to_dict() for o in outcomes]})
            return
        for o in outcomes:
            m = o.move
            _console().print(f"{m.topic}: {m.from_broker} → {m.to_broker}: {escape(o.reason)}")
        return
    result = _run_admin(etcd, config, lambda a: a.rebalance(dry_run=dry_run, max_moves=max_moves))
    if as_json:
        _emit(result.to_dict())
        return
    p = result.plan
    console = _console()
    console.print(
        f"{'plan (dry run)' if dry_run else 'rebalance'}: {len(p.moves)} move(s), "
        f"CV {p.before.cv:.1%} → {p.after.cv:.1%} ({escape(p.reason)})"
    )
    for line in p.details:  # a Pulsar shedder's per-broker reasons
        console.print(f"  {escape(line)}")
    table = Table("topic", "from", "to", "est. load", "outcome")
    for i, m in enumerate(p.moves):
        outcome = result.outcomes[i].reason if i < len(result.outcomes) else "planned"
        table.add_row(m.topic, m.from_broker, m.to_broker, _num(m.estimated_load), escape(outcome))
    console.print(table)


@cluster_app.command("history")
def cluster_history(
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Last N moves.")] = None,
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Persisted moves, oldest first."""
    moves = _run_admin(etcd, None, lambda a: a.history(limit))
    if as_json:
        _emit([m.to_dict() for m in moves])
        return
    table = Table("time", "topic", "from", "to", "reason", title=f"{len(moves)} moves")
    for m in moves:
        table.add_row(_when(m.timestamp), m.topic, m.from_broker, m.to_broker, escape(m.reason))
    _console().print(table)


@cluster_app.command("leader")
def cluster_leader(etcd: EtcdOption = DEFAULT_ETCD, as_json: JsonOption = False) -> None:
    """The current leader."""
    leader = _run_admin(etcd, None, lambda a: a.leader())
    if as_json:
        _emit(leader)
    elif leader is None:
        _console().print("no leader (an election is under way)")
    else:
        since = leader.get("since")
        when = _when(since) if isinstance(since, int | float) else "?"
        _console().print(f"leader: {leader.get('broker_id')} since {when}")


admin_app = typer.Typer(help="Operate a running cluster.", no_args_is_help=True)
admin_app.add_typer(brokers_app, name="brokers")
admin_app.add_typer(topics_app, name="topics")
admin_app.add_typer(cluster_app, name="cluster")


def register(app: typer.Typer) -> None:
    """Add `broker`, `admin …` and `demo` to `app`."""

    @app.command("broker")
    def broker_cmd(
        etcd: Annotated[
            str | None,
            typer.Option(
                "--etcd", envvar="BALLAST_ETCD", help="etcd endpoints (default: embedded)."
            ),
        ] = None,
        config: Annotated[Path | None, typer.Option("--config", help="Broker YAML.")] = None,
        broker_id: Annotated[str | None, typer.Option("--id", help="Broker id.")] = None,
        profiles: Annotated[
            str | None,
            typer.Option(
                "--profiles", help="Synthetic topics (idle or mixed) instead of the data plane."
            ),
        ] = None,
        broker_url: Annotated[
            str | None,
            typer.Option("--broker-url", help="host:port for clients (port 0: a free port)."),
        ] = None,
        metrics_port: Annotated[
            int | None, typer.Option("--metrics-port", help="Prometheus port (0: none).")
        ] = None,
    ) -> None:
        """Run one broker until SIGINT/SIGTERM; clients connect on its broker_url."""
        from ballast.cluster.run import PROFILES, serve
        from ballast.storage import ObjectStoreMismatchError

        if profiles is not None and profiles not in PROFILES:
            raise _fail(f"--profiles {profiles!r}: use one of {', '.join(sorted(PROFILES))}", 2)
        try:
            cfg = load_config(config)
        except ConfigError as exc:
            raise _fail(str(exc), 2) from None
        if broker_url is not None:
            cfg = cfg.model_copy(
                update={"broker": cfg.broker.model_copy(update={"broker_url": broker_url})}
            )
        if metrics_port is not None:
            metrics = {"enabled": metrics_port > 0, "port": metrics_port}
            cfg = cfg.model_copy(update={"metrics": cfg.metrics.model_copy(update=metrics)})
        try:
            asyncio.run(serve(etcd, cfg, broker_id, profiles=profiles, on_started=_say_serving))
        except (ValueError, OSError, MetadataError, ObjectStoreMismatchError) as exc:
            raise _fail(str(exc), 2) from None

    app.add_typer(admin_app, name="admin")

    @app.command("demo")
    def demo_cmd(
        etcd: Annotated[
            str | None,
            typer.Option("--etcd", help="Run against etcd instead of the embedded store."),
        ] = None,
        topics: Annotated[int, typer.Option("--topics", min=10, help="Topics to create.")] = 240,
        live_topics: Annotated[
            int,
            typer.Option(
                "--live-topics", min=0, help="Topics with real clients through a gateway."
            ),
        ] = 4,
    ) -> None:
        """A live cluster in one process: placement, scale-out, failover, drain."""
        from ballast.cluster.demo import run_demo

        try:
            summary = asyncio.run(
                run_demo(etcd, topics=topics, console=_console(), live_topics=live_topics)
            )
        except MetadataUnavailableError as exc:
            raise _fail(f"cannot reach etcd at {etcd}: {exc}", 2) from None
        if not summary.ok:
            raise _fail("the demo did not reach its goals: " + "; ".join(summary.problems), 1)
