"""Pulsar's placement strategies: LeastLongTermMessageRate and LeastResourceUsageWithWeight.

Both choose among the brokers that passed the placement filters. Pulsar picks randomly
among equally good brokers; Ballast picks the lowest score, then the lowest id, so a
decision can be replayed. Ballast brokers report one network rate: it counts half as
bandwidth in and half as bandwidth out, against `nic_speed_gbps`; direct memory is not
reported (0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ballast.balance.pulsar.shedders import max_usage, max_usage_with_weight, resource_usage_score
from ballast.config import PulsarConfig, Strategy
from ballast.model import BrokerId, ClusterSnapshot

__all__ = [
    "PULSAR_STRATEGIES",
    "StrategyChoice",
    "bandwidth_percent",
    "broker_msg_rates",
    "broker_resources",
    "least_long_term_message_rate",
    "least_resource_usage_with_weight",
    "pulsar_scores",
    "resource_usage_score",
    "select_pulsar",
]

PULSAR_STRATEGIES = (
    Strategy.LEAST_LONG_TERM_MESSAGE_RATE,
    Strategy.LEAST_RESOURCE_USAGE_WITH_WEIGHT,
)


def bandwidth_percent(network_io_bps: Any, nic_speed_gbps: float) -> Any:
    """One direction's bandwidth usage in percent: half the reported rate, in bits, over
    the NIC speed. Plain arithmetic (floats, NumPy, Spark columns)."""
    return network_io_bps * 0.5 * 8 / (nic_speed_gbps * 1e9) * 100


def broker_resources(
    snapshot: ClusterSnapshot, brokers: Sequence[BrokerId], cfg: PulsarConfig
) -> np.ndarray:
    """(B, 5) percent: cpu, memory, direct memory (0), bandwidth in, bandwidth out."""
    out = np.zeros((len(brokers), 5))
    for i, b in enumerate(brokers):
        r = snapshot.reports.get(b)
        if r is None:
            continue
        bw = bandwidth_percent(r.network_io_bps, cfg.nic_speed_gbps)
        out[i] = (r.cpu_percent, r.memory_percent, 0.0, bw, bw)
    return out


def broker_msg_rates(snapshot: ClusterSnapshot, brokers: Sequence[BrokerId]) -> np.ndarray:
    """Each broker's reported message rate (in + out), 0 before its first report."""
    return np.array(
        [r.total_msg_rate if (r := snapshot.reports.get(b)) is not None else 0.0 for b in brokers],
        dtype=float,
    )


def pulsar_scores(
    snapshot: ClusterSnapshot, strategy: Strategy, cfg: PulsarConfig | None = None
) -> dict[BrokerId, float]:
    """Ranking scores: message rate (LLTMR) or max weighted resource usage % (LRUW)."""
    cfg = cfg or PulsarConfig()
    brokers = snapshot.brokers
    if strategy is Strategy.LEAST_LONG_TERM_MESSAGE_RATE:
        values = broker_msg_rates(snapshot, brokers)
    elif strategy is Strategy.LEAST_RESOURCE_USAGE_WITH_WEIGHT:
        res = broker_resources(snapshot, brokers, cfg)
        cpu, mem, direct, bw_in, bw_out = res.T
        values = np.asarray(resource_usage_score(cpu, mem, direct, bw_in, bw_out, cfg), dtype=float)
    else:
        raise ValueError(f"strategy {strategy.value!r} is not one of Pulsar's")
    return dict(zip(brokers, values.tolist(), strict=True))


@dataclass(frozen=True)
class StrategyChoice:
    """The chosen broker (None: no candidate), why, and per-broker notes."""

    broker: BrokerId | None
    reason: str
    rejected: Mapping[BrokerId, str] = field(default_factory=dict)
    scores: Mapping[BrokerId, float] = field(default_factory=dict)
    usage: Mapping[BrokerId, float] = field(default_factory=dict)  # LRUW state to pass back


def least_long_term_message_rate(
    candidates: Sequence[BrokerId],
    msg_rate: Mapping[BrokerId, float],
    max_usage: Mapping[BrokerId, float],
    cfg: PulsarConfig,
    units: Mapping[BrokerId, int] | None = None,
) -> StrategyChoice:
    """Lowest message rate among brokers not above the overload threshold; when every
    candidate is overloaded, the lowest message rate among all (Pulsar: random). Equal
    rates go to the broker owning fewer `units` (topics), then the lowest id, so a burst
    placed before the next load report still spreads (Pulsar counts preallocated bundles)."""
    units = units or {}
    if not candidates:
        return StrategyChoice(None, "[no-broker] no candidate broker")
    limit = cfg.broker_overloaded_threshold_percentage / 100
    rejected: dict[BrokerId, str] = {}
    ok = []
    for b in sorted(candidates):
        u = max_usage.get(b, 0.0)
        if u > limit:
            rejected[b] = f"[overloaded] max usage {100 * u:.1f}% > {100 * limit:.0f}%"
        else:
            ok.append(b)
    pool = ok or sorted(candidates)
    best = min(pool, key=lambda b: (msg_rate.get(b, 0.0), units.get(b, 0), b))
    scores = {b: msg_rate.get(b, 0.0) for b in candidates}
    for b in ok:
        if b != best:
            rejected[b] = f"[score] msg rate {scores[b]:.0f}/s > {scores[best]:.0f}/s"
    note = "" if ok else " (every candidate is overloaded)"
    return StrategyChoice(
        best,
        f"[least_long_term_message_rate] {best}: lowest msg rate {scores[best]:.0f}/s{note}",
        rejected,
        scores,
    )


def least_resource_usage_with_weight(
    candidates: Sequence[BrokerId],
    sample: Mapping[BrokerId, float],
    cfg: PulsarConfig,
    previous: Mapping[BrokerId, float] | None = None,
    idle: Sequence[BrokerId] = (),
    units: Mapping[BrokerId, int] | None = None,
) -> StrategyChoice:
    """Brokers whose smoothed usage is at least `average_resource_usage_difference_threshold`
    below the candidates' average; the least used of them (Pulsar: random among them).

    `sample` is each broker's max weighted usage (fraction); a candidate missing from it has
    no load data yet and, as in Pulsar, counts neither in the average nor among the best
    (it is not "0 % used"). `previous` holds the smoothed values of the last call (the
    returned `usage`); a broker in `idle` (owning nothing, e.g. just restarted) starts again
    from its sample, as in Pulsar. With no broker far enough below the average, the least
    used candidate with load data is chosen (Pulsar: a random candidate); only when none has
    any, the one owning the fewest `units`. Ties: fewer `units`, then the lowest id."""
    units = units or {}
    if not candidates:
        return StrategyChoice(None, "[no-broker] no candidate broker")
    h = cfg.history_resource_percentage
    prev = dict(previous or {})
    usage = dict(prev)
    known = sorted(b for b in candidates if b in sample)
    for b in known:
        s = sample[b]
        usage[b] = h * prev[b] + (1 - h) * s if b in prev and b not in idle else s
    rejected = {
        b: "[no-load-data] no load report yet: left out of the average and the best set"
        for b in sorted(candidates)
        if b not in sample
    }
    diff = cfg.average_resource_usage_difference_threshold_percentage / 100
    if not known:
        chosen = min(sorted(candidates), key=lambda b: (units.get(b, 0), b))
        rejected.pop(chosen, None)
        return StrategyChoice(
            chosen,
            f"[least_resource_usage_with_weight] {chosen}: no candidate has load data; "
            "fewest units",
            rejected,
        )
    avg = sum(usage[b] for b in known) / len(known)
    best = [b for b in known if usage[b] + diff <= avg]
    for b in known:
        if b not in best:
            rejected[b] = (
                f"[score] usage {100 * usage[b]:.1f}% is not {100 * diff:.0f}% below the "
                f"average {100 * avg:.1f}%"
            )
    pool = best or known
    chosen = min(pool, key=lambda b: (usage[b], units.get(b, 0), b))
    why = (
        f"{len(best)} broker(s) ≥ {100 * diff:.0f}% below the average {100 * avg:.1f}%"
        if best
        else f"none is {100 * diff:.0f}% below the average {100 * avg:.1f}%"
    )
    if len(known) < len(candidates):
        why += f" of {len(known)} broker(s) with load data"
    rejected.pop(chosen, None)
    return StrategyChoice(
        chosen,
        f"[least_resource_usage_with_weight] {chosen} at {100 * usage[chosen]:.1f}%: {why}",
        rejected,
        {b: 100 * usage[b] for b in known},
        {b: u for b, u in usage.items() if b in known or b in prev},
    )


def select_pulsar(
    snapshot: ClusterSnapshot,
    strategy: Strategy,
    candidates: Sequence[BrokerId],
    cfg: PulsarConfig | None = None,
) -> StrategyChoice:
    """Run one of Pulsar's strategies over `candidates` on the snapshot's latest reports."""
    cfg = cfg or PulsarConfig()
    brokers = tuple(sorted(candidates))
    res = broker_resources(snapshot, brokers, cfg)
    units = {b: len(snapshot.assignments.get(b, ())) for b in brokers}
    if strategy is Strategy.LEAST_LONG_TERM_MESSAGE_RATE:
        rates = dict(zip(brokers, broker_msg_rates(snapshot, brokers).tolist(), strict=True))
        usage = dict(zip(brokers, max_usage(res).tolist(), strict=True))
        return least_long_term_message_rate(brokers, rates, usage, cfg, units)
    sample = {
        b: u
        for b, u in zip(brokers, max_usage_with_weight(res, cfg).tolist(), strict=True)
        if b in snapshot.reports
    }
    return least_resource_usage_with_weight(brokers, sample, cfg, units=units)
