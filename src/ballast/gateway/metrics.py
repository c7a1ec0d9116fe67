"""The gateway's Prometheus series, read from its live state at each scrape.

A gateway keeps its figures where its work keeps them (event counts, sessions, the held
budget, each link's records and frames); this collector turns them into series when
Prometheus asks, so the hot path pays nothing for them. The scrape runs on
prometheus_client's HTTP thread: it copies what it reads (a dict copy is atomic under
the GIL) and never changes anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ballast.gateway.brokers import BrokerLinks
from ballast.gateway.sessions import HeldBudget, SessionTable
from ballast.wire.h2grpc import H2GrpcServer
from ballast.wire.metrics import wire_series

__all__ = ["GatewayCollector", "GatewayState", "serve_metrics"]


class GatewayState(Protocol):
    """What the collector reads of a gateway (so this module does not import the gateway
    that serves it)."""

    counts: dict[str, int]
    sessions: SessionTable
    held: HeldBudget
    links: BrokerLinks

    @property
    def store(self) -> object: ...  # its `connection_timeouts`, when it is an `EtcdStore`

    @property
    def wire(self) -> H2GrpcServer | None: ...


class GatewayCollector(Collector):
    def __init__(self, gateway: GatewayState) -> None:
        self.gateway = gateway

    def collect(self) -> Iterator[Metric]:
        gateway = self.gateway
        events = CounterMetricFamily(
            "ballast_gateway_events",
            "What the gateway did or refused, by event (e.g. SendMessage:held, "
            "CreateProducer:carried, ReceiveMessages:acked_dropped, lookup, refused_*)",
            labels=["event"],
        )
        for event, count in sorted(dict(gateway.counts).items()):
            events.add_metric([event], count)
        yield events
        sessions = GaugeMetricFamily(
            "ballast_gateway_sessions",
            "Producer and consumer sessions the gateway carries across moves",
            labels=["kind"],
        )
        sessions.add_metric(["producer"], len(gateway.sessions.producers))
        sessions.add_metric(["consumer"], len(gateway.sessions.consumers))
        yield sessions
        yield GaugeMetricFamily(
            "ballast_gateway_held_sends",
            "Sends held while their topic moves or its owner is replaced",
            value=gateway.held.count,
        )
        yield GaugeMetricFamily(
            "ballast_gateway_held_bytes",
            "Payload bytes of the held sends",
            value=gateway.held.bytes,
        )
        records = CounterMetricFamily(
            "ballast_gateway_link_records",
            "Sends and acks written on a broker's links (since the link opened)",
            labels=["broker_url", "link"],
        )
        frames = CounterMetricFamily(
            "ballast_gateway_link_frames",
            "Frames they went in (records / frames: what batching saves)",
            labels=["broker_url", "link"],
        )
        tcp = GaugeMetricFamily(
            "ballast_gateway_link_tcp",
            "1: the link goes on the broker's TCP link port; 0: on a stream of its gRPC port",
            labels=["broker_url", "link"],
        )
        for (url, method), link in sorted(gateway.links.links().items()):
            kind = method.rsplit("/", 1)[-1]
            records.add_metric([url, kind], link.sends)
            frames.add_metric([url, kind], link.frames)
            tcp.add_metric([url, kind], 1 if link.transport == "tcp" else 0)
        yield records
        yield frames
        yield tcp
        timeouts = CounterMetricFamily(
            "ballast_gateway_connection_timeouts",
            "Connections dropped because the peer stopped answering (keepalive), by peer",
            labels=["peer"],
        )
        timeouts.add_metric(["broker"], gateway.links.connection_timeouts)
        timeouts.add_metric(["etcd"], getattr(gateway.store, "connection_timeouts", 0))
        yield timeouts
        server = gateway.wire
        if server is not None:
            yield from wire_series(server)


def serve_metrics(
    gateway: GatewayState, host: str, port: int
) -> tuple[WSGIServer, CollectorRegistry]:
    """Expose the gateway's series on `host:port` (prometheus_client's HTTP thread);
    `shutdown()` and `server_close()` on the server stop it. Its registry, for more."""
    registry = CollectorRegistry()
    registry.register(GatewayCollector(gateway))
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server, registry
