"""Hosts in Linux network namespaces, for faults that drop packets without a reset.

A `Topology` is two bridges in the root namespace, ``cluster`` (etcd traffic) and ``front``
(clients, gateways and the brokers' data plane: gateway to broker, broker to broker), a
private /24 on each, and one namespace per host with a veth pair into each bridge it is on.
The root namespace (the test process: clients, the admin's store) has the first address
of each subnet, on the bridge itself. A process runs on a host with `Host.command`
(``ip netns exec NS ...``: the same pid, so signals reach it).

`blackhole(host, network)` sets the host-side end of the host's veth down: every packet to
or from the host on that network vanishes, no RST, no ICMP, exactly what a dead switch port
or a hung host looks like to the others; the host's processes keep running and see the
same silence. `restore` brings it back, with the connections that outlived the silence.

Names are unique per run (pid and a counter); each topology writes what it created to a
file under ``/run/ballast-netns`` and `close` deletes all of it. A topology whose process
died without closing (SIGKILL, a killed pytest worker) is swept by the next one created.
Needs root (CAP_NET_ADMIN); the fault suite runs as root.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

STATE_DIR = Path("/run/ballast-netns")
NETWORKS = ("cluster", "front")
_counter = 0
_lock = threading.Lock()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


@dataclass
class Host:
    """One host: its namespace, and its address and host-side veth on each network."""

    name: str
    netns: str
    addresses: dict[str, str] = field(default_factory=dict)  # network -> address
    veths: dict[str, str] = field(default_factory=dict)  # network -> host-side interface

    def command(self, *argv: str) -> list[str]:
        """`argv` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def address(self, network: str = "front") -> str:
        return self.addresses[network]


class Topology:
    """Bridges, namespaces and veths of one run (see the module docstring)."""

    def __init__(self) -> None:
        global _counter
        with _lock:
            _counter += 1
            seq = _counter
        sweep_orphans()
        # Interface names are at most 15 characters: "bl" + 6 hex + role.
        self.tag = f"{(os.getpid() * 64 + seq) & 0xFFFFFF:06x}"
        self.state = STATE_DIR / f"{os.getpid()}-{seq}.json"
        self.bridges = {net: f"bl{self.tag}{net[0]}" for net in NETWORKS}
        self.subnets = _free_subnets(len(NETWORKS))
        self.hosts: dict[str, Host] = {}
        self._created: dict[str, list[str]] = {"netns": [], "links": []}
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        try:
            for net, bridge in self.bridges.items():
                self._record("links", bridge)
                _ip("link", "add", bridge, "type", "bridge")
                _ip("addr", "add", f"{self._addr(net, 1)}/24", "dev", bridge)
                _ip("link", "set", bridge, "up")
        except BaseException:
            self.close()
            raise

    def _addr(self, network: str, n: int) -> str:
        return str(self.subnets[NETWORKS.index(network)].network_address + n)

    def root_address(self, network: str) -> str:
        """The test process's address on `network` (the bridge's)."""
        return self._addr(network, 1)

    def _record(self, kind: str, name: str) -> None:
        self._created[kind].append(name)
        self.state.write_text(json.dumps({"pid": os.getpid(), **self._created}))

    def add_host(self, name: str, networks: tuple[str, ...] = NETWORKS) -> Host:
        """A namespace for `name` with a veth into each of `networks` (and loopback up)."""
        index = len(self.hosts) + 2
        host = Host(name, f"ballast-{self.tag}-{name}")
        self._record("netns", host.netns)
        _ip("netns", "add", host.netns)
        _ip("-n", host.netns, "link", "set", "lo", "up")
        for net in networks:
            outside, inside = f"bl{self.tag}{index:02d}{net[0]}", f"eth{net[0]}"
            self._record("links", outside)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside, "netns", host.netns)
            _ip("link", "set", outside, "master", self.bridges[net], "up")
            address = self._addr(net, index)
            _ip("-n", host.netns, "addr", "add", f"{address}/24", "dev", inside)
            _ip("-n", host.netns, "link", "set", inside, "up")
            host.addresses[net] = address
            host.veths[net] = outside
        self.hosts[name] = host
        return host

    def blackhole(self, host: str, networks: tuple[str, ...] | None = None) -> None:
        """Drop every packet of `host` on `networks` (all of its networks by default)."""
        for net in networks or tuple(self.hosts[host].veths):
            _ip("link", "set", self.hosts[host].veths[net], "down")

    def restore(self, host: str, networks: tuple[str, ...] | None = None) -> None:
        """Undo `blackhole`."""
        for net in networks or tuple(self.hosts[host].veths):
            _ip("link", "set", self.hosts[host].veths[net], "up")

    def close(self) -> None:
        """Kill what still runs in the namespaces and delete everything created."""
        _remove(self._created)
        self.state.unlink(missing_ok=True)


def _remove(created: dict[str, list[str]]) -> None:
    for netns in created.get("netns", []):
        pids = _ip("netns", "pids", netns, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", netns, check=False)
    for link in created.get("links", []):
        _ip("link", "del", link, check=False)  # a veth goes with its namespace already


def sweep_orphans() -> None:
    """Delete the topologies of processes that died without closing them."""
    if not STATE_DIR.is_dir():
        return
    for path in STATE_DIR.glob("*.json"):
        try:
            created = json.loads(path.read_text())
            os.kill(int(created["pid"]), 0)
            continue  # its process lives: not ours to touch
        except ProcessLookupError:
            pass
        except (OSError, ValueError, KeyError):
            continue
        _remove(created)
        path.unlink(missing_ok=True)


def _free_subnets(count: int) -> list[ipaddress.IPv4Network]:
    """`count` /24s of 10.0.0.0/8 that no interface of the root namespace is on."""
    used = []
    for line in _ip("-o", "-4", "addr", "show").stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            used.append(ipaddress.ip_network(parts[parts.index("inet") + 1], strict=False))
    found: list[ipaddress.IPv4Network] = []
    rng = random.Random()
    while len(found) < count:
        candidate = ipaddress.ip_network(f"10.{rng.randrange(64, 250)}.{rng.randrange(256)}.0/24")
        if not any(candidate.overlaps(u) for u in [*used, *found]):
            found.append(candidate)
    return found
