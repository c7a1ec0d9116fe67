"""`ballast admin namespaces …` and `ballast admin clusters failure-domain …`.

A namespace is the first part of a topic name (``/{namespace}/{topic}``); ``default`` exists
from the start (every broker creates it) and producers can only create topics in a namespace
that exists. Each namespace's hash range is cut into Pulsar's bundles; namespaces can join an
anti-affinity group; brokers belong to failure domains. Thin wrappers over
`ballast.cluster.namespaces`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ballast.balance.pulsar.bundles import BundleError, parse_position
from ballast.cli.cluster import (
    DEFAULT_ETCD,
    ConfigOption,
    EtcdOption,
    JsonOption,
    _console,
    _emit,
    _fail,
    _run_admin,
    _when,
)
from ballast.cluster.namespaces import NamespaceAdmin

namespaces_app = typer.Typer(
    help="Namespaces: create, list, delete; their bundles (split, unload); anti-affinity.",
    no_args_is_help=True,
)
clusters_app = typer.Typer(
    help="Cluster-wide settings (Pulsar): failure domains.", no_args_is_help=True
)
domains_app = typer.Typer(help="Create, list and delete failure domains.", no_args_is_help=True)
clusters_app.add_typer(domains_app, name="failure-domain")

NamespaceArg = Annotated[str, typer.Argument(help="Namespace name.")]
BundleArg = Annotated[str, typer.Argument(help="Bundle, e.g. 0x00000000_0x40000000.")]


def _mb(x: float) -> str:
    return f"{x / 1e6:.2f}"


@namespaces_app.command("create")
def ns_create(
    namespace: NamespaceArg,
    bundles: Annotated[
        int | None, typer.Option("--bundles", help="Number of bundles (default: config, 4).")
    ] = None,
    config: ConfigOption = None,
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Create a namespace; its hash range is cut into N equal bundles."""
    layout = _run_admin(etcd, config, lambda a: NamespaceAdmin(a).create(namespace, bundles))
    if as_json:
        _emit({"created": namespace, "bundles": list(layout.names())})
        return
    _console().print(f"{namespace}: {len(layout)} bundle(s)")
    for name in layout.names():
        _console().print(f"  {name}")


@namespaces_app.command("list")
def ns_list(etcd: EtcdOption = DEFAULT_ETCD, as_json: JsonOption = False) -> None:
    """Namespaces with their creation time and topic count."""
    rows = _run_admin(etcd, None, lambda a: NamespaceAdmin(a).list_namespaces())
    if as_json:
        _emit(rows)
        return
    table = Table("namespace", "topics", "created", title=f"{len(rows)} namespaces")
    for row in rows:
        created = row["created_at"]
        table.add_row(
            escape(str(row["namespace"])),
            str(row["topics"]),
            _when(created) if isinstance(created, int | float) else "-",
        )
    _console().print(table)


@namespaces_app.command("delete")
def ns_delete(
    namespace: NamespaceArg, etcd: EtcdOption = DEFAULT_ETCD, as_json: JsonOption = False
) -> None:
    """Delete an empty namespace (with its bundles and anti-affinity group)."""
    deleted = _run_admin(etcd, None, lambda a: NamespaceAdmin(a).delete_namespace(namespace))
    if as_json:
        _emit({"deleted": deleted})
    else:
        _console().print(f"deleted namespace {deleted}")


@namespaces_app.command("bundles")
def ns_bundles(
    namespace: NamespaceArg,
    config: ConfigOption = None,
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """A namespace's bundles with their topics, owners and traffic."""
    report = _run_admin(etcd, config, lambda a: NamespaceAdmin(a).bundles(namespace))
    if as_json:
        _emit(report.to_dict())
        return
    title = f"{namespace}: {len(report.layout)} bundle(s)"
    if not report.stored:
        title += " (default layout; not created with `namespaces create`)"
    if report.anti_affinity_group:
        title += f", anti-affinity group {report.anti_affinity_group}"
    table = Table("bundle", "topics", "owners", "msg/s", "MB/s", title=escape(title))
    for r in report.rows:
        table.add_row(
            r.name,
            str(r.topics),
            ", ".join(r.owners) or "-",
            f"{r.msg_rate:.0f}",
            _mb(r.throughput),
        )
    _console().print(table)


@namespaces_app.command("split-bundle")
def ns_split(
    namespace: NamespaceArg,
    bundle: BundleArg,
    algorithm: Annotated[
        str | None,
        typer.Option(
            "--algorithm",
            help="range_equally_divide, topic_count_equally_divide, "
            "specified_positions_divide or flow_or_qps_equally_divide (default: config).",
        ),
    ] = None,
    positions: Annotated[
        list[str] | None,
        typer.Option(
            "--positions", help="Split positions (hex or decimal); repeat or comma-separate."
        ),
    ] = None,
    unload: Annotated[
        bool | None,
        typer.Option(
            "--unload/--no-unload", help="Unload the split bundles' topics (default: config)."
        ),
    ] = None,
    config: ConfigOption = None,
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Split one bundle with one of Pulsar's four algorithms."""
    try:
        cuts = [parse_position(p) for raw in positions or () for p in raw.split(",") if p]
    except BundleError as exc:
        raise _fail(str(exc), 1) from None
    outcome = _run_admin(
        etcd, config, lambda a: NamespaceAdmin(a).split(namespace, bundle, algorithm, cuts, unload)
    )
    if as_json:
        _emit(outcome.to_dict())
        return
    console = _console()
    console.print(escape(outcome.result.reason))
    console.print(
        "cut at "
        + ", ".join(f"0x{p:08x}" for p in outcome.result.positions)
        + f"; {namespace} now has {len(outcome.layout)} bundle(s)"
    )
    for t, b in outcome.unloaded:
        console.print(f"  unloading {t} from {b}")


@namespaces_app.command("unload-bundle")
def ns_unload(
    namespace: NamespaceArg,
    bundle: BundleArg,
    config: ConfigOption = None,
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Unload every topic of a bundle; the leader places the bundle again."""
    moved = _run_admin(etcd, config, lambda a: NamespaceAdmin(a).unload_bundle(namespace, bundle))
    if as_json:
        _emit({"unloaded": [{"topic": t, "from_broker": b} for t, b in moved]})
        return
    for t, b in moved:
        _console().print(f"{t}: unloading from {b}")


@namespaces_app.command("set-anti-affinity-group")
def ns_anti_affinity(
    namespace: NamespaceArg,
    group: Annotated[str, typer.Option("--group", help="Anti-affinity group name.")],
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Put a namespace in an anti-affinity group (spread across domains, then brokers)."""
    _run_admin(etcd, None, lambda a: NamespaceAdmin(a).set_anti_affinity_group(namespace, group))
    if as_json:
        _emit({"namespace": namespace, "anti_affinity_group": group})
    else:
        _console().print(f"{namespace}: anti-affinity group {group}")


@namespaces_app.command("set-retention")
def ns_set_retention(
    namespace: NamespaceArg,
    time: Annotated[
        str | None,
        typer.Option(
            "--time", help="Keep at most this long, e.g. 7d, 12h, 2w (default: no limit)."
        ),
    ] = None,
    size: Annotated[
        str | None,
        typer.Option("--size", help="Keep at most this much per topic, e.g. 10GiB, 500MB."),
    ] = None,
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Bound how long and how much each reliable topic of NAMESPACE keeps in object storage.

    The owner deletes the oldest objects beyond either limit, but never what a subscription
    has not acknowledged yet (the slowest subscription holds retention back) and never the
    newest object. Without --time and --size the limits are removed: keep everything.
    """
    policy = _run_admin(
        etcd, None, lambda a: NamespaceAdmin(a).set_retention(namespace, time, size)
    )
    if as_json:
        _emit({"namespace": namespace, **policy.to_dict()})
    elif policy.keeps_everything:
        _console().print(f"{namespace}: retention removed, everything is kept")
    else:
        time_limit = (
            "no time limit" if policy.time_seconds is None else f"{policy.time_seconds:g} s"
        )
        size_limit = "no size limit" if policy.size_bytes is None else f"{policy.size_bytes} bytes"
        _console().print(f"{namespace}: keep at most {time_limit}, {size_limit} per topic")


@domains_app.command("create")
def domain_create(
    domain: Annotated[str, typer.Argument(help="Failure-domain name.")],
    broker_list: Annotated[str, typer.Option("--broker-list", help="Broker ids, comma-separated.")],
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Create (or replace) a failure domain; a broker may be in one domain only."""
    brokers = [b for b in broker_list.split(",") if b.strip()]
    info = _run_admin(
        etcd, None, lambda a: NamespaceAdmin(a).create_failure_domain(domain, brokers)
    )
    if as_json:
        _emit(info.to_dict())
    else:
        _console().print(f"failure domain {info.name}: {', '.join(info.brokers)}")


@domains_app.command("list")
def domain_list(etcd: EtcdOption = DEFAULT_ETCD, as_json: JsonOption = False) -> None:
    """Failure domains: created by admin, or declared by brokers (`broker.domain`)."""
    infos = _run_admin(etcd, None, lambda a: NamespaceAdmin(a).list_failure_domains())
    if as_json:
        _emit([i.to_dict() for i in infos])
        return
    table = Table("domain", "brokers", "source", title="failure domains")
    for i in infos:
        table.add_row(i.name, ", ".join(i.brokers), i.source)
    _console().print(table)


@domains_app.command("delete")
def domain_delete(
    domain: Annotated[str, typer.Argument(help="Failure-domain name.")],
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Delete a failure domain created by admin."""
    _run_admin(etcd, None, lambda a: NamespaceAdmin(a).delete_failure_domain(domain))
    if as_json:
        _emit({"deleted": domain})
    else:
        _console().print(f"failure domain {domain}: deleted")


def register(admin_app: typer.Typer) -> None:
    """Add `namespaces …` and `clusters failure-domain …` to `ballast admin`."""
    admin_app.add_typer(namespaces_app, name="namespaces")
    admin_app.add_typer(clusters_app, name="clusters")
