"""Pulsar's admin operations (bundles, splits, unloads, anti-affinity, failure domains) over
the embedded store, and `rebalance --dry-run` explaining a shedder."""

from __future__ import annotations

import json

import pytest

from ballast.cluster.admin import AdminClient, AdminError
from ballast.cluster.namespaces import NamespaceAdmin
from ballast.config import parse_config
from ballast.leader.view import ClusterView
from ballast.metadata import keys
from ballast.metadata.memory import MemoryStore
from ballast.metadata.records import Registration, TopicMeta
from ballast.model import Assignment, LoadReport, TopicLoad

NOW = 1_700_000_000.0


async def seeded(config: dict | None = None) -> NamespaceAdmin:
    store = MemoryStore()
    spec = {"b1": (92.0, 12), "b2": (20.0, 4), "b3": (10.0, 2)}
    for b, (cpu, n) in spec.items():
        await store.put(keys.register(b), Registration(f"127.0.0.1:1{b[1]}").to_dict())
        loads = []
        for i in range(n):
            t = f"/orders/{b}-t{i:02d}"
            await store.put(keys.broker_assignment(b, t), Assignment(NOW - 7200).to_dict())
            await store.put(keys.topic_meta(t), TopicMeta(NOW - 7200).to_dict())
            loads.append(TopicLoad(t, msg_rate=100.0 * (i + 1), byte_rate=(i + 1) * 1e6))
        await store.put(keys.load(b), LoadReport(b, NOW, cpu, 5.0, topics=tuple(loads)).to_dict())
    return NamespaceAdmin(AdminClient(store, config=parse_config(config or {})))


async def test_create_list_split_and_errors() -> None:
    ns = await seeded()
    layout = await ns.create("orders", 4)
    assert len(layout) == 4
    with pytest.raises(AdminError, match="namespace 'orders' already exists"):
        await ns.create("orders", 8)
    with pytest.raises(AdminError, match="--bundles 0: invalid number of bundles 0"):
        await ns.create("other", 0)
    report = await ns.bundles("orders")
    assert report.stored and sum(r.topics for r in report.rows) == 18
    target = max(report.rows, key=lambda r: r.topics).name
    out = await ns.split("orders", target, "topic_count_equally_divide", unload=False)
    assert len(out.layout) == 5 and out.unloaded == ()
    with pytest.raises(AdminError, match="unknown split algorithm 'halves'"):
        await ns.split("orders", "0x00000000_0x40000000", "halves")
    with pytest.raises(AdminError, match="split position 0x50000000 is outside bundle"):
        await ns.split(
            "orders", "0x00000000_0x40000000", "specified_positions_divide", [0x50000000]
        )
    with pytest.raises(AdminError, match="has no bundle 0x00000000_0x30000000"):
        await ns.split("orders", "0x00000000_0x30000000")
    # a namespace never created shows the default layout, not stored
    assert not (await ns.bundles("billing")).stored


async def test_split_with_unload_and_unload_bundle() -> None:
    ns = await seeded()
    await ns.create("orders", 2)
    out = await ns.split("orders", "0x00000000_0x80000000", "range_equally_divide", unload=True)
    assert out.unloaded and all(b in ("b1", "b2", "b3") for _, b in out.unloaded)
    markers = await ns.store.get_prefix("/cluster/unassigned/")
    assert len(markers.items) == len(out.unloaded)
    moved = await ns.unload_bundle("orders", "0x80000000_0xffffffff")
    assert moved
    with pytest.raises(AdminError, match="has no assigned topic to unload"):
        await ns.unload_bundle("orders", "0x80000000_0xffffffff")


async def test_failure_domains_and_anti_affinity() -> None:
    ns = await seeded()
    await ns.create_failure_domain("rack-a", ["b1", "b2"])
    with pytest.raises(AdminError, match="broker 'b2' is in two failure domains"):
        await ns.create_failure_domain("rack-b", ["b2", "b3"])
    await ns.create_failure_domain("rack-b", ["b3"])
    assert [(d.name, d.brokers) for d in await ns.list_failure_domains()] == [
        ("rack-a", ("b1", "b2")),
        ("rack-b", ("b3",)),
    ]
    with pytest.raises(AdminError, match="failure domain 'rack-z' does not exist"):
        await ns.delete_failure_domain("rack-z")
    await ns.set_anti_affinity_group("orders", "g")
    view = await ns.admin.view()
    snap = ns.admin.enrich(view, view.snapshot())
    assert snap.broker_domains == {"b1": "rack-a", "b2": "rack-a", "b3": "rack-b"}
    assert snap.anti_affinity_groups == {"orders": "g"}


async def test_dry_run_explains_the_threshold_shedder() -> None:
    ns = await seeded({"load_manager": {"rebalancing": {"enabled": True, "policy": "threshold"}}})
    result = await ns.admin.rebalance(dry_run=True)
    plan = result.plan
    assert plan.reason.startswith("[threshold] avg usage 40.7% over 3 broker(s)")
    assert plan.details[0].startswith("b1: [shed] usage 92.0% ≥ 50.7%")
    assert plan.moves and {m.from_broker for m in plan.moves} == {"b1"}
    assert plan.to_dict()["details"] == list(plan.details)


def test_pulsar_keys_round_trip_and_reject_bad_names() -> None:
    assert keys.namespace_bundles("orders") == "/cluster/bundles/orders"
    assert keys.parse_bundles_key("/cluster/bundles/orders") == "orders"
    assert keys.parse_anti_affinity_key(keys.anti_affinity_group("a.b")) == "a.b"
    assert keys.parse_failure_domain_key(keys.failure_domain("rack-1")) == "rack-1"
    with pytest.raises(ValueError, match="invalid namespace 'a/b'"):
        keys.namespace_bundles("a/b")
    with pytest.raises(keys.KeyLayoutError):
        keys.parse_bundles_key("/cluster/bundles/a/b")


async def test_the_leaders_view_carries_domains_and_groups_into_the_snapshot() -> None:
    ns = await seeded()
    await ns.create_failure_domain("rack-a", ["b1", "b2"])
    await ns.set_anti_affinity_group("orders", "g")
    await ns.store.put(keys.failure_domain("broken"), {"brokers": "b3"})  # bad value
    listing = await ns.store.get_prefix(keys.CLUSTER_PREFIX)
    view, bad = ClusterView.from_listings(listing)
    assert [b.key for b in bad] == ["/cluster/failure_domains/broken"]
    snap = view.snapshot()
    assert snap.broker_domains == {"b1": "rack-a", "b2": "rack-a"}
    assert snap.anti_affinity_groups == {"orders": "g"}
    await ns.delete_failure_domain("rack-a")
    view, _ = ClusterView.from_listings(await ns.store.get_prefix(keys.CLUSTER_PREFIX))
    assert view.snapshot().broker_domains == {}


def test_cli_bad_input_names_the_value() -> None:
    from typer.testing import CliRunner

    from ballast.cli.main import app

    runner = CliRunner()
    mem = ("--etcd", "memory")
    cases = [
        (
            [
                "namespaces",
                "split-bundle",
                "orders",
                "0x00000000_0x40000000",
                "--algorithm",
                "halves",
            ],
            "unknown split algorithm 'halves'",
        ),
        (
            ["namespaces", "split-bundle", "orders", "0x00000000_0x40000000", "--positions", "zz"],
            "invalid split position 'zz'",
        ),
        (["namespaces", "create", "orders", "--bundles", "0"], "--bundles 0"),
        (["namespaces", "bundles", "a/b"], "invalid namespace 'a/b'"),
        (["clusters", "failure-domain", "delete", "nowhere"], "failure domain 'nowhere'"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["admin", *args, *mem])
        assert result.exit_code == 1, (args, result.output)
        assert message in " ".join(result.output.split()), result.output
    ok = runner.invoke(
        app, ["admin", "namespaces", "create", "orders", "--bundles", "2", *mem, "--json"]
    )
    assert ok.exit_code == 0
    assert json.loads(ok.output)["bundles"] == [
        "orders/0x00000000_0x80000000",
        "orders/0x80000000_0xffffffff",
    ]


async def test_set_retention_stores_the_policy_clears_it_and_names_bad_input() -> None:
    from ballast.storage.retention import RetentionPolicy, load_policy

    ns = await seeded()
    policy = await ns.set_retention("orders", "7d", "10GiB")
    assert policy == RetentionPolicy(7 * 86_400, 10 * 2**30)
    assert await load_policy(ns.store, "orders") == policy  # what the owner reads
    with pytest.raises(AdminError, match="invalid retention size '10 parsecs'"):
        await ns.set_retention("orders", None, "10 parsecs")
    assert await load_policy(ns.store, "orders") == policy  # a bad value changes nothing
    await ns.set_retention("orders", None, None)  # no limit: keep everything again
    assert (await load_policy(ns.store, "orders")).keeps_everything


def test_cli_set_retention() -> None:
    from typer.testing import CliRunner

    from ballast.cli.main import app

    runner = CliRunner()
    mem = ("--etcd", "memory")
    ok = runner.invoke(
        app, ["admin", "namespaces", "set-retention", "orders", "--time", "12h", *mem, "--json"]
    )
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output) == {
        "namespace": "orders",
        "time_seconds": 43_200.0,
        "size_bytes": None,
    }
    bad = runner.invoke(
        app, ["admin", "namespaces", "set-retention", "orders", "--time", "7y", *mem]
    )
    assert bad.exit_code == 1 and "invalid retention time '7y'" in bad.output
