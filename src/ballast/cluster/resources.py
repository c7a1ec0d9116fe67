"""Resource usage for load reports: real (psutil) or supplied by a synthetic host."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Protocol

import psutil


@dataclass(frozen=True)
class ResourceUsage:
    """CPU and memory in percent (0-100), disk and network I/O in bytes per second."""

    cpu_percent: float = 0.0
    memory_percent: float = 0.0
    disk_io_bps: float = 0.0
    network_io_bps: float = 0.0


class ResourceSampler(Protocol):
    """Anything that can tell the broker's current resource usage."""

    def sample(self) -> ResourceUsage: ...


def _clamp(value: float) -> float:
    return min(100.0, max(0.0, value))


class PsutilSampler:
    """Real usage from psutil.

    `scope="process"` (default) reports this process's share of the host's CPU and memory,
    which tells apart several brokers sharing one machine; `"host"` reports the whole host.
    Disk and network rates are host-wide (per-process network counters do not exist) and
    computed from the counters' change since the previous sample.
    """

    def __init__(self, scope: Literal["process", "host"] = "process") -> None:
        self.scope = scope
        self._process = psutil.Process()
        self._cpus = psutil.cpu_count() or 1
        self._last: tuple[float, float, float] | None = None
        # The first cpu_percent call only primes the counters (it returns 0.0).
        if scope == "process":
            self._process.cpu_percent(None)
        else:
            psutil.cpu_percent(None)
        self._io_rates()

    def _io_rates(self) -> tuple[float, float]:
        disk = psutil.disk_io_counters()
        net = psutil.net_io_counters()
        disk_bytes = float(disk.read_bytes + disk.write_bytes) if disk is not None else 0.0
        net_bytes = float(net.bytes_sent + net.bytes_recv) if net is not None else 0.0
        now = time.monotonic()
        last, self._last = self._last, (now, disk_bytes, net_bytes)
        if last is None or now <= last[0]:
            return 0.0, 0.0
        elapsed = now - last[0]
        return max(0.0, (disk_bytes - last[1]) / elapsed), max(0.0, (net_bytes - last[2]) / elapsed)

    def sample(self) -> ResourceUsage:
        if self.scope == "process":
            cpu = self._process.cpu_percent(None) / self._cpus
            memory = self._process.memory_percent()
        else:
            cpu = psutil.cpu_percent(None)
            memory = psutil.virtual_memory().percent
        disk, net = self._io_rates()
        return ResourceUsage(_clamp(cpu), _clamp(memory), disk, net)


class FixedSampler:
    """Constant usage (tests that need resources to stay out of the ranking)."""

    def __init__(self, usage: ResourceUsage | None = None) -> None:
        self.usage = usage or ResourceUsage()

    def sample(self) -> ResourceUsage:
        return self.usage
