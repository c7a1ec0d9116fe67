"""Broker scores and rankings under the configured strategy (ascending: least loaded first)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ballast.balance.pulsar.strategies import pulsar_scores
from ballast.balance.scoring import (
    NUMPY_OPS,
    balanced_score,
    balanced_with_fallback,
    fair_score,
    normalise,
    reports_resources,
    topic_load_score,
    weighted_load_score,
)
from ballast.config import PulsarConfig, Strategy
from ballast.model import BrokerId, ClusterSnapshot


@dataclass(frozen=True)
class BrokerMetrics:
    """Per-broker metrics as columns (one array entry per broker, in `brokers` order)."""

    brokers: tuple[BrokerId, ...]
    topic_count: np.ndarray
    throughput_mbps: np.ndarray
    connections: np.ndarray
    backlog: np.ndarray
    cpu: np.ndarray
    mem: np.ndarray
    disk: np.ndarray
    net: np.ndarray

    @property
    def weighted_topic_load(self) -> np.ndarray:
        return topic_load_score(
            self.topic_count, self.throughput_mbps, self.connections, self.backlog
        )


def broker_metrics(snapshot: ClusterSnapshot) -> BrokerMetrics:
    """Columns for every broker in the snapshot.

    The topic count comes from the assignments (authoritative, and it includes placeholders
    for topics assigned since the last report); rates and resources from the latest report.
    """
    n = len(snapshot.brokers)
    cols = np.zeros((8, n))
    for i, broker in enumerate(snapshot.brokers):
        cols[0, i] = len(snapshot.assignments.get(broker, ()))
        report = snapshot.reports.get(broker)
        if report is not None:
            cols[1, i] = report.total_throughput_mbps
            cols[2, i] = report.total_connections
            cols[3, i] = report.total_backlog
            cols[4, i] = report.cpu_percent
            cols[5, i] = report.memory_percent
            cols[6, i] = report.disk_io_bps
            cols[7, i] = report.network_io_bps
    return BrokerMetrics(snapshot.brokers, *cols)


def _normalised(values: np.ndarray) -> np.ndarray:
    # Danube divides by the cluster maximum, starting the maximum at 1.0.
    return np.asarray(normalise(values, float(values.max(initial=0.0))))


def scores_from_metrics(m: BrokerMetrics, strategy: Strategy) -> np.ndarray:
    """Scores for every broker of `m` under `strategy` (floats; Danube truncates, we don't)."""
    if strategy is Strategy.FAIR:
        return np.asarray(fair_score(m.topic_count), dtype=float)
    wtl = m.weighted_topic_load
    if strategy is Strategy.BALANCED:
        # No broker reports resources yet: Danube falls back to the topic count.
        resources = reports_resources(m.cpu.max(initial=0.0), m.mem.max(initial=0.0))
        return np.asarray(
            balanced_with_fallback(
                balanced_score(wtl, m.cpu, m.mem), fair_score(m.topic_count), resources, NUMPY_OPS
            ),
            dtype=float,
        )
    return np.asarray(
        weighted_load_score(
            _normalised(m.cpu),
            _normalised(m.mem),
            _normalised(m.disk),
            _normalised(m.net),
            _normalised(m.throughput_mbps),
            _normalised(wtl),
        ),
        dtype=float,
    )


def score_brokers(
    snapshot: ClusterSnapshot, strategy: Strategy, pulsar: PulsarConfig | None = None
) -> dict[BrokerId, float]:
    """Every broker's score under `strategy` (`pulsar`: settings of Pulsar's strategies)."""
    if strategy in (
        Strategy.LEAST_LONG_TERM_MESSAGE_RATE,
        Strategy.LEAST_RESOURCE_USAGE_WITH_WEIGHT,
    ):
        return pulsar_scores(snapshot, strategy, pulsar)
    m = broker_metrics(snapshot)
    return dict(zip(m.brokers, scores_from_metrics(m, strategy).tolist(), strict=True))


@dataclass(frozen=True)
class Rankings:
    """(broker, score) pairs, ascending by score, ties broken by broker id."""

    entries: tuple[tuple[BrokerId, float], ...]

    @classmethod
    def from_scores(cls, scores: dict[BrokerId, float]) -> Rankings:
        return cls(tuple(sorted(scores.items(), key=lambda e: (e[1], e[0]))))

    def brokers(self) -> tuple[BrokerId, ...]:
        return tuple(b for b, _ in self.entries)

    def to_dict(self) -> list[dict[str, object]]:
        return [{"broker_id": b, "score": s} for b, s in self.entries]


def rank(
    snapshot: ClusterSnapshot, strategy: Strategy, pulsar: PulsarConfig | None = None
) -> Rankings:
    """Rankings of every broker in the snapshot, least loaded first (`pulsar`: settings of
    Pulsar's strategies)."""
    return Rankings.from_scores(score_brokers(snapshot, strategy, pulsar))
