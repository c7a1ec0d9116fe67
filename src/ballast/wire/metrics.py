"""The wire layer's Prometheus series (`h2grpc`), on a gateway's or a broker's
registry: what each protection refused or closed, and what the port holds, read from the
server's live counts at each scrape (the hot path pays nothing for them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ballast.wire.h2grpc import H2GrpcServer

__all__ = ["WireCollector", "wire_series"]


def wire_series(server: H2GrpcServer) -> Iterator[Metric]:
    """The client port's wire layer: what it refused and closed, and what it holds."""
    events = CounterMetricFamily(
        "ballast_wire_events",
        "The client port's HTTP/2 events, by event: connections, what each protection "
        "refused or closed (rapid_reset, settings_flood, write_paused, write_buffer_closed, "
        "request_budget, calls_refused, connections_refused[_peer], handshake_timeout, "
        "idle_timeout, flood, protocol_error) and malformed requests (bad_timeout, "
        "bad_metadata, malformed_request, unknown_method, message_too_large)",
        labels=["event"],
    )
    for event, count in sorted(dict(server.counts).items()):
        events.add_metric([event], count)
    yield events
    yield GaugeMetricFamily(
        "ballast_wire_connections", "Client connections open", value=len(server.connections)
    )
    yield GaugeMetricFamily(
        "ballast_wire_request_bytes_held",
        "Bytes of unfinished requests held across all connections (wire.request_budget_bytes)",
        value=server.budget.used,
    )


class WireCollector(Collector):
    """`wire_series` of whatever server `current()` returns (nothing while none serves)."""

    def __init__(self, current: Callable[[], H2GrpcServer | None]) -> None:
        self.current = current

    def collect(self) -> Iterator[Metric]:
        server = self.current()
        if server is not None:
            yield from wire_series(server)
