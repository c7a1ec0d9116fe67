"""Prometheus series of the data plane, on the broker's registry (no global registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["DataPlaneMetrics"]


class DataPlaneMetrics:
    """Requests refused (by RPC and reason), messages in and out, clients connected."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.rejected = Counter(
            "ballast_dataplane_rejected",
            "Client requests answered with an error, by RPC and reason",
            ["rpc", "reason"],
            registry=r,
        )
        self.messages_in = Counter(
            "ballast_dataplane_messages_in", "Messages accepted from producers", registry=r
        )
        self.bytes_in = Counter(
            "ballast_dataplane_bytes_in", "Payload bytes accepted from producers", registry=r
        )
        self.messages_out = Counter(
            "ballast_dataplane_messages_out", "Messages streamed to consumers", registry=r
        )
        self.load_failures = Counter(
            "ballast_dataplane_topic_load_failures",
            "Assigned topics whose storage could not be opened",
            registry=r,
        )
        self.sweep_failures = Counter(
            "ballast_dataplane_sweep_failures",
            "Periodic sweeps (idle clients, expiry, pressure, retried openings) that failed",
            registry=r,
        )
        self.schema_checks = Counter(
            "ballast_dataplane_schema_checks",
            "Sends checked against their topic's schema, by policy and outcome",
            ["policy", "outcome"],
            registry=r,
        )
        self.nacks = Counter(
            "ballast_dataplane_nacks",
            "Messages nacked by consumers, by reason",
            ["reason"],
            registry=r,
        )
        self.dead_lettered = Counter(
            "ballast_dataplane_dead_lettered",
            "Messages moved to a dead-letter topic after their last allowed delivery",
            registry=r,
        )
        self.acks_ignored = Counter(
            "ballast_dataplane_acks_ignored",
            "Acks for offsets never delivered to the subscription (ignored, not remembered)",
            registry=r,
        )
        self.held_bytes = Gauge(
            "ballast_dataplane_held_bytes",
            "Bytes of messages received and not yet stored (against broker_budget_bytes)",
            registry=r,
        )
        self.subscription_dropped = Gauge(
            "ballast_dataplane_subscription_dropped",
            "Non-reliable messages slow subscriptions dropped (full buffer), topics served now",
            registry=r,
        )
        self.subscriptions_expired = Counter(
            "ballast_dataplane_subscriptions_expired",
            "Subscriptions removed after subscription_expiry_seconds without a consumer",
            registry=r,
        )
        self.consumer_relays = Counter(
            "ballast_dataplane_consumer_relays",
            "Consumers of a topic that moved away relayed from its new owner (relay.py)",
            registry=r,
        )
        self.handover = Histogram(
            "ballast_dataplane_topic_handover_seconds",
            "A move's steps on this broker: seal (stop serving a topic that moves away: "
            "appends settled, uploads drained, sealed state written) and open (start "
            "serving one that moved here or was placed here, until its clients are served)",
            ["step"],
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
            registry=r,
        )
        for step in ("seal", "open"):
            self.handover.labels(step)  # exported (at zero) before the first move
        self.subscription_buffered_bytes = Gauge(
            "ballast_dataplane_subscription_buffered_bytes",
            "Bytes read ahead for subscriptions (each bounded by subscription_buffer_bytes)",
            registry=r,
        )
        self.producers = Gauge(
            "ballast_dataplane_producers", "Producers registered on this broker", registry=r
        )
        self.consumers = Gauge(
            "ballast_dataplane_consumers", "Consumers registered on this broker", registry=r
        )

    def reject(self, rpc: str, reason: str) -> None:
        """Count one refused request."""
        self.rejected.labels(rpc=rpc, reason=reason).inc()

    def rejected_count(self, rpc: str, reason: str) -> float:
        """How many requests were refused for `reason` (tests)."""
        value = self.registry.get_sample_value(
            "ballast_dataplane_rejected_total", {"rpc": rpc, "reason": reason}
        )
        return value or 0.0
