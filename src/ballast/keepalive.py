"""How a long-lived connection notices that its peer went silent (docs/gray-failures.md).

A dropped packet is not an error: a connection whose peer's host hung, or whose path a
switch or firewall blackholed, stays open and simply never answers. Without a keepalive
every call on it waits for its own deadline (a watch has none), and TCP's retransmission
back-off keeps even a recovered path idle for tens of seconds. Every long-lived connection
of a process therefore gets, from the `connections` section of the configuration:

- gRPC (`grpc_keepalive_options`): a ping after `keepalive` seconds; no answer within
  `timeout` closes the transport and fails every call on it UNAVAILABLE;
- a raw TCP socket (`set_tcp_keepalive`): kernel keepalive probes after the same silence,
  and ``TCP_USER_TIMEOUT``: data not acknowledged within `keepalive + timeout` seconds
  closes the connection (ETIMEDOUT) instead of backing off for minutes.

`ConnectionTimeouts` exports how many connections each peer kind lost so, as
``<prefix>_connection_timeouts_total{peer=...}``.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

# How grpc-core names a connection whose keepalive ping went unanswered.
_SILENT_MARKERS = ("ping timeout", "keepalive watchdog timeout", "keepalive timeout")


def grpc_keepalive_options(
    keepalive: float, timeout: float, *, without_calls: bool = False
) -> tuple[tuple[str, int], ...]:
    """gRPC channel options under which a silent connection is dropped within about
    `keepalive` + `timeout` seconds, even while a call (a watch, a stream) waits on it.

    ``grpc.keepalive_timeout_ms`` alone is not enough: grpc-core acts on an unanswered ping
    only after ``grpc.http2.ping_timeout_ms`` (60 s by default in grpcio 1.85), and without
    ``max_pings_without_data = 0`` an idle stream stops pinging after two pings.
    `without_calls`: ping an idle connection too (not etcd's, which refuses such pings),
    so that a peer's silence is known before a call needs it.
    """
    return (
        ("grpc.keepalive_time_ms", int(keepalive * 1000)),
        ("grpc.keepalive_timeout_ms", int(timeout * 1000)),
        ("grpc.http2.ping_timeout_ms", int(timeout * 1000)),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", int(without_calls)),
    )


def is_silent_connection(exc: Exception) -> bool:
    """Whether a gRPC call failed because its connection's keepalive found it silent."""
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    if not callable(code) or not callable(details):
        return False
    text = str(details() or "").lower()
    return getattr(code(), "name", "") == "UNAVAILABLE" and any(m in text for m in _SILENT_MARKERS)


def set_tcp_keepalive(sock: socket.socket, keepalive: float, timeout: float) -> None:
    """Kernel keepalive and ``TCP_USER_TIMEOUT`` on a connected TCP socket: silent for
    `keepalive` seconds, probed every second; closed (ETIMEDOUT) once nothing was answered
    or acknowledged for `keepalive + timeout` seconds."""
    idle = max(1, round(keepalive))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, round(timeout)))
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(
            socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int((keepalive + timeout) * 1000)
        )


class ConnectionTimeouts(Collector):
    """``<prefix>_connection_timeouts_total{peer}``: connections dropped because their peer
    went silent, read from the counters of the objects that hold the connections."""

    def __init__(self, prefix: str = "ballast") -> None:
        self.name = f"{prefix}_connection_timeouts"
        self._sources: dict[str, Callable[[], int]] = {}

    def watch(self, peer: str, count: Callable[[], int]) -> None:
        """Export `count()` under ``peer=<peer>`` (a later call for the same peer replaces)."""
        self._sources[peer] = count

    def register(self, registry: CollectorRegistry) -> ConnectionTimeouts:
        registry.register(self)
        return self

    def collect(self) -> Iterator[Any]:
        family = CounterMetricFamily(
            self.name,
            "Long-lived connections dropped because the peer stopped answering (keepalive)",
            labels=["peer"],
        )
        for peer, count in sorted(self._sources.items()):
            family.add_metric([peer], float(count()))
        yield family
