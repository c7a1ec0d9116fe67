"""Builders for literal snapshots used by the core tests."""

from __future__ import annotations

from ballast.model import ClusterSnapshot, LoadReport, TopicLoad


def idle_topics(broker: str, n: int, prefix: str = "t") -> tuple[str, ...]:
    return tuple(f"/default/{prefix}-{broker}-{i:04d}" for i in range(n))


def snapshot_of(
    spec: dict[str, tuple[float, float, int]], created: float | None = None
) -> ClusterSnapshot:
    """Brokers from {id: (cpu, mem, idle topic count)}."""
    assignments = {b: idle_topics(b, n) for b, (_, _, n) in spec.items()}
    reports = {
        b: LoadReport(b, 0.0, cpu, mem, topics=tuple(TopicLoad(t) for t in assignments[b]))
        for b, (cpu, mem, _) in spec.items()
    }
    topic_created = (
        {t: created for ts in assignments.values() for t in ts} if created is not None else {}
    )
    return ClusterSnapshot(tuple(spec), reports, {}, assignments, topic_created)


def counts(n_by_broker: dict[str, int]) -> ClusterSnapshot:
    """A Fair-strategy snapshot: only topic counts matter."""
    return ClusterSnapshot(
        tuple(n_by_broker), assignments={b: idle_topics(b, n) for b, n in n_by_broker.items()}
    )
