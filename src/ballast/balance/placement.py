"""Choosing a broker for a topic: filters, then the strategy's score, then round-robin.

Filters say why they reject a broker, so an operator can see why a broker was not chosen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ballast.balance.estimate import add_topic, remove_broker, topic_weight
from ballast.balance.pulsar.bundles import NamespaceBundles
from ballast.balance.pulsar.domains import filter_anti_affinity, group_counts
from ballast.balance.pulsar.strategies import PULSAR_STRATEGIES, select_pulsar
from ballast.balance.rankings import broker_metrics, score_brokers, scores_from_metrics
from ballast.config import PulsarConfig, Strategy
from ballast.model import (
    BrokerId,
    ClusterSnapshot,
    MarkerReason,
    TopicLoad,
    TopicName,
    UnassignedMarker,
)

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
    snapshot: ClusterSnapshot,
    marker: UnassignedMarker | None,
    topic: str | None = None,
    exclude: Mapping[BrokerId, str] | None = None,
) -> tuple[list[BrokerId], dict[BrokerId, str]]:
    """Brokers that may take a topic, and the reason each other broker may not.

    With `topic` given, a namespace in an anti-affinity group is kept away from the failure
    domains and brokers already holding the most namespaces of its group. `exclude` names
    further brokers the caller rules out, each with its reason (e.g. the return window)."""
    allowed: list[BrokerId] = []
    rejected: dict[BrokerId, str] = {}
    states = snapshot.states
    for broker in snapshot.brokers:
        state = states.get(broker)
        if state is not None and not state.is_active:
            rejected[broker] = f"[not-active] broker is {state.mode.value}"
        elif marker is not None and marker.from_broker == broker:
            rejected[broker] = f"[source] topic is leaving this broker ({marker.reason.value})"
        elif exclude is not None and broker in exclude:
            rejected[broker] = exclude[broker]
        else:
            allowed.append(broker)
    if topic is not None and snapshot.anti_affinity_groups:
        ns = TopicName.parse(topic).namespace
        counts = group_counts(snapshot, ns, include_self=False)
        if counts is not None:
            kept = filter_anti_affinity(
                allowed, counts, snapshot.broker_domains, snapshot.anti_affinity_groups[ns]
            )
            rejected.update(kept.rejected)
            allowed = [b for b in allowed if b in kept.kept]
    return allowed, rejected


def bundle_owner(snapshot: ClusterSnapshot, topic: str) -> tuple[str, BrokerId | None] | None:
    """For a namespace placed by bundle: the topic's bundle name and the broker owning
    another topic of that bundle (None when nobody does). None: placed by topic."""
    ns = TopicName.parse(topic).namespace
    bounds = snapshot.bundle_boundaries.get(ns)
    if bounds is None:
        return None
    layout = NamespaceBundles(ns, tuple(bounds))
    bundle = layout.bundle_for_topic(topic)
    prefix = f"/{ns}/"
    for broker in sorted(snapshot.assignments):
        for t in snapshot.assignments[broker]:
            if t != topic and t.startswith(prefix) and layout.bundle_for_topic(t) == bundle:
                return layout.full_name(bundle), broker
    return layout.full_name(bundle), None


def namespace_bundle_counts(
    snapshot: ClusterSnapshot, namespace: str, brokers: Sequence[BrokerId], skip: str = ""
) -> dict[BrokerId, int]:
    """How many bundles of `namespace` each of `brokers` serves (None of its topics: 0),
    not counting topic `skip`. Only for a namespace placed by bundle."""
    layout = NamespaceBundles(namespace, tuple(snapshot.bundle_boundaries[namespace]))
    prefix = f"/{namespace}/"
    return {
        b: len(
            {
                layout.bundle_for_topic(t)
                for t in snapshot.assignments.get(b, ())
                if t != skip and t.startswith(prefix)
            }
        )
        for b in brokers
    }


def filter_namespace_spread(
    snapshot: ClusterSnapshot, topic: str, allowed: Sequence[BrokerId]
) -> tuple[list[BrokerId], dict[BrokerId, str]]:
    """Pulsar's `removeMostServicingBrokersForNamespace`: of the brokers that may take a new
    bundle, keep those serving the fewest bundles of its namespace, so a namespace's bundles
    spread over the brokers. Only for a namespace placed by bundle; the rest say why not."""
    ns = TopicName.parse(topic).namespace
    if ns not in snapshot.bundle_boundaries or not allowed:
        return list(allowed), {}
    counts = namespace_bundle_counts(snapshot, ns, allowed, skip=topic)
    least = min(counts.values())
    kept = [b for b in allowed if counts[b] == least]
    rejected = {
        b: f"[namespace-spread] serves {counts[b]} bundle(s) of {ns}; {len(kept)} broker(s) "
        f"serve {least}"
        for b in allowed
        if counts[b] > least
    }
    return kept, rejected


def select_broker(
    snapshot: ClusterSnapshot,
    strategy: Strategy,
    marker: UnassignedMarker | None = None,
    last_chosen: BrokerId | None = None,
    scores: Mapping[BrokerId, float] | None = None,
    topic: str | None = None,
    pulsar: PulsarConfig | None = None,
    band: float = ROUND_ROBIN_BAND,
    exclude: Mapping[BrokerId, str] | None = None,
) -> Placement:
    """Pick the broker for one topic.

    The `to_broker` hint wins when that broker passes the filters; then, for a namespace
    placed by bundle, the broker already owning the topic's bundle, and for a bundle nobody
    (else) owns, only the brokers serving the fewest bundles of its namespace (Pulsar's
    `removeMostServicingBrokersForNamespace`); otherwise round-robin,
    continuing after `last_chosen`, among brokers within `band` (10 %) of the minimum score
    (Pulsar's strategies choose by their own rule instead). `exclude`: see `filter_brokers`.
    """
    allowed, rejected = filter_brokers(snapshot, marker, topic, exclude)
    scores = dict(scores) if scores is not None else score_brokers(snapshot, strategy, pulsar)
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
    owned = bundle_owner(snapshot, topic) if topic is not None else None
    if owned is not None and owned[1] is not None:
        name, owner = owned
        if owner in allowed:
            return Placement(owner, f"[bundle] {name} is owned by {owner}", (), rejected, scores)
    if owned is not None and topic is not None:
        allowed, spread = filter_namespace_spread(snapshot, topic, allowed)
        rejected = {**rejected, **spread}
    if strategy in PULSAR_STRATEGIES:
        choice = select_pulsar(snapshot, strategy, allowed, pulsar)
        return Placement(
            choice.broker,
            choice.reason,
            (choice.broker,) if choice.broker else (),
            {**rejected, **choice.rejected},
            scores,
        )
    lowest = min(scores[b] for b in allowed)
    ceiling = lowest + band * abs(lowest)
    candidates = tuple(sorted(b for b in allowed if scores[b] <= ceiling))
    following = [b for b in candidates if last_chosen is not None and b > last_chosen]
    chosen = following[0] if following else candidates[0]
    in_band = set(candidates)  # a set: this runs per placement over every broker
    for b in allowed:
        if b not in in_band:
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

    Pulsar's inputs take `select_broker`'s full path, on the snapshot that already holds
    the previous placements: Pulsar's strategies, a namespace placed by bundle (the
    bundle's owner wins) and a namespace in an anti-affinity group (the domain filter).
    """

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        strategy: Strategy,
        band: float,
        pulsar: PulsarConfig | None = None,
    ) -> None:
        self.strategy = strategy
        self.band = band
        self.pulsar = pulsar
        self.pulsar_strategy = strategy in PULSAR_STRATEGIES
        self.metrics = broker_metrics(snapshot)
        self.brokers = snapshot.brokers
        self.index = {b: i for i, b in enumerate(self.brokers)}
        self.active = np.array([snapshot.state(b).is_active for b in self.brokers], dtype=bool)
        self.scores = (
            np.zeros(len(self.brokers))
            if self.pulsar_strategy
            else scores_from_metrics(self.metrics, strategy)
        )

    def _full_path(self, snapshot: ClusterSnapshot, topic: str | None) -> bool:
        if self.pulsar_strategy:
            return True
        if topic is None or not (snapshot.bundle_boundaries or snapshot.anti_affinity_groups):
            return False
        ns = TopicName.parse(topic).namespace
        return ns in snapshot.bundle_boundaries or bool(snapshot.anti_affinity_groups.get(ns))

    def select(
        self,
        snapshot: ClusterSnapshot,
        marker: UnassignedMarker | None,
        last_chosen: BrokerId | None,
        topic: str | None = None,
    ) -> Placement:
        allowed = self.active.copy()
        source = marker.from_broker if marker is not None else None
        if source in self.index:
            allowed[self.index[source]] = False
        if not allowed.any() or self._full_path(snapshot, topic):
            return select_broker(
                snapshot,
                self.strategy,
                marker,
                last_chosen,
                topic=topic,
                pulsar=self.pulsar,
                band=self.band,
            )
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
        if not self.pulsar_strategy:
            self.scores = scores_from_metrics(m, self.strategy)


def place_topics(
    snapshot: ClusterSnapshot,
    strategy: Strategy,
    topics: Sequence[tuple[str, UnassignedMarker | None]],
    last_chosen: BrokerId | None = None,
    pulsar: PulsarConfig | None = None,
) -> PlacementPlan:
    """Place a burst of new topics; each placement adds a zero-load placeholder."""
    placer = _BulkPlacer(snapshot, strategy, ROUND_ROBIN_BAND, pulsar)
    placements = []
    for topic, marker in topics:
        placement = placer.select(snapshot, marker, last_chosen, topic)
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
    pulsar: PulsarConfig | None = None,
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
    placer = _BulkPlacer(survivors, strategy, 0.0, pulsar)
    placements = []
    for topic, load, resources in orphans:
        placement = placer.select(survivors, marker, last_chosen, topic)
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
