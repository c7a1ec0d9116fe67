"""Choosing a broker for a topic: filters, then the strategy's score, then round-robin.

Filters say why they reject a broker, so an operator can see why a broker was not chosen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ballast.balance.estimate import add_topic, remove_broker, topic_weight
from ballast.balance.rankings import broker_metrics, score_brokers, scores_from_metrics
from ballast.config import Strategy
from ballast.model import BrokerId, ClusterSnapshot, MarkerReason, TopicLoad, UnassignedMarker

ROUND_ROBIN_BAND = 0.10  # brokers within 10 % of the minimum score share new topics


@dataclass(frozen=True)
class Placement:
    """The chosen broker (None when no broker can take the topic) and why."""

    broker: BrokerId | None
    reason: str
    candidates: tuple[BrokerId, ...] = ()
    rejected: Mapping[BrokerId, str] = field(default_factory=dict)
    scores: Mapping[BrokerId, float] = field(default_factory=dict)

    def explain(self) -> str:
        lines = [self.reason]
        lines += [f"  {b}: {why}" for b, why in sorted(self.rejected.items())]
        return "\n".join(lines)


def filter_brokers(
    snapshot: ClusterSnapshot, marker: UnassignedMarker | None
) -> tuple[list[BrokerId], dict[BrokerId, str]]:
    """Brokers that may take a topic, and the reason each other broker may not."""
    allowed: list[BrokerId] = []
    rejected: dict[BrokerId, str] = {}
    for broker in snapshot.brokers:
        state = snapshot.state(broker)
        if not state.is_active:
            rejected[broker] = f"[not-active] broker is {state.mode.value}"
        elif marker is not None and marker.from_broker == broker:
            rejected[broker] = f"[source] topic is leaving this broker ({marker.reason.value})"
        else:
            allowed.append(broker)
    return allowed, rejected


def select_broker(
    snapshot: ClusterSnapshot,
    strategy: Strategy,
    marker: UnassignedMarker | None = None,
    last_chosen: BrokerId | None = None,
    scores: Mapping[BrokerId, float] | None = None,
    band: float = ROUND_ROBIN_BAND,
) -> Placement:
    """Pick the broker for one topic.

    The `to_broker` hint wins when that broker passes the filters; otherwise round-robin,
    continuing after `last_chosen`, among brokers within 10 % of the minimum score.
    """
    allowed, rejected = filter_brokers(snapshot, marker)
    scores = dict(scores) if scores is not None else score_brokers(snapshot, strategy)
    if not allowed:
        return Placement(None, "[no-broker] no active broker can take the topic", (), rejected)
    if marker is not None and marker.to_broker is not None:
        if marker.to_broker in allowed:
            return Placement(
                marker.to_broker,
                f"[hint] to_broker {marker.to_broker} honoured",
                (),
                rejected,
                scores,
            )
        why = rejected.get(marker.to_broker, "[unknown] broker is not registered")
        rejected = {**rejected, marker.to_broker: why}
    lowest = min(scores[b] for b in allowed)
    ceiling = lowest + band * abs(lowest)
    candidates = tuple(sorted(b for b in allowed if scores[b] <= ceiling))
    following = [b for b in candidates if last_chosen is not None and b > last_chosen]
    chosen = following[0] if following else candidates[0]
    for b in allowed:
        if b not in candidates:
            rejected[b] = f"[score] {scores[b]:.2f} is above the band {ceiling:.2f}"
    reason = (
        f"[round-robin] {chosen} among {len(candidates)} broker(s) within {band:.0%} of the "
        f"minimum score {lowest:.2f}"
    )
    return Placement(chosen, reason, candidates, rejected, scores)


@dataclass(frozen=True)
class PlacementPlan:
    """Topics placed one after another, each seeing the placeholders of the previous."""

    placements: tuple[tuple[str, Placement], ...]
    snapshot: ClusterSnapshot
    last_chosen: BrokerId | None


class _BulkPlacer:
    """`select_broker` for many topics in a row, in O(brokers) numpy per topic.

    The filters are computed once and the metric columns are updated in place after each
    placement (exactly what `add_topic` adds), so the scores are the strategy's own formula
    on the same numbers, without rebuilding the snapshot's metrics for every topic. A
    placement that finds no broker falls back to `select_broker` for its full explanation;
    a successful one carries its reason and candidates (per-broker rejections are left to
    `select_broker`, which `ballast admin topics describe` uses).
    """

    def __init__(self, snapshot: ClusterSnapshot, strategy: Strategy, band: float) -> None:
        self.strategy = strategy
        self.band = band
        self.metrics = broker_metrics(snapshot)
        self.brokers = snapshot.brokers
        self.index = {b: i for i, b in enumerate(self.brokers)}
        self.active = np.array([snapshot.state(b).is_active for b in self.brokers], dtype=bool)
        self.scores = scores_from_metrics(self.metrics, strategy)

    def select(
        self,
        snapshot: ClusterSnapshot,
        marker: UnassignedMarker | None,
        last_chosen: BrokerId | None,
    ) -> Placement:
        allowed = self.active.copy()
        source = marker.from_broker if marker is not None else None
        if source in self.index:
            allowed[self.index[source]] = False
        if not allowed.any():
            return select_broker(snapshot, self.strategy, marker, last_chosen, band=self.band)
        hint = marker.to_broker if marker is not None else None
        if hint is not None:
            i = self.index.get(hint)
            if i is not None and allowed[i]:
                return Placement(hint, f"[hint] to_broker {hint} honoured")
        lowest = float(self.scores[allowed].min())
        ceiling = lowest + self.band * abs(lowest)
        chosen_mask = allowed & (self.scores <= ceiling)
        candidates = tuple(sorted(self.brokers[i] for i in np.flatnonzero(chosen_mask)))
        following = [b for b in candidates if last_chosen is not None and b > last_chosen]
        chosen = following[0] if following else candidates[0]
        reason = (
            f"[round-robin] {chosen} among {len(candidates)} broker(s) within "
            f"{self.band:.0%} of the minimum score {lowest:.2f}"
        )
        return Placement(chosen, reason, candidates)

    def add(
        self,
        broker: BrokerId,
        load: TopicLoad | None = None,
        resources: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0),
    ) -> None:
        """Account for a topic placed on `broker` (as `add_topic` does to the snapshot)."""
        i = self.index[broker]
        m = self.metrics
        m.topic_count[i] += 1
        if load is not None:
            m.throughput_mbps[i] += load.throughput_mbps
            m.connections[i] += load.connections
            m.backlog[i] += load.backlog
        m.cpu[i] += resources[0]
        m.mem[i] += resources[1]
        m.disk[i] += resources[2]
        m.net[i] += resources[3]
        self.scores = scores_from_metrics(m, self.strategy)


def place_topics(
    snapshot: ClusterSnapshot,
    strategy: Strategy,
    topics: Sequence[tuple[str, UnassignedMarker | None]],
    last_chosen: BrokerId | None = None,
) -> PlacementPlan:
    """Place a burst of new topics; each placement adds a zero-load placeholder."""
    placer = _BulkPlacer(snapshot, strategy, ROUND_ROBIN_BAND)
    placements = []
    for topic, marker in topics:
        placement = placer.select(snapshot, marker, last_chosen)
        placements.append((topic, placement))
        if placement.broker is not None:
            snapshot = add_topic(snapshot, topic, placement.broker)
            placer.add(placement.broker)
            last_chosen = placement.broker
    return PlacementPlan(tuple(placements), snapshot, last_chosen)


def plan_failover(
    snapshot: ClusterSnapshot,
    dead: BrokerId,
    strategy: Strategy,
    last_chosen: BrokerId | None = None,
    now: float = 0.0,
) -> PlacementPlan:
    """Spread a dead broker's topics over the survivors.

    Heaviest first, each carrying its last known load and resource share, so the
    survivors' scores rise as they receive topics and nothing piles onto one broker. Each
    topic goes to the least-loaded survivor (round-robin among exact ties only, no 10 %
    band): failover is a bulk placement that levels the survivors out (with Fair, counts end
    at most one apart), where the band would keep the gaps between them.
    """
    survivors, orphans = remove_broker(snapshot, dead)
    orphans.sort(key=lambda o: (-topic_weight(o[1]), o[0]))
    marker = UnassignedMarker(MarkerReason.FAILOVER, from_broker=dead, timestamp=now)
    placer = _BulkPlacer(survivors, strategy, 0.0)
    placements = []
    for topic, load, resources in orphans:
        placement = placer.select(survivors, marker, last_chosen)
        placements.append((topic, placement))
        if placement.broker is not None:
            survivors = add_topic(survivors, topic, placement.broker, load, resources)
            placer.add(placement.broker, load, resources)
            last_chosen = placement.broker
    return PlacementPlan(tuple(placements), survivors, last_chosen)


def plan_drain(
    snapshot: ClusterSnapshot, broker: BrokerId, now: float
) -> tuple[tuple[str, UnassignedMarker], ...]:
    """Unload markers for every topic of a draining broker (it then receives none)."""
    return tuple(
        (
            topic,
            UnassignedMarker(MarkerReason.UNLOAD, from_broker=broker, timestamp=now, ready=False),
        )
        for topic in sorted(snapshot.topics_of(broker))
    )
