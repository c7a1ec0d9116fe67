"""`ballast admin namespaces create|list|delete`: the namespaces topics live in.

A namespace is the first part of a topic name (``/{namespace}/{topic}``). ``default``
exists from the start (every broker creates it); producers can only create topics in a
namespace that exists. Deleting a namespace that still has topics is refused.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ballast.cli.cluster import (
    DEFAULT_ETCD,
    EtcdOption,
    JsonOption,
    _console,
    _emit,
    _run_admin,
    _when,
)
from ballast.cluster.admin import AdminClient, AdminError
from ballast.metadata import Compare, Delete, Put, keys

namespaces_app = typer.Typer(help="Create, list and delete namespaces.", no_args_is_help=True)

NameArgument = Annotated[str, typer.Argument(help="Namespace name.")]


def _key(name: str) -> str:
    try:
        return keys.namespace(name)
    except ValueError as exc:
        raise AdminError(str(exc)) from None


async def create_namespace(admin: AdminClient, name: str) -> str:
    """Create a namespace; AdminError if it exists already."""
    key = _key(name)
    result = await admin.store.txn(
        [Compare.absent(key)], [Put(key, {"created_at": admin.clock.now()})]
    )
    if not result.succeeded:
        raise AdminError(f"namespace {name!r} already exists")
    return name


async def list_namespaces(admin: AdminClient) -> list[dict[str, object]]:
    """Every namespace with its creation time and topic count."""
    listing = await admin.store.get_prefix(keys.NAMESPACES_PREFIX)
    topics = await admin.store.get_prefix(keys.TOPICS_PREFIX)
    counts: dict[str, int] = {}
    for kv in topics.items:
        parts = kv.key[len(keys.TOPICS_PREFIX) :].split("/")
        if len(parts) == 3 and parts[2] == "meta":
            counts[parts[0]] = counts.get(parts[0], 0) + 1
    out: list[dict[str, object]] = []
    for kv in listing.items:
        try:
            name = keys.parse_namespace_key(kv.key)
        except ValueError:
            continue
        created = kv.value.get("created_at") if isinstance(kv.value, dict) else None
        out.append({"namespace": name, "created_at": created, "topics": counts.get(name, 0)})
    return out


async def delete_namespace(admin: AdminClient, name: str) -> str:
    """Delete an empty namespace; AdminError if it is missing or still has topics."""
    key = _key(name)
    if await admin.store.get(key) is None:
        raise AdminError(f"namespace {name!r} does not exist")
    topics = await admin.store.get_prefix(keys.namespace_topics_prefix(name))
    if topics.items:
        raise AdminError(f"namespace {name!r} still has topics; delete or move them first")
    result = await admin.store.txn([Compare.present(key)], [Delete(key)])
    if not result.succeeded:
        raise AdminError(f"namespace {name!r} was deleted meanwhile")
    return name


@namespaces_app.command("create")
def namespaces_create(
    name: NameArgument, etcd: EtcdOption = DEFAULT_ETCD, as_json: JsonOption = False
) -> None:
    """Create a namespace."""
    created = _run_admin(etcd, None, lambda a: create_namespace(a, name))
    if as_json:
        _emit({"created": created})
    else:
        _console().print(f"created namespace {created}")


@namespaces_app.command("list")
def namespaces_list(etcd: EtcdOption = DEFAULT_ETCD, as_json: JsonOption = False) -> None:
    """Namespaces with their creation time and topic count."""
    rows = _run_admin(etcd, None, list_namespaces)
    if as_json:
        _emit(rows)
        return
    table = Table("namespace", "topics", "created", title=f"{len(rows)} namespaces")
    for row in rows:
        created = row["created_at"]
        table.add_row(
            str(row["namespace"]),
            str(row["topics"]),
            _when(created) if isinstance(created, int | float) else "-",
        )
    _console().print(table)


@namespaces_app.command("delete")
def namespaces_delete(
    name: NameArgument, etcd: EtcdOption = DEFAULT_ETCD, as_json: JsonOption = False
) -> None:
    """Delete an empty namespace."""
    deleted = _run_admin(etcd, None, lambda a: delete_namespace(a, name))
    if as_json:
        _emit({"deleted": deleted})
    else:
        _console().print(f"deleted namespace {deleted}")


def register(admin_app: typer.Typer) -> None:
    """Add `namespaces` to the `admin` command group."""
    admin_app.add_typer(namespaces_app, name="namespaces")
