"""The CLI (`broker`, `admin …`, `demo`) through Typer, against a live cluster on etcd.

The cluster runs in a background thread with its own event loop; the CLI runs in the
test's thread, exactly as an operator's shell would, with its own store connection.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from ballast.cli.cluster import register
from ballast.clock import SystemClock
from ballast.cluster import LocalCluster
from ballast.metadata.etcd import EtcdStore
from tests.cluster.conftest import wipe
from tests.cluster.helpers import fast_config
from tests.etcd_fixtures import EtcdServer

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


@pytest.fixture
def cluster(etcd_server: EtcdServer) -> Iterator[str]:
    """Three brokers over the shared etcd, in a background thread; yields the etcd URL."""
    started = threading.Event()
    failure: list[BaseException] = []
    holder: dict[str, Any] = {}

    async def run() -> None:
        stop = asyncio.Event()
        holder["stop"] = stop
        holder["loop"] = asyncio.get_running_loop()
        clock = SystemClock()
        config = fast_config()
        async with EtcdStore(etcd_server.client_url) as store:
            await wipe(store)
            async with LocalCluster(store, clock, config) as local:
                for b in ("b1", "b2", "b3"):
                    await local.start_broker(b)
                await local.wait_leader()
                started.set()
                await stop.wait()
            await wipe(store)

    def main() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:
            failure.append(exc)
            started.set()

    thread = threading.Thread(target=main, name="cluster", daemon=True)
    thread.start()
    assert started.wait(30), "cluster did not start"
    assert not failure, failure
    try:
        yield etcd_server.client_url
    finally:
        holder["loop"].call_soon_threadsafe(holder["stop"].set)
        thread.join(30)
        assert not failure, failure


def invoke(app: typer.Typer, *args: str) -> Any:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.output) if "--json" in args else result.output


def poll(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_admin_commands_end_to_end(app: typer.Typer, cluster: str, tmp_path: Path) -> None:
    etcd = ("--etcd", cluster)
    created = invoke(app, "admin", "topics", "create", "/cli/a", "/cli/b", *etcd, "--json")
    assert created == {"created": ["/cli/a", "/cli/b"]}
    for i in range(6):
        invoke(app, "admin", "topics", "create", f"/cli/h{i}", "--hint", "b1", *etcd)

    def all_assigned() -> bool:
        topics = invoke(app, "admin", "topics", "list", *etcd, "--json")
        return len(topics) == 8 and all(t["state"] == "assigned" for t in topics)

    poll(all_assigned, 20, "8 topics assigned")
    topics = {t["topic"]: t for t in invoke(app, "admin", "topics", "list", *etcd, "--json")}
    assert all(topics[f"/cli/h{i}"]["owner"] == "b1" for i in range(6))
    assert topics["/cli/a"]["age_seconds"] >= 0

    brokers = invoke(app, "admin", "brokers", "list", *etcd, "--json")
    assert [b["broker_id"] for b in brokers] == ["b1", "b2", "b3"]
    assert sum(b["leader"] for b in brokers) == 1
    assert "b1" in invoke(app, "admin", "brokers", "list", *etcd)  # the rich table
    leader = invoke(app, "admin", "cluster", "leader", *etcd, "--json")
    assert leader["broker_id"] in {"b1", "b2", "b3"}

    detail = invoke(app, "admin", "topics", "describe", "/cli/a", *etcd, "--json")
    assert detail["owner"] in {"b1", "b2", "b3"}
    # Served, not moving: the placement is what an unload would do; the owner is no source.
    assert detail["placement"]["rejected"][detail["owner"]].startswith("[owner] serves it now")
    assert "if unloaded now" in invoke(app, "admin", "topics", "describe", "/cli/a", *etcd)

    balance = invoke(app, "admin", "cluster", "balance", *etcd, "--json")
    assert balance["cv"] > 0.3 and {b["broker_id"] for b in balance["brokers"]} == {
        "b1",
        "b2",
        "b3",
    }

    # A dry-run plan (young topics allowed by the given config), saved and then applied.
    config = tmp_path / "rules.yaml"
    config.write_text(
        yaml.safe_dump({"load_manager": {"rebalancing": {"min_topic_age_seconds": 0}}})
    )
    plan = invoke(
        app, "admin", "cluster", "rebalance", "--dry-run", "--max-moves", "2",
        "--config", str(config), *etcd, "--json",
    )  # fmt: skip
    assert plan["dry_run"] is True and len(plan["moves"]) == 2
    assert all(m["from_broker"] == "b1" for m in plan["moves"])
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    applied = invoke(
        app, "admin", "cluster", "rebalance", "--plan", str(plan_file), *etcd, "--json"
    )
    assert [o["applied"] for o in applied["outcomes"]] == [True, True]
    history = invoke(app, "admin", "cluster", "history", *etcd, "--json")
    assert [m["topic"] for m in history] == [m["topic"] for m in plan["moves"]]

    def moved() -> bool:
        owners = {
            t["topic"]: t["owner"] for t in invoke(app, "admin", "topics", "list", *etcd, "--json")
        }
        return all(owners[m["topic"]] == m["to_broker"] for m in plan["moves"])

    poll(moved, 20, "the planned moves to complete")

    owner = invoke(app, "admin", "topics", "unload", "/cli/a", *etcd, "--json")["from_broker"]
    poll(
        lambda: (
            invoke(app, "admin", "topics", "describe", "/cli/a", *etcd, "--json")["owner"]
            not in (None, owner)
        ),
        20,
        "/cli/a to move",
    )

    invoke(app, "admin", "brokers", "drain", "b3", *etcd)

    def drained() -> bool:
        b3 = invoke(app, "admin", "brokers", "list", *etcd, "--json")[2]
        return b3["state"] == "drained" and b3["topics"] == 0

    poll(drained, 20, "b3 drained")
    invoke(app, "admin", "brokers", "activate", "b3", *etcd)
    assert invoke(app, "admin", "brokers", "list", *etcd, "--json")[2]["state"] == "active"


def test_admin_errors_say_what_is_wrong(app: typer.Typer, cluster: str) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["admin", "topics", "create", "no-slashes", "--etcd", cluster])
    assert bad.exit_code == 1 and "expected the form /namespace/topic" in bad.output
    ghost = runner.invoke(app, ["admin", "brokers", "drain", "ghost", "--etcd", cluster])
    assert ghost.exit_code == 1 and "'ghost' is not registered" in ghost.output
    missing = runner.invoke(app, ["admin", "topics", "describe", "/no/such", "--etcd", cluster])
    assert missing.exit_code == 1 and "does not exist" in missing.output
    nowhere = runner.invoke(app, ["admin", "cluster", "leader", "--etcd", "localhost:2379"])
    assert nowhere.exit_code == 2 and "expected 'memory' or etcd endpoints" in nowhere.output


def test_demo_command_runs_and_reports(app: typer.Typer) -> None:
    result = CliRunner().invoke(app, ["demo", "--topics", "60"])
    assert result.exit_code == 0, result.output
    for line in ("CV after rebalancing", "failover of", "drain of", "ok"):
        assert line in result.output
