"""Broker and gateway processes that keep their stderr, so a benchmark can say why one died.

`Processes` is the tests' `tests.server.procs.Processes` with each child's stderr in a
file of `logs` (``broker-<id>.log``, ``gateway-<n>.log``): a child that exits before its
start line fails with the tail of that file (e.g. a broker refusing an object store that
is not the cluster's) instead of a bare "exited before starting".
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from ballast.metadata import MetadataStore, keys
from tests.server import procs
from tests.server.procs import started

__all__ = ["Processes", "started_or_tail", "tail"]

TAIL_LINES = 20


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of `path` (for error messages)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no {path})"
    return "\n".join(text.splitlines()[-lines:]) or f"({path} is empty)"


async def started_or_tail(
    proc: asyncio.subprocess.Process, prefix: str, what: str, log: Path
) -> str:
    """`tests.server.procs.started`, failing with the tail of the child's stderr `log`."""
    try:
        return await started(proc, prefix, what)
    except (AssertionError, TimeoutError) as exc:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        raise RuntimeError(
            f"{what} did not start ({exc or 'timed out'}; exit code {proc.returncode}); "
            f"its stderr ({log}) ends:\n{tail(log)}"
        ) from None


class Processes(procs.Processes):
    """Brokers and gateways whose stderr goes to files in `logs`."""

    def __init__(self, etcd_url: str, config: Path, store: MetadataStore, logs: Path) -> None:
        super().__init__(etcd_url, config, store)
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)

    async def _spawn(self, args: list[str], log: Path) -> asyncio.subprocess.Process:
        with log.open("ab") as stderr:  # the child keeps its own descriptor
            return await asyncio.create_subprocess_exec(
                sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=stderr,
                env=self.env,
            )  # fmt: skip

    async def start_broker(self, broker_id: str) -> str:
        """Start a broker; its registered broker_url."""
        log = self.logs / f"broker-{broker_id}.log"
        proc = await self._spawn(
            ["-m", "ballast.cluster.run", "--etcd", self.etcd_url, "--config", str(self.config),
             "--id", broker_id, "--broker-url", "127.0.0.1:0", "--log-level", "WARNING"],
            log,
        )  # fmt: skip
        self.brokers[broker_id] = proc
        await started_or_tail(proc, "BROKER-STARTED", f"broker {broker_id}", log)
        kv = await self.store.get(keys.register(broker_id))
        assert kv is not None
        return str(kv.value["broker_url"])

    async def start_gateway(self, config: Path | None = None) -> str:
        """Start a gateway on a free port (with `config`, default the brokers'); its address."""
        log = self.logs / f"gateway-{len(self.gateways)}.log"
        proc = await self._spawn(
            ["-m", "ballast.cli.main", "gateway", "--etcd", self.etcd_url,
             "--config", str(config or self.config), "--listen", "127.0.0.1:0",
             "--log-level", "WARNING"],
            log,
        )  # fmt: skip
        self.gateways.append(proc)
        return await started_or_tail(proc, "GATEWAY-STARTED", "gateway", log)
