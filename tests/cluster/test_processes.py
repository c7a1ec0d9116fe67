"""Fault tests with real broker processes on a real etcd: SIGKILL a broker, SIGKILL the leader.

Each broker is ``python -m ballast.cluster.run`` in its own OS process; nothing is shut
down gracefully, so the cluster learns of a death only when the dead process's leases
expire in etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from ballast.clock import SystemClock
from ballast.cluster import AdminClient
from ballast.metadata import keys
from ballast.metadata.etcd import EtcdStore
from tests.cluster.helpers import wait_settled, wait_until
from tests.etcd_fixtures import EtcdServer

pytestmark = pytest.mark.timeout(90)

TTL = 2.0


class Brokers:
    """Broker processes started for one test; all killed at the end."""

    def __init__(self, etcd_url: str, config: Path) -> None:
        self.etcd_url = etcd_url
        self.config = config
        self.procs: dict[str, asyncio.subprocess.Process] = {}

    async def start(self, *broker_ids: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for broker_id in broker_ids:
            self.procs[broker_id] = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "ballast.cluster.run",
                "--etcd",
                self.etcd_url,
                "--config",
                str(self.config),
                "--id",
                broker_id,
                "--log-level",
                "WARNING",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                env=env,
            )
        for broker_id in broker_ids:
            await self._wait_started(broker_id)

    async def _wait_started(self, broker_id: str) -> None:
        proc = self.procs[broker_id]
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            while True:
                line = await proc.stdout.readline()
                if not line:
                    raise AssertionError(f"broker {broker_id} exited before starting")
                if line.decode().strip() == f"BROKER-STARTED {broker_id}":
                    return

    def kill(self, broker_id: str) -> None:
        self.procs[broker_id].send_signal(signal.SIGKILL)

    async def close(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()


@pytest.fixture
async def setup(
    etcd_store: EtcdStore, etcd_server: EtcdServer, tmp_path: Path
) -> AsyncIterator[tuple[Brokers, AdminClient]]:
    config = tmp_path / "broker.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "load_manager": {
                    "load_report_interval_seconds": 0.3,
                    "assignment_strategy": "fair",
                },
                "broker": {
                    "registration_ttl_seconds": TTL,
                    "leader_ttl_seconds": TTL,
                    "broker_url": "127.0.0.1:0",
                },
                "history": {"enabled": False},
                "metrics": {"enabled": False},
                "storage": {"data_dir": str(tmp_path / "data")},  # not the working dir
            }
        )
    )
    brokers = Brokers(etcd_server.client_url, config)
    try:
        await brokers.start("p1", "p2", "p3")
        yield brokers, AdminClient(etcd_store, SystemClock())
    finally:
        await brokers.close()


async def test_sigkilled_broker_topics_are_owned_elsewhere_within_ttl(
    setup: tuple[Brokers, AdminClient],
) -> None:
    brokers, admin = setup
    await admin.create_topics(f"/pk/t{i}" for i in range(90))
    view = await wait_settled(admin, 90, timeout=30)
    leader = (await admin.leader() or {}).get("broker_id")
    victim = next(b for b in ("p1", "p2", "p3") if b != leader)
    orphans = set(view.topics_of(victim))
    assert orphans

    brokers.kill(victim)
    killed_at = time.monotonic()

    async def owned_elsewhere() -> bool:
        view = await admin.view()
        return all(view.owner(t) not in (None, victim) for t in orphans)

    await wait_until(owned_elsewhere, TTL + 2, f"{victim}'s topics owned elsewhere")
    assert time.monotonic() - killed_at <= TTL + 2
    view = await wait_settled(admin, 90, timeout=5)
    assert victim not in view.registrations and victim not in view.by_broker


async def test_sigkilled_leader_is_replaced_within_ttl_and_nothing_is_lost(
    setup: tuple[Brokers, AdminClient],
) -> None:
    brokers, admin = setup
    await admin.create_topics(f"/pl/t{i}" for i in range(60))
    await wait_settled(admin, 60, timeout=30)
    leader = (await admin.leader() or {}).get("broker_id")
    assert leader in ("p1", "p2", "p3")

    brokers.kill(leader)
    killed_at = time.monotonic()
    # Topics created while nobody leads wait for the next leader.
    await admin.create_topics(f"/pl/late{i}" for i in range(10))

    async def replaced() -> bool:
        current = await admin.leader()
        return current is not None and current["broker_id"] not in (None, leader)

    await wait_until(replaced, TTL + 2, "a new leader")
    assert time.monotonic() - killed_at <= TTL + 2

    # Nothing lost: every topic, the old leader's included, ends up on a live broker. (The
    # new leader may place a late topic on the dead leader while its registration has not
    # expired yet; its failover follows the expiry.)
    async def on_live_brokers() -> bool:
        view = await admin.view()
        return (
            len(view.owners) == 70
            and not view.markers
            and leader not in view.registrations
            and set(view.by_broker) <= {"p1", "p2", "p3"} - {leader}
        )

    await wait_until(on_live_brokers, TTL + 5, "every topic on a live broker")


async def test_broker_command_serves_and_leaves_gracefully_on_sigterm(
    etcd_store: EtcdStore, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    """`ballast broker` (through the Typer app) registers, leads, and on SIGTERM revokes its
    lease at once instead of leaving the cluster to wait for the TTL."""
    config = tmp_path / "broker.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "broker": {
                    "registration_ttl_seconds": 30,
                    "leader_ttl_seconds": 30,
                    "broker_url": "127.0.0.1:0",
                },
                "history": {"enabled": False},
                "metrics": {"enabled": False},
                "storage": {"data_dir": str(tmp_path / "data")},  # not the working dir
            }
        )
    )
    script = (
        "import typer; from ballast.cli.cluster import register; "
        "app = typer.Typer(); register(app); app()"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, "broker", "--etcd", etcd_server.client_url,
        "--config", str(config), "--id", "c1",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        admin = AdminClient(etcd_store, SystemClock())

        async def leading() -> bool:
            return (await admin.leader() or {}).get("broker_id") == "c1"

        await wait_until(leading, 30, "c1 to register and lead")
        assert await etcd_store.get(keys.register("c1")) is not None
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(15):
            assert await proc.wait() == 0
        # Graceful: gone now, not after the 30 s TTL.
        assert await etcd_store.get(keys.register("c1")) is None
        assert await etcd_store.get(keys.LEADER) is None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
