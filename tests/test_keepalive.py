"""What a silent connection leaves behind: the counters an operator reads."""

from __future__ import annotations

from typing import Any

import grpc
from prometheus_client import CollectorRegistry, generate_latest

from ballast.gateway.brokers import BrokerLinks
from ballast.keepalive import ConnectionTimeouts, is_silent_connection


class _Failure(grpc.aio.AioRpcError):
    """A failed call as grpc-core reports it (status and details only)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        empty: Any = grpc.aio.Metadata()
        super().__init__(code, empty, empty, details)


PING_TIMEOUT = _Failure(grpc.StatusCode.UNAVAILABLE, "ping timeout")
REFUSED = _Failure(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")


def test_the_collector_exports_each_peer_kind_as_a_counter() -> None:
    counts = {"etcd": 2, "broker": 0}
    registry = CollectorRegistry()
    timeouts = ConnectionTimeouts().register(registry)
    timeouts.watch("etcd", lambda: counts["etcd"])
    timeouts.watch("broker", lambda: counts["broker"])
    counts["broker"] = 5  # read at each scrape, not when watched
    text = generate_latest(registry).decode()
    assert 'ballast_connection_timeouts_total{peer="etcd"} 2.0' in text
    assert 'ballast_connection_timeouts_total{peer="broker"} 5.0' in text


def test_only_a_keepalive_timeout_is_a_silent_connection() -> None:
    assert is_silent_connection(PING_TIMEOUT)
    assert is_silent_connection(_Failure(grpc.StatusCode.UNAVAILABLE, "keepalive watchdog timeout"))
    assert not is_silent_connection(REFUSED)  # a refusal is an answer, not silence
    assert not is_silent_connection(_Failure(grpc.StatusCode.DEADLINE_EXCEEDED, "ping timeout"))
    assert not is_silent_connection(ValueError("ping timeout"))


async def test_a_silent_broker_connection_counts_once_however_many_calls_fail_on_it() -> None:
    links = BrokerLinks(None, batch_sends=True)
    for _ in range(3):  # every call on the dropped connection fails at the same moment
        links.note("127.0.0.1:1", PING_TIMEOUT)
    links.note("127.0.0.1:1", REFUSED)
    links.note("127.0.0.1:2", PING_TIMEOUT)  # another broker's connection
    assert links.connection_timeouts == 2
