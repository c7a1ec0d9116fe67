"""Real broker and gateway processes for the gateway, security and chaos tests.

`Processes` starts ``python -m ballast.cluster.run`` brokers and ``ballast gateway``
processes (this worktree's sources first on PYTHONPATH), waits for their start lines,
can SIGKILL and restart them, and terminates everything at the end.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from ballast.metadata import MetadataStore, keys

SRC = str(Path(__file__).resolve().parents[2] / "src")


def write_config(path: Path, data_dir: Path, **sections: Any) -> Path:
    """A broker/gateway YAML with short intervals; `sections` override or add sections."""
    config: dict[str, Any] = {
        "load_manager": {"load_report_interval_seconds": 0.5, "assignment_strategy": "fair"},
        "broker": {"registration_ttl_seconds": 3, "leader_ttl_seconds": 3},
        "history": {"enabled": False},
        "metrics": {"enabled": False},
        "storage": {"data_dir": str(data_dir), "upload_interval_seconds": 1.0},
        "gateway": {"lookup_wait_seconds": 20},
    }
    for name, value in sections.items():
        config[name] = {**config.get(name, {}), **value}
    path.write_text(yaml.safe_dump(config))
    return path


async def started(
    proc: asyncio.subprocess.Process, prefix: str, what: str, timeout: float = 45
) -> str:
    """Wait for the line starting with `prefix` on `proc`'s stdout; the rest of it."""
    assert proc.stdout is not None
    async with asyncio.timeout(timeout):
        while True:
            line = await proc.stdout.readline()
            if not line:
                raise AssertionError(f"{what} exited before starting")
            text = line.decode().strip()
            if text.startswith(prefix):
                return text[len(prefix) :].strip()


class Processes:
    """Broker and gateway processes of one test."""

    def __init__(self, etcd_url: str, config: Path, store: MetadataStore) -> None:
        self.etcd_url = etcd_url
        self.config = config
        self.store = store
        self.brokers: dict[str, asyncio.subprocess.Process] = {}
        self.gateways: list[asyncio.subprocess.Process] = []
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
        }

    async def start_broker(self, broker_id: str) -> str:
        """Start a broker; its registered broker_url."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ballast.cluster.run", "--etcd", self.etcd_url,
            "--config", str(self.config), "--id", broker_id, "--broker-url", "127.0.0.1:0",
            "--log-level", "WARNING",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=self.env,
        )  # fmt: skip
        self.brokers[broker_id] = proc
        await started(proc, "BROKER-STARTED", f"broker {broker_id}")
        kv = await self.store.get(keys.register(broker_id))
        assert kv is not None
        return str(kv.value["broker_url"])

    async def start_gateway(self, config: Path | None = None) -> str:
        """Start a gateway on a free port (with `config`, default the brokers'); its address."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ballast.cli.main", "gateway", "--etcd", self.etcd_url,
            "--config", str(config or self.config), "--listen", "127.0.0.1:0",
            "--log-level", "WARNING",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=self.env,
        )  # fmt: skip
        self.gateways.append(proc)
        return await started(proc, "GATEWAY-STARTED", "gateway")

    async def kill(self, broker_id: str) -> None:
        """SIGKILL a broker (no goodbye: its lease expires, its topics fail over)."""
        proc = self.brokers[broker_id]
        proc.send_signal(signal.SIGKILL)
        await proc.wait()

    async def owner(self, topic: str) -> str | None:
        """The broker a topic is assigned to (from the store)."""
        listing = await self.store.get_prefix(keys.BROKERS_PREFIX)
        for kv in listing.items:
            if kv.key.endswith(topic) and not kv.key.endswith("/state"):
                broker, name = keys.parse_assignment_key(kv.key)
                if str(name) == topic:
                    return broker
        return None

    async def close(self) -> None:
        procs = [*self.brokers.values(), *self.gateways]
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
