"""Pulsar's shedders as Ballast's rebalancing policy: snapshot in, `Decision` out.

`decide_rebalance` dispatches here when `rebalancing.policy` is `threshold`, `overload` or
`uniform`. The shedder chooses units to unload (a namespace's bundles when the namespace is
placed by bundle, single topics otherwise); the configured placement strategy then picks a
target for each unit, and every topic of a unit moves to that same target. The decision's
reason carries the shedder's numbers and `details` says, per broker, why it shed or not.

Rules beside the shedder's own: the grace period (`shedding_grace_period_minutes`: a unit
with a topic moved that recently stays), the blacklist, and Pulsar's anti-affinity unload
check (a unit of an anti-affinity namespace is not unloaded if it would come straight back).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from ballast.balance.candidates import is_blacklisted
from ballast.balance.estimate import apply_move
from ballast.balance.history import MoveHistory
from ballast.balance.noise import is_return
from ballast.balance.placement import select_broker
from ballast.balance.pulsar.bundles import (
    NamespaceBundles,
    SplitPlan,
    SplitResult,
    TopicTraffic,
    bundle_stats,
    decide_splits,
    split_bundle,
    topic_hash,
)
from ballast.balance.pulsar.domains import group_counts, should_unload
from ballast.balance.pulsar.shedders import SheddingInput, SheddingResult, run_shedder
from ballast.balance.pulsar.strategies import broker_resources
from ballast.balance.rankings import score_brokers
from ballast.config import (
    LoadManagerConfig,
    PlacementUnit,
    PulsarConfig,
    RebalancingConfig,
    RebalancingPolicy,
    Strategy,
)
from ballast.model import (
    BrokerId,
    ClusterSnapshot,
    MarkerReason,
    Move,
    TopicLoad,
    UnassignedMarker,
    topic_namespace,
)

SHEDDER_REASON = {
    RebalancingPolicy.THRESHOLD: "ThresholdShedder",
    RebalancingPolicy.OVERLOAD: "OverloadShedder",
    RebalancingPolicy.UNIFORM: "UniformLoadShedder",
}


@dataclass(frozen=True)
class Units:
    """The snapshot's placement units as the shedders see them, plus each unit's topics."""

    input: SheddingInput
    topics: tuple[tuple[str, ...], ...]


def unit_layouts(snapshot: ClusterSnapshot) -> dict[str, NamespaceBundles]:
    return {ns: NamespaceBundles(ns, tuple(b)) for ns, b in snapshot.bundle_boundaries.items()}


def build_units(
    snapshot: ClusterSnapshot,
    history: MoveHistory,
    now: float,
    config: RebalancingConfig,
    pulsar: PulsarConfig,
) -> Units:
    """Active brokers that have reported (by id) and their units: bundles for namespaces
    placed by bundle, topics otherwise; with the reasons that keep some units in place."""
    # Like Pulsar's load data: the brokers that have reported (a broker yet to report would
    # count as idle and drag the average down); they may all still receive units.
    brokers = tuple(sorted(b for b in snapshot.active_brokers() if b in snapshot.reports))
    layouts = unit_layouts(snapshot)
    grace = pulsar.shedding_grace_period_minutes * 60
    recent = history.recently_moved(now, grace) if grace > 0 else frozenset()
    names: list[str] = []
    owners: list[int] = []
    rates: list[float] = []
    thrs: list[float] = []
    topics: list[tuple[str, ...]] = []
    blocked: dict[int, str] = {}
    b_rate = np.zeros(len(brokers))
    b_thr = np.zeros(len(brokers))
    counts_cache: dict[str, dict[BrokerId, int] | None] = {}
    for i, b in enumerate(brokers):
        groups: dict[str, list[str]] = {}
        rate: dict[str, float] = {}
        thr: dict[str, float] = {}
        for t, load in snapshot.topic_loads(b).items():
            ns = topic_namespace(t)
            layout = layouts.get(ns)
            unit = layout.full_name(layout.bundle_for_topic(t)) if layout else t
            groups.setdefault(unit, []).append(t)
            rate[unit] = rate.get(unit, 0.0) + load.msg_rate
            thr[unit] = thr.get(unit, 0.0) + load.byte_rate
        for unit in sorted(groups):
            j = len(names)
            ts = tuple(sorted(groups[unit]))
            names.append(unit)
            owners.append(i)
            rates.append(rate[unit])
            thrs.append(thr[unit])
            topics.append(ts)
            b_rate[i] += rate[unit]
            b_thr[i] += thr[unit]
            if any(t in recent for t in ts):
                blocked[j] = f"recently unloaded (grace {pulsar.shedding_grace_period_minutes:g}m)"
            elif any(is_blacklisted(t, config.blacklist_topics) for t in ts):
                blocked[j] = "blacklisted"
            elif snapshot.anti_affinity_groups:
                ns = topic_namespace(ts[0])
                if ns not in counts_cache:
                    counts_cache[ns] = group_counts(snapshot, ns)
                ok, why = should_unload(b, brokers, counts_cache[ns])
                if not ok:
                    blocked[j] = why
    inp = SheddingInput(
        brokers=brokers,
        resources=broker_resources(snapshot, brokers, pulsar),
        msg_rate=b_rate,
        throughput=b_thr,
        unit_names=tuple(names),
        unit_broker=np.asarray(owners, dtype=np.int64),
        unit_msg_rate=np.asarray(rates, dtype=float),
        unit_throughput=np.asarray(thrs, dtype=float),
        blocked=blocked,
    )
    return Units(inp, tuple(topics))


@dataclass(frozen=True)
class SheddingOutcome:
    """The shedder's result, the moves it leads to, and the estimated snapshot after each."""

    result: SheddingResult
    moves: tuple[Move, ...]
    after_first: ClusterSnapshot | None
    after_all: ClusterSnapshot
    notes: tuple[str, ...]
    rate_limited: int = 0  # units the rate limits held back


def move_budget(history: MoveHistory, now: float, config: RebalancingConfig) -> tuple[int, str]:
    """How many topic moves the rate limits allow now (`max_moves_per_hour` over the last
    hour, none during `cooldown_seconds` after the last move), and why it is what it is."""
    if history.cooldown_left(now, config.cooldown_seconds) > 0:
        return 0, f"cooldown ({config.cooldown_seconds:g}s after the last move)"
    recent = len(history.in_window(now))
    left = max(0, config.max_moves_per_hour - recent)
    return left, f"{recent} moves in the last hour (max {config.max_moves_per_hour})"


def returning_targets(
    history: MoveHistory,
    topics: tuple[str, ...],
    brokers: tuple[BrokerId, ...],
    now: float,
    window: float,
) -> dict[BrokerId, str]:
    """Brokers a unit may not move to: one of its topics left them within the return
    window (`noise.is_return`), each with the reason."""
    if window <= 0:
        return {}
    recent = {m.topic for m in history.moves if now - m.timestamp < window}
    out: dict[BrokerId, str] = {}
    for t in topics:
        if t not in recent:
            continue
        for b in brokers:
            if b not in out and is_return(history, t, b, now, window):
                out[b] = f"[return-window] {t} left {b} less than {window:g}s ago"
    return out


def shed(
    snapshot: ClusterSnapshot,
    history: MoveHistory,
    now: float,
    config: RebalancingConfig,
    strategy: Strategy,
    pulsar: PulsarConfig | None = None,
    state: Mapping[BrokerId, float] | None = None,
    max_moves: int | None = None,
) -> SheddingOutcome:
    """Run the configured shedder and turn its unloads into moves.

    Every unit keeps its topics together (one target for all of them); a target a topic of
    the unit left within `return_window_seconds` is ruled out. With `max_moves`, units are
    taken in the shedder's order while their topic moves fit (a unit never splits); a unit
    larger than the whole budget moves alone when the budget is full (no move in the hour),
    so that a big bundle is not stuck forever."""
    cfg = pulsar or PulsarConfig()
    units = build_units(snapshot, history, now, config, cfg)
    result = run_shedder(config.policy, units.input, cfg, state)
    index = {
        (n, units.input.brokers[int(o)]): j
        for j, (n, o) in enumerate(
            zip(units.input.unit_names, units.input.unit_broker, strict=True)
        )
    }
    moves: list[Move] = []
    notes: list[str] = []
    after = snapshot
    after_first: ClusterSnapshot | None = None
    last: BrokerId | None = None
    reason = SHEDDER_REASON[config.policy]
    held = 0
    scores = score_brokers(after, strategy, cfg) if result.unloads else {}
    window = config.return_window_seconds
    for unload in result.unloads:
        ts = units.topics[index[(unload.unit, unload.broker)]]
        if max_moves is not None and len(moves) + len(ts) > max_moves:
            alone = not moves and max_moves >= config.max_moves_per_hour > 0
            if not alone:
                held += 1
                notes.append(
                    f"{unload.unit}: [rate-limit] its {len(ts)} topic move(s) exceed what the "
                    f"rate limits allow now ({max_moves - len(moves)} left)"
                )
                continue
        marker = UnassignedMarker(MarkerReason.REBALANCE, from_broker=unload.broker, timestamp=now)
        exclude = returning_targets(history, ts, snapshot.brokers, now, window)
        placement = select_broker(
            after, strategy, marker, last, scores, topic=ts[0], pulsar=cfg, exclude=exclude
        )
        ruled_out = "".join(f"; {b}: {why}" for b, why in sorted(exclude.items()))
        if placement.broker is None:
            notes.append(f"{unload.unit}: no target ({placement.reason}{ruled_out})")
            continue
        target = placement.broker
        last = target
        loads = snapshot.topic_loads(unload.broker)
        for t in ts:
            moves.append(Move(t, unload.broker, target, reason, loads[t].byte_rate / 1e6, now))
            after = apply_move(after, t, unload.broker, target)
            if after_first is None:
                after_first = after
        scores = _rescored(after, scores, (unload.broker, target), strategy, cfg)
        notes.append(
            f"{unload.unit} ({len(ts)} topic(s), {unload.throughput / 1e6:.2f} MB/s, "
            f"{unload.msg_rate:.0f} msg/s): {unload.broker} → {target} {placement.reason}"
            + ruled_out
        )
    return SheddingOutcome(result, tuple(moves), after_first, after, tuple(notes), held)


def _rescored(
    after: ClusterSnapshot,
    scores: dict[BrokerId, float],
    changed: tuple[BrokerId, BrokerId],
    strategy: Strategy,
    cfg: PulsarConfig,
) -> dict[BrokerId, float]:
    """Scores after a move. Fair, Balanced (when these brokers report resources) and
    Pulsar's strategies score each broker on its own data: only the two brokers of the move
    are rescored. WeightedLoad normalises by the cluster maximum: everything is."""
    local = strategy is not Strategy.WEIGHTED_LOAD
    if strategy is Strategy.BALANCED:
        reps = [after.reports.get(b) for b in changed]
        local = any(r is not None and (r.cpu_percent or r.memory_percent) for r in reps)
    if not local:
        return score_brokers(after, strategy, cfg)
    sub = ClusterSnapshot(
        changed,
        {b: r for b in changed if (r := after.reports.get(b)) is not None},
        {},
        {b: after.assignments.get(b, ()) for b in changed},
    )
    return {**scores, **score_brokers(sub, strategy, cfg)}


def with_bundles(
    snapshot: ClusterSnapshot, layouts: Mapping[str, NamespaceBundles]
) -> ClusterSnapshot:
    """The snapshot with these namespaces placed by bundle."""
    bounds = dict(snapshot.bundle_boundaries)
    bounds.update({ns: lay.boundaries for ns, lay in layouts.items()})
    return replace(snapshot, bundle_boundaries=bounds)


def default_layouts(snapshot: ClusterSnapshot, pulsar: PulsarConfig) -> dict[str, NamespaceBundles]:
    """Every namespace of the snapshot with `default_number_of_namespace_bundles` bundles."""
    namespaces = {topic_namespace(t) for ts in snapshot.assignments.values() for t in ts} | set(
        snapshot.bundle_boundaries
    )
    n = pulsar.default_number_of_namespace_bundles
    return {
        ns: NamespaceBundles(ns, tuple(snapshot.bundle_boundaries[ns]))
        if ns in snapshot.bundle_boundaries
        else NamespaceBundles.create(ns, n)
        for ns in sorted(namespaces)
    }


def prepare_snapshot(
    snapshot: ClusterSnapshot,
    lm: LoadManagerConfig,
    layouts: Mapping[str, NamespaceBundles] | None = None,
) -> ClusterSnapshot:
    """The snapshot as the shell should hand it to the core under `lm`: with
    `placement_unit: bundle`, the namespaces' known `layouts`, and the default bundles for
    every other namespace."""
    if lm.placement_unit is not PlacementUnit.BUNDLE:
        return snapshot
    snapshot = with_bundles(snapshot, layouts or {})
    return with_bundles(snapshot, default_layouts(snapshot, lm.pulsar))


@dataclass(frozen=True)
class AutoSplit:
    """The automatic split of this cycle: new layouts, the plan with its reasons, each
    split's result, and the topics to unload (when `auto_unload_split_bundles_enabled`)."""

    layouts: Mapping[str, NamespaceBundles]
    plan: SplitPlan
    results: tuple[SplitResult, ...]
    unload: tuple[tuple[str, BrokerId], ...]


def auto_split(snapshot: ClusterSnapshot, pulsar: PulsarConfig) -> AutoSplit:
    """Pulsar's bundle split task on a snapshot placed by bundle: split every bundle over a
    maximum (`decide_splits`) with the default algorithm; the split bundles' topics are
    unloaded when configured, so that placement can spread the new bundles."""
    layouts = unit_layouts(snapshot)
    loads: dict[str, list[TopicLoad]] = {}
    owner: dict[str, BrokerId] = {}
    for b in snapshot.brokers:
        for t, load in snapshot.topic_loads(b).items():
            loads.setdefault(topic_namespace(t), []).append(load)
            owner[t] = b
    stats = {ns: bundle_stats(layouts[ns], loads.get(ns, ())) for ns in layouts}
    plan = decide_splits(layouts, stats, pulsar)
    new = dict(layouts)
    results: list[SplitResult] = []
    unload: list[tuple[str, BrokerId]] = []
    for s in plan.splits:
        layout = new[s.namespace]
        traffic = [
            TopicTraffic(t.topic, t.msg_rate, t.byte_rate)
            for t in loads.get(s.namespace, ())
            if s.bundle.contains(topic_hash(t.topic))
        ]
        after, result = split_bundle(
            layout,
            s.bundle,
            pulsar.default_namespace_bundle_split_algorithm,
            traffic,
            config=pulsar,
        )
        results.append(result)
        if after is layout:
            continue
        new[s.namespace] = after
        if pulsar.auto_unload_split_bundles_enabled:
            unload += [(t.topic, owner[t.topic]) for t in traffic]
    return AutoSplit(new, plan, tuple(results), tuple(unload))
