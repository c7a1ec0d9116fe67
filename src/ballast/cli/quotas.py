"""`ballast admin namespaces set-policy`: a namespace's quotas (see `broker.quotas`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from ballast.cli.cluster import DEFAULT_ETCD, EtcdOption, JsonOption, _console, _emit, _run_admin
from ballast.cluster.admin import AdminClient
from ballast.metadata import keys

__all__ = ["register_quotas"]


def register_quotas(namespaces_app: typer.Typer) -> None:
    """Add `set-policy` to `ballast admin namespaces`."""

    @namespaces_app.command("set-policy")
    def ns_set_policy(
        namespace: Annotated[str, typer.Argument(help="Namespace name.")],
        max_topics: Annotated[
            int | None, typer.Option("--max-topics", min=0, help="Topics (0: unlimited).")
        ] = None,
        max_producers: Annotated[
            int | None,
            typer.Option("--max-producers-per-topic", min=0, help="Producers per topic."),
        ] = None,
        max_consumers: Annotated[
            int | None,
            typer.Option("--max-consumers-per-topic", min=0, help="Consumers per topic."),
        ] = None,
        max_subscriptions: Annotated[
            int | None,
            typer.Option("--max-subscriptions-per-topic", min=0, help="Subscriptions per topic."),
        ] = None,
        auto_create: Annotated[
            bool | None,
            typer.Option(
                "--auto-create/--no-auto-create",
                help="Whether a producer may create a topic (default: the configuration's).",
            ),
        ] = None,
        clear: Annotated[bool, typer.Option("--clear", help="Remove every quota.")] = False,
        etcd: EtcdOption = DEFAULT_ETCD,
        as_json: JsonOption = False,
    ) -> None:
        """Show or set a namespace's quotas (brokers apply them within 5 s).

        Over a quota, CreateProducer, Subscribe or a topic's creation is refused with
        FAILED_PRECONDITION naming the quota; what exists already is left alone.
        """
        given = {
            "max_topics": max_topics,
            "max_producers_per_topic": max_producers,
            "max_consumers_per_topic": max_consumers,
            "max_subscriptions_per_topic": max_subscriptions,
            "auto_create_topics": auto_create,
        }

        async def policy(admin: AdminClient) -> dict[str, Any] | None:
            key = keys.quota_policy(namespace)
            if clear:
                await admin.store.delete(key)
                return None
            kv = await admin.store.get(key)
            current = dict(kv.value) if kv is not None and isinstance(kv.value, dict) else {}
            changes = {k: v for k, v in given.items() if v is not None}
            if not changes:
                return current or None
            current.update(changes)
            await admin.store.put(key, current)
            return current

        found = _run_admin(etcd, None, policy)
        if as_json:
            _emit({"namespace": namespace, "policy": found})
        elif found is None:
            _console().print(f"{escape(namespace)}: no quotas (unlimited)")
        else:
            _console().print(f"{escape(namespace)}: {escape(str(found))}")
