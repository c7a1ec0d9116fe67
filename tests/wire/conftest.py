"""A client port under attack: real broker and gateway processes on a real etcd, a real
`danube-client` producer as the legitimate client (in a process of its own,
tests/wire/probe.py), and what each attack must leave intact (that client's latency, the
server's memory, a log without a traceback)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import pytest_asyncio
import yaml

from ballast.metadata import keys
from ballast.metadata.etcd import EtcdStore
from tests.etcd_fixtures import EtcdServer, etcd_server, free_port
from tests.server.helpers import wipe
from tests.server.procs import SRC, started

__all__ = ["etcd_server"]

# The protections, set low enough that a test reaches each in a second or two.
WIRE = {
    "max_resets_per_second": 100,
    "max_settings_per_second": 10,
    "request_budget_bytes": 16 * 1024 * 1024,
    "max_connections_per_peer": 5000,
    "handshake_timeout_seconds": 1.0,
    "idle_timeout_seconds": 2.0,
    "write_buffer_high_bytes": 256 * 1024,
    "write_buffer_max_bytes": 4 * 1024 * 1024,
}
TOPIC = "/default/wire-probe"
# What a legitimate client's send may take while another connection attacks (the issue's
# gateway took more than 5 s per call during a rapid reset).
LATENCY_BOUND = 2.0
# What an attack may add to the server's resident memory (the issue saw +127 MiB for one
# PING flood, +448 MiB for held request bodies).
RSS_BOUND = 64 * 1024 * 1024

TARGETS = ["gateway", "broker"]


@dataclass(frozen=True)
class Front:
    """A client port under test: its address, its process, its log, its metrics."""

    name: str
    url: str
    pid: int
    log: Path
    metrics_url: str

    def rss(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    def events(self) -> dict[str, float]:
        """`ballast_wire_events` by event, scraped from the process (and a broker's
        refusals by reason, as ``rejected:<reason>``: its handlers parse requests)."""
        with urllib.request.urlopen(f"http://{self.metrics_url}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        found: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("ballast_wire_events_total{"):
                event = line.split('event="', 1)[1].split('"', 1)[0]
                found[event] = float(line.rsplit(" ", 1)[1])
            elif line.startswith("ballast_dataplane_rejected_total{"):
                reason = "rejected:" + line.split('reason="', 1)[1].split('"', 1)[0]
                found[reason] = found.get(reason, 0) + float(line.rsplit(" ", 1)[1])
        return found


async def _spawn(args: list[str], log: Path) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": SRC}
    with log.open("ab") as stderr:
        return await asyncio.create_subprocess_exec(
            sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env
        )


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=TARGETS)
async def front(
    request: pytest.FixtureRequest, etcd_server: EtcdServer, tmp_path_factory: Any
) -> AsyncIterator[Front]:
    """One broker and one gateway (processes); the port under test is `request.param`'s."""
    tmp = tmp_path_factory.mktemp(f"wire-{request.param}")
    metrics_port, broker_metrics_port = free_port(), free_port()
    config = tmp / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "load_manager": {"load_report_interval_seconds": 0.5},
                "broker": {"registration_ttl_seconds": 10, "leader_ttl_seconds": 10},
                "history": {"enabled": False},
                "metrics": {"enabled": True, "port": broker_metrics_port},
                "storage": {"data_dir": str(tmp / "data")},
                "gateway": {"lookup_wait_seconds": 20, "metrics_port": metrics_port},
                "wire": WIRE,
            }
        )
    )
    procs: list[asyncio.subprocess.Process] = []
    async with EtcdStore(etcd_server.client_url) as store:
        await wipe(store)
        try:
            broker_log = tmp / "broker.log"
            broker = await _spawn(
                ["-m", "ballast.cluster.run", "--etcd", etcd_server.client_url,
                 "--config", str(config), "--id", "w1", "--broker-url", "127.0.0.1:0",
                 "--log-level", "WARNING"],
                broker_log,
            )  # fmt: skip
            procs.append(broker)
            await started(broker, "BROKER-STARTED", "broker")
            if request.param == "broker":
                kv = await store.get(keys.register("w1"))
                assert kv is not None
                yield Front(
                    "broker", str(kv.value["broker_url"]), broker.pid, broker_log,
                    f"127.0.0.1:{broker_metrics_port}",
                )  # fmt: skip
                return
            gateway_log = tmp / "gateway.log"
            gateway = await _spawn(
                ["-m", "ballast.cli.main", "gateway", "--etcd", etcd_server.client_url,
                 "--config", str(config), "--listen", "127.0.0.1:0", "--log-level", "WARNING"],
                gateway_log,
            )  # fmt: skip
            procs.append(gateway)
            url = await started(gateway, "GATEWAY-STARTED", "gateway")
            yield Front("gateway", url, gateway.pid, gateway_log, f"127.0.0.1:{metrics_port}")
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.terminate()
            for proc in procs:
                try:
                    async with asyncio.timeout(15):
                        await proc.wait()
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
            await wipe(store)


class Probe:
    """The legitimate client: tests/wire/probe.py in a process of its own, so that what it
    measures is the server's latency, not this process's loop (busy with the attack)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def spawn(cls, url: str) -> Probe:
        script = str(Path(__file__).with_name("probe.py"))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, script, url, TOPIC, str(LATENCY_BOUND * 3),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await started(proc, "READY", "the probe")
        return cls(proc)

    def command(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")

    async def answer(self, expected: str) -> str:
        """The rest of the probe's next line, which must start with `expected`."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(60):
            line = (await self.proc.stdout.readline()).decode().strip()
        assert line.startswith(expected), f"the probe: {line or 'exited'}"
        return line[len(expected) :].strip()

    async def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # the probe exits at the end of its input
        try:
            async with asyncio.timeout(15):
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


class Watch:
    """Runs the legitimate client during an attack; afterwards checks that it was served
    within the bound, that the server's memory stayed bounded and that its log has no
    traceback."""

    def __init__(self, front: Front, probe: Probe) -> None:
        self.front = front
        self.probe = probe
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.rss_before = 0
        self.events_before: dict[str, float] = {}

    async def __aenter__(self) -> Watch:
        self.rss_before = self.front.rss()
        self.events_before = await asyncio.to_thread(self.front.events)
        self.log_before = self.front.log.stat().st_size
        self.probe.command("start")
        await self.probe.answer("SERVING")  # served once before the attack starts
        return self

    async def __aexit__(self, *exc: object) -> None:
        # The attack over, the client goes on a little: it must still be served after it.
        self.probe.command("stop")
        result = json.loads(await self.probe.answer("RESULT"))
        self.latencies, self.errors = result["latencies"], result["errors"]

    async def counted(self) -> dict[str, float]:
        """Events counted since the attack began."""
        after = await asyncio.to_thread(self.front.events)
        counted = {k: v - self.events_before.get(k, 0) for k, v in after.items()}
        return {k: v for k, v in counted.items() if v}

    def check(self) -> None:
        assert not self.errors, f"the legitimate client failed: {self.errors[:3]}"
        worst = max(self.latencies)
        which = self.latencies.index(worst) + 1
        assert worst < LATENCY_BOUND, (
            f"a legitimate send (#{which} of {len(self.latencies)}) took {worst:.2f} s"
        )
        grown = self.front.rss() - self.rss_before
        assert grown < RSS_BOUND, f"the server grew by {grown >> 20} MiB"
        with self.front.log.open("rb") as log:
            log.seek(self.log_before)
            text = log.read().decode(errors="replace")
        assert "Traceback" not in text, text[-3000:]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def probe(front: Front) -> AsyncIterator[Probe]:
    probe = await Probe.spawn(front.url)
    try:
        yield probe
    finally:
        await probe.close()


@pytest_asyncio.fixture(loop_scope="module")
async def watch(front: Front, probe: Probe) -> Watch:
    return Watch(front, probe)
