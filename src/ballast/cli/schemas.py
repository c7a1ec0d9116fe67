"""`ballast admin schemas …`, `ballast admin topics set-schema|schema` and
`ballast admin namespaces dead-letter` (a namespace's nack policy).

The schema registry lives in the metadata store, so these commands work on it directly
(``--etcd``), exactly as the brokers' ``danube_schema.SchemaRegistry`` service does (one
`SchemaStore`). Brokers see a topic's new binding or policy within a couple of seconds
(they cache it briefly).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape
from rich.table import Table

from ballast.cli.cluster import (
    DEFAULT_ETCD,
    EtcdOption,
    JsonOption,
    _console,
    _emit,
    _fail,
    _run_admin,
    topics_app,
)
from ballast.cluster.admin import AdminClient, AdminError
from ballast.metadata import keys
from ballast.model import InvalidTopicName, TopicName
from ballast.registry.service import SchemaStore, subject_rows, topic_binding, version_dict
from ballast.schemas import SchemaError, SchemaVersion
from ballast.wire.errors import RpcFailure

__all__ = ["register", "register_dead_letters", "schemas_app"]

T = TypeVar("T")

schemas_app = typer.Typer(
    help="The schema registry: register, get, list, versions, compatibility, delete.",
    no_args_is_help=True,
)

SubjectArg = Annotated[str, typer.Argument(help="Schema subject.")]
TopicArg = Annotated[str, typer.Argument(help="Topic name, /namespace/topic.")]


def _run(etcd: str, action: Callable[[SchemaStore], Awaitable[T]]) -> T:
    """Run one registry action; refusals exit 1 with the field and rule."""

    async def run(admin: AdminClient) -> T:
        try:
            return await action(SchemaStore(admin.store, admin.clock))
        except SchemaError as exc:
            raise AdminError(str(exc)) from None
        except RpcFailure as exc:
            raise AdminError(exc.message) from None

    return _run_admin(etcd, None, run)


def _topic(value: str) -> TopicName:
    try:
        return TopicName.parse(value)
    except InvalidTopicName as exc:
        raise _fail(str(exc), 2) from None


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts else "-"


def _definition(schema: str | None, file: Path | None) -> bytes:
    if (schema is None) == (file is None):
        raise _fail("give the definition with exactly one of --schema TEXT or --file PATH", 2)
    if file is not None:
        try:
            return file.read_bytes()
        except OSError as exc:
            raise _fail(f"--file {file}: cannot read ({exc.strerror})", 2) from None
    assert schema is not None
    return schema.encode()


TypeOption = Annotated[
    str,
    typer.Option(
        "--type", help="json_schema, avro, protobuf (a FileDescriptorSet), string, number, bytes."
    ),
]
SchemaOption = Annotated[str | None, typer.Option("--schema", help="The definition, inline.")]
FileOption = Annotated[Path | None, typer.Option("--file", help="The definition, from a file.")]


@schemas_app.command("register")
def schemas_register(
    subject: SubjectArg,
    schema_type: TypeOption = "json_schema",
    schema: SchemaOption = None,
    file: FileOption = None,
    description: Annotated[str, typer.Option("--description")] = "",
    created_by: Annotated[str, typer.Option("--created-by")] = "ballast-cli",
    tags: Annotated[list[str] | None, typer.Option("--tag", help="Repeatable.")] = None,
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Register a version (checked against the subject's compatibility mode)."""
    data = _definition(schema, file)
    version, is_new = _run(
        etcd,
        lambda s: s.register(
            subject,
            schema_type,
            data,
            description=description,
            created_by=created_by,
            tags=tuple(tags or ()),
        ),
    )
    if as_json:
        _emit({**version_dict(version), "is_new_version": is_new})
        return
    verb = "registered" if is_new else "already registered as"
    _console().print(
        f"{escape(subject)}: {verb} version {version.version} (schema id {version.schema_id}, "
        f"{version.fingerprint})"
    )


@schemas_app.command("get")
def schemas_get(
    subject: SubjectArg,
    version: Annotated[
        int | None, typer.Option("--version", min=1, help="Default: latest.")
    ] = None,
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """A version of a subject with its definition."""

    async def get(s: SchemaStore) -> SchemaVersion:
        if version is None:
            return await s.latest(subject)
        found = await s.version(subject, version)
        if found is None:
            raise AdminError(f"subject {subject!r} has no version {version}")
        return found

    found = _run(etcd, get)
    data = version_dict(found, definition=True)
    if as_json:
        _emit(data)
        return
    for key, value in data.items():
        if key != "definition":
            _console().print(f"{key}: {escape(str(value))}", highlight=False)
    typer.echo(data.get("definition", data.get("definition_hex", "")))


@schemas_app.command("list")
def schemas_list(etcd: EtcdOption = DEFAULT_ETCD, as_json: JsonOption = False) -> None:
    """Every subject with its id, compatibility mode and latest version."""

    rows = _run(etcd, subject_rows)
    if as_json:
        _emit(rows)
        return
    table = Table(
        "subject", "id", "type", "compatibility", "versions", title=f"{len(rows)} subjects"
    )
    for r in rows:
        table.add_row(
            escape(r["subject"]),
            str(r["schema_id"]),
            r["schema_type"] or "-",
            r["compatibility"],
            ",".join(str(v) for v in r["versions"]) or "-",
        )
    _console().print(table)


@schemas_app.command("versions")
def schemas_versions(
    subject: SubjectArg, etcd: EtcdOption = DEFAULT_ETCD, as_json: JsonOption = False
) -> None:
    """A subject's versions."""

    async def versions(s: SchemaStore) -> list[SchemaVersion]:
        if await s.subject(subject) is None:
            raise AdminError(f"subject {subject!r} does not exist")
        return await s.versions(subject)

    found = _run(etcd, versions)
    if as_json:
        _emit([version_dict(v) for v in found])
        return
    table = Table("version", "type", "fingerprint", "created", "by", title=escape(subject))
    for v in found:
        table.add_row(
            str(v.version), v.schema_type.value, v.fingerprint[:23], _when(v.created_at),
            escape(v.created_by),
        )  # fmt: skip
    _console().print(table)


@schemas_app.command("compatibility")
def schemas_compatibility(
    subject: SubjectArg,
    set_mode: Annotated[
        str | None, typer.Option("--set", help="Set the mode: none, backward, forward, full.")
    ] = None,
    check_file: Annotated[
        Path | None, typer.Option("--check", help="Check this definition against the latest.")
    ] = None,
    schema_type: TypeOption = "json_schema",
    mode: Annotated[
        str | None, typer.Option("--mode", help="With --check: this mode, not the subject's.")
    ] = None,
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Show or set a subject's compatibility mode, or check a definition against it."""
    if set_mode is not None and check_file is not None:
        raise _fail("give --set or --check, not both", 2)
    if check_file is not None:
        data = _definition(None, check_file)
        errors = _run(etcd, lambda s: s.check(subject, schema_type, data, mode))
        if as_json:
            _emit({"subject": subject, "is_compatible": not errors, "errors": errors})
        elif errors:
            _console().print(f"{escape(subject)}: NOT compatible")
            for e in errors:
                _console().print(f"  {escape(e)}", highlight=False)
        else:
            _console().print(f"{escape(subject)}: compatible")
        if errors:
            raise typer.Exit(1)
        return

    async def mode_of(s: SchemaStore) -> str:
        if set_mode is not None:
            return (await s.set_mode(subject, set_mode)).value
        current = await s.subject(subject)
        if current is None:
            raise AdminError(f"subject {subject!r} does not exist")
        return current[0].compatibility.value

    chosen = _run(etcd, mode_of)
    if as_json:
        _emit({"subject": subject, "compatibility": chosen})
    else:
        _console().print(f"{escape(subject)}: compatibility {chosen}")


@schemas_app.command("delete")
def schemas_delete(
    subject: SubjectArg,
    version: Annotated[int, typer.Option("--version", min=1, help="The version to delete.")],
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Delete one version of a subject (its number is never reused)."""
    _run(etcd, lambda s: s.delete_version(subject, version))
    if as_json:
        _emit({"subject": subject, "deleted_version": version})
    else:
        _console().print(f"{escape(subject)}: deleted version {version}")


@topics_app.command("set-schema")
def topics_set_schema(
    topic: TopicArg,
    subject: Annotated[str, typer.Option("--subject", help="The schema subject.")],
    policy: Annotated[
        str, typer.Option("--policy", help="none, warn (log and count) or enforce (refuse).")
    ] = "enforce",
    etcd: EtcdOption = DEFAULT_ETCD,
    as_json: JsonOption = False,
) -> None:
    """Bind a topic to a subject with a validation policy."""
    name = _topic(topic)
    config = _run(etcd, lambda s: s.configure_topic(name, subject, policy, policy != "none"))
    if as_json:
        _emit({"topic": str(name), **config.to_dict()})
    else:
        _console().print(f"{name}: subject {escape(config.subject)}, policy {config.policy.value}")


@topics_app.command("schema")
def topics_schema(
    topic: TopicArg, etcd: EtcdOption = DEFAULT_ETCD, as_json: JsonOption = False
) -> None:
    """A topic's schema binding."""
    name = _topic(topic)

    async def binding(s: SchemaStore) -> dict[str, Any]:
        found = await topic_binding(s, name)
        if found is None:
            raise AdminError(f"topic {name} has no schema (ballast admin topics set-schema)")
        return found

    data = _run(etcd, binding)
    if as_json:
        _emit(data)
        return
    _console().print(
        f"{name}: subject {escape(str(data['subject']))} (schema id {data['schema_id']}), "
        f"policy {data['validation_policy']}"
    )


def register(admin_app: typer.Typer) -> None:
    """Add `schemas` to `ballast admin` (the topic commands sit on `admin topics`)."""
    admin_app.add_typer(schemas_app, name="schemas")


def register_dead_letters(namespaces_app: typer.Typer) -> None:
    """Add `dead-letter` to `ballast admin namespaces`."""

    @namespaces_app.command("dead-letter")
    def ns_dead_letter(
        namespace: Annotated[str, typer.Argument(help="Namespace name.")],
        max_deliveries: Annotated[
            int | None,
            typer.Option("--max-deliveries", min=0, help="Deliveries before dead-lettering."),
        ] = None,
        topic: Annotated[
            str | None,
            typer.Option("--topic", help="Dead-letter topic (default: /ns/topic-DLQ)."),
        ] = None,
        clear: Annotated[bool, typer.Option("--clear", help="Back to the configuration.")] = False,
        etcd: EtcdOption = DEFAULT_ETCD,
        as_json: JsonOption = False,
    ) -> None:
        """Show or set a namespace's nack policy (brokers apply it within seconds)."""
        if topic is not None:
            _topic(topic)

        async def policy(admin: AdminClient) -> dict[str, Any] | None:
            key = keys.dead_letter_policy(namespace)
            if clear:
                await admin.store.delete(key)
                return None
            kv = await admin.store.get(key)
            current = dict(kv.value) if kv is not None and isinstance(kv.value, dict) else {}
            if max_deliveries is None and topic is None:
                return current or None
            if max_deliveries is not None:
                current["max_deliveries"] = max_deliveries
            if topic is not None:
                current["dead_letter_topic"] = topic
            await admin.store.put(key, current)
            return current

        try:
            found = _run_admin(etcd, None, policy)
        except ValueError as exc:
            raise _fail(str(exc), 2) from None
        if as_json:
            _emit({"namespace": namespace, "policy": found})
        elif found is None:
            _console().print(
                f"{escape(namespace)}: the configuration's (data_plane.max_deliveries)"
            )
        else:
            _console().print(f"{escape(namespace)}: {escape(str(found))}")
