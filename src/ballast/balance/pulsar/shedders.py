"""Pulsar's three load shedders, as pure functions that explain themselves.

Input: per broker its resource usage (percent), message rate and throughput, and the
placement units (bundles, or topics when placing by topic) it owns with their traffic and
whether each may move. Output: the units to unload, the numbers behind the decision, and
for every broker considered why it shed or did not. Pulsar logs these numbers at debug
level (or not at all); Ballast returns them.

Followed from Pulsar's implementation (4.x):
- ThresholdShedder: usage `u = h·u_prev + (1−h)·max(weighted cpu, mem, direct mem, bw in,
  bw out)`, seeded with the first sample (usage above 100 % counts as it is: Pulsar
  reverted its clamp, #18598); overloaded when `u ≥ avg + threshold`; offload
  `(u − avg − threshold + 5 %) × throughput`, heaviest units first, at least one, unless that
  is below the minimum throughput. `lower_boundary_shedding_enabled`: when nothing was
  selected and some broker is below `avg − threshold`, the most used broker with more than one
  unit offloads `threshold × 50 %` of its throughput.
- OverloadShedder: `max(cpu, direct mem, bw in, bw out) ≥ overload threshold` → offload
  `(u − threshold + 5 %) × throughput`, heaviest first, at least one unit.
- UniformLoadShedder: the max/min brokers by msg rate and by throughput; if the rate gap
  exceeds `msg_rate_difference_shedder_threshold` % (of the minimum, 0 → 1) or the
  throughput ratio exceeds the multiplier, move `max_unload_percentage` of the gap from the
  most loaded broker, heaviest first, each unit no larger than what is still needed plus
  Pulsar's fixed slack (`UNIFORM_SLACK`: 1000 msg/s, or 1000 bytes/s).
- All: a broker's only unit is never shed; recently unloaded units are excluded.

Ties break by broker id and unit name, never by hash order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ballast.balance.scoring import NUMPY_OPS, Ops
from ballast.config import PulsarConfig, RebalancingPolicy
from ballast.model import BrokerId

ADDITIONAL_THRESHOLD_PERCENT_MARGIN = 0.05
LOWER_BOUNDARY_THRESHOLD_MARGIN = 0.5
MB = 1024 * 1024
EPS = 1e-6
UNIFORM_SLACK = 1000.0  # Pulsar's `+ 1000 /* delta */`, in the unit of the metric compared
RESOURCES = ("cpu", "memory", "direct_memory", "bandwidth_in", "bandwidth_out")


@dataclass(frozen=True)
class SheddingInput:
    """Brokers (sorted by id) and units, as columns.

    `resources[i]` are broker i's cpu, memory, direct memory, bandwidth in, bandwidth out in
    percent; `msg_rate`/`throughput` are its in + out totals (msg/s, bytes/s). Unit j lives on
    broker `unit_broker[j]`; `blocked` maps a unit index to why it may not move.
    """

    brokers: tuple[BrokerId, ...]
    resources: np.ndarray  # shape (B, 5)
    msg_rate: np.ndarray  # (B,)
    throughput: np.ndarray  # (B,)
    unit_names: tuple[str, ...]
    unit_broker: np.ndarray  # (U,) int
    unit_msg_rate: np.ndarray  # (U,)
    unit_throughput: np.ndarray  # (U,)
    blocked: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if list(self.brokers) != sorted(self.brokers):
            raise ValueError("SheddingInput.brokers must be sorted by id")

    @property
    def unit_counts(self) -> np.ndarray:
        return np.bincount(self.unit_broker, minlength=len(self.brokers))

    def units_of(self) -> list[np.ndarray]:
        """Unit indices per broker, in name order (so stable sorts break ties by name)."""
        names = np.asarray(self.unit_names, dtype=str)
        order = np.lexsort((names, self.unit_broker)) if len(names) else np.zeros(0, int)
        counts = self.unit_counts
        return np.split(order, np.cumsum(counts)[:-1]) if len(counts) else []


@dataclass(frozen=True)
class Unload:
    """One unit to unload from `broker`."""

    unit: str
    broker: BrokerId
    throughput: float
    msg_rate: float


@dataclass(frozen=True)
class BrokerVerdict:
    """Why a broker did or did not shed: `rule` is a short tag, `detail` has the numbers."""

    broker: BrokerId
    rule: str
    detail: str

    def line(self) -> str:
        return f"{self.broker}: [{self.rule}] {self.detail}"


@dataclass(frozen=True)
class SheddingResult:
    """What a shedder chose, with its numbers."""

    shedder: RebalancingPolicy
    summary: str
    unloads: tuple[Unload, ...] = ()
    verdicts: tuple[BrokerVerdict, ...] = ()
    usage: Mapping[BrokerId, float] = field(default_factory=dict)  # state to pass back

    def explain(self) -> str:
        lines = [f"[{self.shedder.value}] {self.summary}"]
        lines += [f"  {v.line()}" for v in self.verdicts]
        return "\n".join(lines)


def resource_usage_score(
    cpu: Any,
    memory: Any,
    direct_memory: Any,
    bw_in: Any,
    bw_out: Any,
    cfg: PulsarConfig,
    ops: Ops = NUMPY_OPS,
) -> Any:
    """Pulsar's `getMaxResourceUsageWithWeight`, in percent: the largest weighted signal,
    not clamped (a broker at 140 % counts as 140 %). Pulsar briefly skipped signals above
    100 % (#16937) and reverted it as a breaking change (#18598, #18645). Plain arithmetic
    and `ops.maximum` (floats, NumPy, Spark columns); the one definition of the weighted
    max, used by ThresholdShedder, LeastResourceUsageWithWeight and the pipeline."""
    return ops.maximum(
        ops.maximum(
            ops.maximum(cpu * cfg.cpu_resource_weight, memory * cfg.memory_resource_weight),
            direct_memory * cfg.direct_memory_resource_weight,
        ),
        ops.maximum(
            bw_in * cfg.bandwith_in_resource_weight, bw_out * cfg.bandwith_out_resource_weight
        ),
    )


def max_usage_with_weight(resources: np.ndarray, cfg: PulsarConfig) -> np.ndarray:
    """`resource_usage_score` of each row of `resources` (B, 5), as a fraction."""
    r = np.asarray(resources, dtype=float).reshape(-1, len(RESOURCES))
    score = resource_usage_score(r[:, 0], r[:, 1], r[:, 2], r[:, 3], r[:, 4], cfg)
    return np.asarray(score, dtype=float) / 100


def max_usage(resources: np.ndarray) -> np.ndarray:
    """Pulsar's `getMaxResourceUsage`: max(cpu, direct memory, bw in, bw out) as a fraction
    (heap memory is left out, as in Pulsar)."""
    r = np.asarray(resources, dtype=float)
    if r.size == 0:
        return np.zeros(len(r))
    return r[:, [0, 2, 3, 4]].max(axis=1) / 100


def smoothed_usage(
    brokers: Sequence[BrokerId],
    sample: np.ndarray,
    previous: Mapping[BrokerId, float] | None,
    history: float,
) -> np.ndarray:
    """`h·previous + (1−h)·sample`; a broker without a previous value starts at its sample."""
    prev = previous or {}
    return np.array(
        [
            history * prev[b] + (1 - history) * s if b in prev else s
            for b, s in zip(brokers, sample.tolist(), strict=True)
        ]
    )


def _mb(x: float) -> str:
    return f"{x / MB:.1f} MB/s"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _select_heaviest(
    inp: SheddingInput, broker: int, units: np.ndarray, need: float
) -> tuple[list[Unload], str]:
    """Heaviest movable units until `need` bytes/s are marked (at least one)."""
    name = inp.brokers[broker]
    movable = [int(j) for j in units if int(j) not in inp.blocked]
    excluded = len(units) - len(movable)
    if not movable:
        return [], f"no movable unit ({_excluded(inp, units)})"
    thr = inp.unit_throughput[movable]
    order = np.argsort(-thr, kind="stable")
    chosen: list[Unload] = []
    marked = 0.0
    for k in order.tolist():
        if chosen and marked >= need:
            break
        j = movable[k]
        chosen.append(
            Unload(
                inp.unit_names[j], name, float(inp.unit_throughput[j]), float(inp.unit_msg_rate[j])
            )
        )
        marked += float(inp.unit_throughput[j])
    rest = len(movable) - len(chosen)
    note = f"chose {len(chosen)} unit(s) carrying {_mb(marked)} (need {_mb(need)})"
    if rest:
        note += f"; {rest} lighter unit(s) not needed"
    if excluded:
        note += f"; excluded {_excluded(inp, units)}"
    return chosen, note


def _excluded(inp: SheddingInput, units: np.ndarray) -> str:
    reasons: dict[str, int] = {}
    for j in units.tolist():
        why = inp.blocked.get(int(j))
        if why is not None:
            reasons[why] = reasons.get(why, 0) + 1
    return ", ".join(f"{n} {why}" for why, n in sorted(reasons.items())) or "none"


def threshold_shedder(
    inp: SheddingInput,
    cfg: PulsarConfig,
    previous: Mapping[BrokerId, float] | None = None,
) -> SheddingResult:
    """Pulsar's ThresholdShedder (see the module docstring)."""
    policy = RebalancingPolicy.THRESHOLD
    threshold = cfg.broker_threshold_shedder_percentage / 100
    min_throughput = cfg.bundle_unload_min_throughput_threshold * MB
    sample = max_usage_with_weight(inp.resources, cfg)
    usage = smoothed_usage(inp.brokers, sample, previous, cfg.history_resource_percentage)
    state = dict(zip(inp.brokers, usage.tolist(), strict=True))
    if not inp.brokers:
        return SheddingResult(policy, "no brokers", usage=state)
    avg = float(usage.mean())
    head = (
        f"avg usage {_pct(avg)} over {len(inp.brokers)} broker(s); shed above "
        f"{_pct(avg + threshold)} (avg + {_pct(threshold)})"
    )
    if avg == 0:
        return SheddingResult(policy, f"{head}: average usage is 0, nothing to do", usage=state)
    counts = inp.unit_counts
    per_broker = inp.units_of()
    unloads: list[Unload] = []
    verdicts: list[BrokerVerdict] = []
    below = 0
    for i, b in enumerate(inp.brokers):
        u = float(usage[i])
        if u < avg + threshold:
            below += 1
            continue
        fraction = u - avg - threshold + ADDITIONAL_THRESHOLD_PERCENT_MARGIN
        thr = float(inp.throughput[i])
        need = thr * fraction
        nums = (
            f"usage {_pct(u)} ≥ {_pct(avg + threshold)}; offload {_pct(fraction)} of "
            f"{_mb(thr)} = {_mb(need)}"
        )
        if need < min_throughput:
            verdicts.append(
                BrokerVerdict(b, "min-throughput", f"{nums} < minimum {_mb(min_throughput)}")
            )
        elif counts[i] == 1:
            verdicts.append(
                BrokerVerdict(b, "only-bundle", f"{nums}, but its only unit never moves")
            )
        elif counts[i] == 0:
            verdicts.append(BrokerVerdict(b, "no-bundles", f"{nums}, but it owns nothing"))
        else:
            chosen, note = _select_heaviest(inp, i, per_broker[i], need)
            unloads += chosen
            verdicts.append(
                BrokerVerdict(b, "shed" if chosen else "nothing-movable", f"{nums}; {note}")
            )
    summary = f"{head}; {below} broker(s) below it"
    if not unloads and cfg.lower_boundary_shedding_enabled:
        lb_unloads, lb_verdict = _lower_boundary(inp, cfg, usage, avg, threshold, per_broker)
        unloads += lb_unloads
        verdicts.append(lb_verdict)
    elif not unloads and not cfg.lower_boundary_shedding_enabled:
        low = [b for b, u in zip(inp.brokers, usage.tolist(), strict=True) if u < avg - threshold]
        if low:
            summary += (
                f"; {len(low)} broker(s) below {_pct(avg - threshold)} (e.g. {low[0]}) stay idle:"
                " lower_boundary_shedding_enabled is false"
            )
    return SheddingResult(policy, summary, tuple(unloads), tuple(verdicts), state)


def _lower_boundary(
    inp: SheddingInput,
    cfg: PulsarConfig,
    usage: np.ndarray,
    avg: float,
    threshold: float,
    per_broker: list[np.ndarray],
) -> tuple[list[Unload], BrokerVerdict]:
    counts = inp.unit_counts
    lower = avg - threshold
    has_low = bool((usage < lower).any())
    # The most used broker with more than one unit, above avg - threshold (ties: lowest id).
    best, best_u = -1, lower
    for i in range(len(inp.brokers)):
        if usage[i] > best_u and counts[i] > 1:
            best, best_u = i, float(usage[i])
    tag = "lower-boundary"
    if best < 0:
        return [], BrokerVerdict("-", tag, f"no broker above {_pct(lower)} has more than one unit")
    b = inp.brokers[best]
    if not has_low:
        return [], BrokerVerdict(
            b, tag, f"no broker is below {_pct(lower)} (avg − threshold); most used {_pct(best_u)}"
        )
    thr = float(inp.throughput[best])
    need = thr * threshold * LOWER_BOUNDARY_THRESHOLD_MARGIN
    min_throughput = cfg.bundle_unload_min_throughput_threshold * MB
    nums = (
        f"a broker is below {_pct(lower)}; most used {_pct(best_u)} offloads "
        f"{_pct(threshold * LOWER_BOUNDARY_THRESHOLD_MARGIN)} of {_mb(thr)} = {_mb(need)}"
    )
    if need < min_throughput:
        return [], BrokerVerdict(b, tag, f"{nums} < minimum {_mb(min_throughput)}")
    chosen, note = _select_heaviest(inp, best, per_broker[best], need)
    return chosen, BrokerVerdict(b, tag, f"{nums}; {note}")


def overload_shedder(inp: SheddingInput, cfg: PulsarConfig) -> SheddingResult:
    """Pulsar's OverloadShedder (see the module docstring)."""
    policy = RebalancingPolicy.OVERLOAD
    limit = cfg.broker_overloaded_threshold_percentage / 100
    usage = max_usage(inp.resources)
    counts = inp.unit_counts
    per_broker = inp.units_of()
    unloads: list[Unload] = []
    verdicts: list[BrokerVerdict] = []
    for i, b in enumerate(inp.brokers):
        u = float(usage[i])
        if u < limit:
            continue
        fraction = u - limit + ADDITIONAL_THRESHOLD_PERCENT_MARGIN
        thr = float(inp.throughput[i])
        need = thr * fraction
        nums = (
            f"max(cpu, direct mem, bw in, bw out) {_pct(u)} ≥ {_pct(limit)}; offload "
            f"{_pct(u)} − {_pct(limit)} + 5% = {_pct(fraction)} of {_mb(thr)} = {_mb(need)}"
        )
        if counts[i] == 1:
            verdicts.append(
                BrokerVerdict(b, "only-bundle", f"{nums}, but its only unit never moves")
            )
        elif counts[i] == 0:
            verdicts.append(BrokerVerdict(b, "no-bundles", f"{nums}, but it owns nothing"))
        else:
            chosen, note = _select_heaviest(inp, i, per_broker[i], need)
            unloads += chosen
            verdicts.append(
                BrokerVerdict(b, "shed" if chosen else "nothing-movable", f"{nums}; {note}")
            )
    over = len(verdicts)
    summary = (
        f"{over} of {len(inp.brokers)} broker(s) at or above the overload threshold {_pct(limit)}"
    )
    if not over and len(inp.brokers):
        top = int(np.argmax(usage)) if usage.size else 0
        summary += f" (highest: {inp.brokers[top]} at {_pct(float(usage[top]))})"
    return SheddingResult(policy, summary, tuple(unloads), tuple(verdicts))


def uniform_shedder(inp: SheddingInput, cfg: PulsarConfig) -> SheddingResult:
    """Pulsar's UniformLoadShedder (see the module docstring)."""
    policy = RebalancingPolicy.UNIFORM
    if not inp.brokers:
        return SheddingResult(policy, "no brokers")
    rates = np.asarray(inp.msg_rate, dtype=float)
    thrs = np.asarray(inp.throughput, dtype=float)
    # argmax/argmin return the first (lowest id) among equals.
    r_max, r_min = int(np.argmax(rates)), int(np.argmin(rates))
    t_max, t_min = int(np.argmax(thrs)), int(np.argmin(thrs))
    max_rate, min_rate = float(rates[r_max]), float(rates[r_min])
    max_thr, min_thr = float(thrs[t_max]), float(thrs[t_min])
    min_rate_d = 1.0 if abs(min_rate) <= EPS else min_rate
    min_thr_d = 1.0 if abs(min_thr) <= EPS else min_thr
    rate_gap_pct = (max_rate - min_rate_d) * 100 / min_rate_d
    thr_ratio = max_thr / min_thr_d
    rate_limit = cfg.msg_rate_difference_shedder_threshold
    thr_limit = cfg.msg_throughput_multiplier_difference_shedder_threshold
    rate_hit = rate_limit > 0 and rate_gap_pct > rate_limit
    thr_hit = thr_limit > 0 and thr_ratio > thr_limit
    head = (
        f"msg rate {inp.brokers[r_max]} {max_rate:.0f}/s vs {inp.brokers[r_min]} "
        f"{min_rate:.0f}/s: gap {rate_gap_pct:.0f}% (limit {rate_limit:.0f}%); throughput "
        f"{inp.brokers[t_max]} {_mb(max_thr)} vs {inp.brokers[t_min]} {_mb(min_thr)}: "
        f"ratio {thr_ratio:.2f}× (limit {thr_limit:.2f}×)"
    )
    if not (rate_hit or thr_hit):
        return SheddingResult(policy, f"{head}: within both limits")
    per_broker = inp.units_of()
    counts = inp.unit_counts
    if rate_hit:
        src, metric = r_max, inp.unit_msg_rate
        need = (max_rate - min_rate_d) * cfg.max_unload_percentage
        floor, unit = cfg.min_unload_message, "msg/s"
        label = f"move {_pct(cfg.max_unload_percentage)} of the msg-rate gap = {need:.0f} msg/s"
    else:
        src, metric = t_max, inp.unit_throughput
        need = (max_thr - min_thr_d) * cfg.max_unload_percentage
        floor, unit = cfg.min_unload_message_throughput, "bytes/s"
        label = f"move {_pct(cfg.max_unload_percentage)} of the throughput gap = {_mb(need)}"
    b = inp.brokers[src]
    if need < floor:
        v = BrokerVerdict(b, "min-unload", f"{label} < minimum {floor:.0f} {unit}")
        return SheddingResult(policy, head, (), (v,))
    if counts[src] <= 1:
        v = BrokerVerdict(b, "only-bundle", f"{label}, but it has {counts[src]} unit(s)")
        return SheddingResult(policy, head, (), (v,))
    units = per_broker[src]
    movable = [int(j) for j in units.tolist() if int(j) not in inp.blocked]
    order = sorted(movable, key=lambda j: -float(metric[j]))
    limit_n = cfg.max_unload_bundle_num_per_shedding
    chosen: list[Unload] = []
    too_big = idle = 0
    left = need
    for j in order:
        if limit_n != -1 and len(chosen) >= limit_n:
            break
        value = float(metric[j])
        if value <= 0:
            idle += 1  # an idle unit moves no load
            continue
        if value <= left + UNIFORM_SLACK:
            left -= value
            chosen.append(
                Unload(
                    inp.unit_names[j], b, float(inp.unit_throughput[j]), float(inp.unit_msg_rate[j])
                )
            )
        else:
            too_big += 1
    notes = [f"{label}; chose {len(chosen)} unit(s)"]
    if too_big:
        notes.append(f"{too_big} larger than what was still needed + {UNIFORM_SLACK:.0f}")
    if idle:
        notes.append(f"{idle} idle")
    if len(movable) < len(units):
        notes.append(f"excluded {_excluded(inp, units)}")
    v = BrokerVerdict(b, "shed" if chosen else "nothing-fits", "; ".join(notes))
    return SheddingResult(policy, head, tuple(chosen), (v,))


def run_shedder(
    policy: RebalancingPolicy,
    inp: SheddingInput,
    cfg: PulsarConfig,
    previous: Mapping[BrokerId, float] | None = None,
) -> SheddingResult:
    """Dispatch on the policy name (danube is not a shedder)."""
    if policy is RebalancingPolicy.THRESHOLD:
        return threshold_shedder(inp, cfg, previous)
    if policy is RebalancingPolicy.OVERLOAD:
        return overload_shedder(inp, cfg)
    if policy is RebalancingPolicy.UNIFORM:
        return uniform_shedder(inp, cfg)
    raise ValueError(f"policy {policy.value!r} is not a Pulsar shedder")
