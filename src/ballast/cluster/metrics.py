"""Prometheus metrics of one broker process, on its own `CollectorRegistry`.

No global registry: tests and the demo run several brokers in one process, each with its
own `ClusterMetrics`. The documented Danube set is emitted in full, prefixed ``ballast_``;
the cluster-balance and rebalancing series are only moved by the broker that leads.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

from ballast.balance import Imbalance
from ballast.keepalive import ConnectionTimeouts


class ClusterMetrics:
    """Every control-plane series of one broker."""

    def __init__(self, broker_id: str, registry: CollectorRegistry | None = None) -> None:
        self.broker_id = broker_id
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # Cluster balance (leader).
        self.balance_cv = Gauge(
            "ballast_cluster_balance_cv", "Coefficient of variation", registry=r
        )
        self.balance_mean = Gauge(
            "ballast_cluster_balance_mean_load", "Mean broker load", registry=r
        )
        self.balance_max = Gauge("ballast_cluster_balance_max_load", "Max broker load", registry=r)
        self.balance_min = Gauge("ballast_cluster_balance_min_load", "Min broker load", registry=r)
        self.balance_std = Gauge(
            "ballast_cluster_balance_std_dev", "Standard deviation of broker load", registry=r
        )
        self.active_brokers = Gauge(
            "ballast_cluster_active_brokers", "Count of active brokers", registry=r
        )
        # Rebalancing (leader).
        self.checks = Counter(
            "ballast_rebalancing_checks", "Balance check cycles", registry=r
        )  # exported as ballast_rebalancing_checks_total
        self.moves = Counter("ballast_rebalancing_moves", "Topic moves started", registry=r)
        self.failures = Counter(
            "ballast_rebalancing_failures",
            "Failed move attempts (fenced write refused)",
            registry=r,
        )
        self.cycle_duration = Histogram(
            "ballast_rebalancing_cycle_duration_seconds",
            "Duration of rebalancing cycles",
            registry=r,
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0),
        )
        self.assignments = Counter(
            "ballast_topic_assignments",
            "Topic assignments (assign) and removals (unassign) per broker",
            ["broker_id", "action"],
            registry=r,
        )
        # This broker.
        self.topics_owned = Gauge(
            "ballast_broker_topics_owned", "Topics owned by the broker", ["broker_id"], registry=r
        )
        self.cpu = Gauge("ballast_broker_cpu_usage", "CPU percent", ["broker_id"], registry=r)
        self.memory = Gauge(
            "ballast_broker_memory_usage", "Memory percent", ["broker_id"], registry=r
        )
        self.throughput = Gauge(
            "ballast_broker_throughput_mbps",
            "Aggregate throughput (MB/s)",
            ["broker_id"],
            registry=r,
        )
        self.leader = Gauge("ballast_leader", "1 while this broker leads the cluster", registry=r)
        # Bad input and failover.
        self.rejected = Counter(
            "ballast_rejected_records",
            "Records the control plane rejected (bad JSON, unknown broker, unknown topic, ...)",
            ["kind"],
            registry=r,
        )
        self.failovers = Counter(
            "ballast_failover_brokers", "Dead brokers whose topics were failed over", registry=r
        )
        self.fence_failures = Counter(
            "ballast_fenced_write_failures",
            "Leader writes refused by their compares (stale view or lost leadership)",
            registry=r,
        )
        self.forced_moves = Counter(
            "ballast_rebalancing_forced_moves",
            "Moves the leader forced after the source did not seal within seal_timeout_seconds",
            registry=r,
        )
        self.bundle_splits = Counter(
            "ballast_bundle_splits",
            "Namespace bundles the leader split automatically (placement_unit: bundle)",
            registry=r,
        )
        self.loop_errors = Counter(
            "ballast_broker_loop_errors",
            "Failures a broker's supervised loops survived (store outage, host load/unload)",
            ["loop"],
            registry=r,
        )
        self.session_failures = Counter(
            "ballast_leader_session_failures",
            "Leader sessions that crashed and restarted",
            registry=r,
        )
        # Connections (etcd, other brokers) dropped because the peer went silent.
        self.connection_timeouts = ConnectionTimeouts().register(r)

    def reject(self, kind: str) -> None:
        """Count one rejected record of `kind`."""
        self.rejected.labels(kind=kind).inc()

    def rejected_count(self, kind: str) -> float:
        """How many records of `kind` were rejected (for tests and the demo summary)."""
        value = self.registry.get_sample_value("ballast_rejected_records_total", {"kind": kind})
        return value or 0.0

    def observe_balance(self, stats: Imbalance, active: int) -> None:
        """Publish the latest balance statistics."""
        self.balance_cv.set(stats.cv)
        self.balance_mean.set(stats.mean)
        self.balance_max.set(stats.max)
        self.balance_min.set(stats.min)
        self.balance_std.set(stats.std)
        self.active_brokers.set(active)

    def observe_broker(
        self, topics: int, cpu: float, memory: float, throughput_mbps: float
    ) -> None:
        """Publish this broker's own load."""
        b = self.broker_id
        self.topics_owned.labels(broker_id=b).set(topics)
        self.cpu.labels(broker_id=b).set(cpu)
        self.memory.labels(broker_id=b).set(memory)
        self.throughput.labels(broker_id=b).set(throughput_mbps)

    def sample(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """One sample's value (0 when absent)."""
        return self.registry.get_sample_value(name, dict(labels or {})) or 0.0

    def exposition(self) -> bytes:
        """The text exposition format of this registry."""
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> None:
        """Expose the registry over HTTP (a daemon thread of prometheus_client)."""
        start_http_server(port, addr=host, registry=self.registry)
