"""Estimating a move's effect on the in-memory snapshot, before fresh reports arrive.

A topic carries its own traffic. Of a broker's CPU, memory, disk and network, only the
part above what an idle broker shows (`idle_baseline`) belongs to its topics: a broker
that has just joined reports its host's idle load with no topics at all, so that load
stays with the host when topics move. The part above the baseline is attributed to the
broker's topics in proportion to their share of its weighted topic load. Applying a move
transfers both, so the next decision does not repeat the move.

Attributing the whole reading to the topics (as Ballast did before issue 23) made the
estimate of a move from a loaded broker to an idle one overshoot, so a clearly useful
move was refused for ever.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ballast.balance.scoring import topic_load_score
from ballast.model import BrokerId, ClusterSnapshot, LoadReport, TopicLoad


def topic_weight(load: TopicLoad) -> float:
    """The topic's own weighted load (its term in the broker's weighted topic load)."""
    return float(topic_load_score(1, load.throughput_mbps, load.connections, load.backlog))


def broker_topic_load(snapshot: ClusterSnapshot, broker: BrokerId) -> float:
    """Weighted topic load of a broker: count from assignments, rates from its report."""
    report = snapshot.reports.get(broker)
    count = len(snapshot.assignments.get(broker, ()))
    if report is None:
        return float(topic_load_score(count, 0.0, 0, 0))
    return float(
        topic_load_score(
            count, report.total_throughput_mbps, report.total_connections, report.total_backlog
        )
    )


Resources = tuple[float, float, float, float]  # cpu %, memory %, disk B/s, network B/s


def _readings(report: LoadReport) -> Resources:
    return report.cpu_percent, report.memory_percent, report.disk_io_bps, report.network_io_bps


def idle_baseline(snapshot: ClusterSnapshot) -> Resources:
    """Per resource, the reading a broker shows without topics: the host's own load.

    - A reporting broker without topics shows it directly: the least such reading.
    - Otherwise the intercept at zero topic load of the least-squares line through the
      reporting brokers' (weighted topic load, reading) points, which needs two distinct
      topic loads; with fewer, 0 (everything is attributed to the topics).

    Clamped to [0, least reading of any reporting broker], so no broker's topics carry a
    negative load.
    """
    reporting = [b for b in snapshot.brokers if b in snapshot.reports]
    if not reporting:
        return 0.0, 0.0, 0.0, 0.0
    readings = np.array([_readings(snapshot.reports[b]) for b in reporting])
    loads = np.array([broker_topic_load(snapshot, b) for b in reporting])
    least = readings.min(axis=0)
    empty = np.array([not snapshot.assignments.get(b) for b in reporting])
    if empty.any():
        base = readings[empty].min(axis=0)
    elif np.ptp(loads) > 0:
        centred = loads - loads.mean()
        slope = centred @ (readings - readings.mean(axis=0)) / (centred @ centred)
        base = readings.mean(axis=0) - slope * loads.mean()
    else:
        base = np.zeros(4)
    c, m, d, n = np.clip(base, 0.0, least).tolist()
    return c, m, d, n


def _resources(
    report: LoadReport | None, share: float, baseline: Resources = (0.0, 0.0, 0.0, 0.0)
) -> Resources:
    """`share` of the part of `report`'s readings above `baseline`."""
    if report is None or share <= 0:
        return 0.0, 0.0, 0.0, 0.0
    c, m, d, n = (max(0.0, r - b) * share for r, b in zip(_readings(report), baseline, strict=True))
    return c, m, d, n


def _adjust(
    report: LoadReport | None,
    broker: BrokerId,
    topics: tuple[TopicLoad, ...],
    delta: Resources,
    sign: float,
) -> LoadReport:
    base = report or LoadReport(broker, 0.0)  # a broker yet to report
    return replace(
        base,
        topics=topics,
        cpu_percent=max(0.0, base.cpu_percent + sign * delta[0]),
        memory_percent=max(0.0, base.memory_percent + sign * delta[1]),
        disk_io_bps=max(0.0, base.disk_io_bps + sign * delta[2]),
        network_io_bps=max(0.0, base.network_io_bps + sign * delta[3]),
    )


def apply_move(
    snapshot: ClusterSnapshot, topic: str, source: BrokerId, target: BrokerId
) -> ClusterSnapshot:
    """The snapshot as it will look once `topic` has moved from `source` to `target`."""
    src_report = snapshot.reports.get(source)
    load = snapshot.topic_loads(source).get(topic, TopicLoad(topic))
    total = broker_topic_load(snapshot, source)
    share = topic_weight(load) / total if total > 0 else 0.0
    delta = _resources(src_report, share, idle_baseline(snapshot))

    reports = dict(snapshot.reports)
    src_topics = tuple(t for t in (src_report.topics if src_report else ()) if t.topic != topic)
    reports[source] = _adjust(src_report, source, src_topics, delta, -1.0)
    dst_report = snapshot.reports.get(target)
    dst_topics = (*(dst_report.topics if dst_report else ()), load)
    reports[target] = _adjust(dst_report, target, dst_topics, delta, +1.0)

    assignments = dict(snapshot.assignments)
    assignments[source] = tuple(t for t in assignments.get(source, ()) if t != topic)
    assignments[target] = (*assignments.get(target, ()), topic)
    return replace(snapshot, reports=reports, assignments=assignments)


def add_topic(
    snapshot: ClusterSnapshot,
    topic: str,
    broker: BrokerId,
    load: TopicLoad | None = None,
    resources: Resources = (0.0, 0.0, 0.0, 0.0),
) -> ClusterSnapshot:
    """The snapshot with `topic` placed on `broker` (a placeholder when `load` is None)."""
    assignments = dict(snapshot.assignments)
    assignments[broker] = (*assignments.get(broker, ()), topic)
    reports = dict(snapshot.reports)
    if load is not None or any(resources):
        report = snapshot.reports.get(broker)
        topics = (*(report.topics if report else ()), *((load,) if load else ()))
        reports[broker] = _adjust(report, broker, topics, resources, +1.0)
    return replace(snapshot, reports=reports, assignments=assignments)


def remove_broker(
    snapshot: ClusterSnapshot, broker: BrokerId
) -> tuple[ClusterSnapshot, list[tuple[str, TopicLoad, Resources]]]:
    """Drop `broker`; return its topics with their last known loads and resource shares
    (of the broker's load above the idle baseline)."""
    report = snapshot.reports.get(broker)
    total = broker_topic_load(snapshot, broker)
    baseline = idle_baseline(snapshot)
    orphans = []
    for topic, load in snapshot.topic_loads(broker).items():
        share = topic_weight(load) / total if total > 0 else 0.0
        orphans.append((topic, load, _resources(report, share, baseline)))
    reports = {b: r for b, r in snapshot.reports.items() if b != broker}
    assignments = {b: t for b, t in snapshot.assignments.items() if b != broker}
    brokers = tuple(b for b in snapshot.brokers if b != broker)
    states = {b: s for b, s in snapshot.states.items() if b != broker}
    return replace(
        snapshot, brokers=brokers, reports=reports, assignments=assignments, states=states
    ), orphans
