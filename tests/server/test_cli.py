"""`ballast admin namespaces`, `admin topics create --partitions`, `produce` and `consume`
against a live data-plane broker on etcd (the CLI's own event loop runs in a thread)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from typer.testing import CliRunner

from ballast.cli.data import consume, produce
from ballast.cli.main import app
from tests.server.helpers import DataCluster, wait_until

pytestmark = pytest.mark.timeout(60)


async def cli(*args: str, ok: bool = True) -> Any:
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args))
    if ok:
        assert result.exit_code == 0, result.output
        return json.loads(result.output) if "--json" in args else result.output
    assert result.exit_code != 0
    return result.output


async def test_namespaces_partitions_produce_and_consume(
    cluster: DataCluster, etcd_server: Any
) -> None:
    etcd = ("--etcd", etcd_server.client_url)
    created_ns = await cli("admin", "namespaces", "create", "shop", *etcd, "--json")
    assert created_ns["created"] == "shop" and len(created_ns["bundles"]) == 4
    assert "already exists" in await cli("admin", "namespaces", "create", "shop", *etcd, ok=False)
    assert "invalid namespace" in await cli(
        "admin", "namespaces", "create", "bad name", *etcd, ok=False
    )
    listed = await cli("admin", "namespaces", "list", *etcd, "--json")
    assert {row["namespace"] for row in listed} == {"default", "shop"}
    created = await cli(
        "admin", "topics", "create", "/shop/orders", "--partitions", "3", "--reliable",
        *etcd, "--json",
    )  # fmt: skip
    names = [f"/shop/orders-part-{i}" for i in range(3)]
    assert created == {"created": names}
    for name in names:
        await cluster.wait_served(name)
    url = cluster.brokers["b1"].url
    consuming = asyncio.create_task(
        consume(url, "/shop/orders", "s", sub_type="shared", count=30, name="c", quiet=True)
    )
    host = cluster.brokers["b1"].host

    async def subscribed() -> bool:
        return all("s" in host.topics[n].subscriptions for n in names)

    await wait_until(subscribed, 10, "the consumer on every partition")
    sent = await produce(
        url, "/shop/orders", count=30, rate=0, size=64, reliable=True, partitions=3,
        name="p", quiet=True,
    )  # fmt: skip
    assert (sent.sent, sent.failed) == (30, 0)
    got = await asyncio.wait_for(consuming, 20)
    assert got.received == 30 and got.partitions == names and got.redelivered == 0
    # A namespace with topics is not deleted; an empty one is.
    assert "still has topics" in await cli("admin", "namespaces", "delete", "shop", *etcd, ok=False)
    await cli("admin", "namespaces", "create", "empty", *etcd)
    await cli("admin", "namespaces", "delete", "empty", *etcd)
