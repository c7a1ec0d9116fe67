"""Cluster-wide targets for the Kafka replica planner: how many replicas and leaders of each
topic every broker should hold.

Targets come from exact integer shares: a topic's replicas are shared among racks in
proportion to their brokers (no rack holding more than anti-affinity lets it), a rack's
share among its brokers evenly, and a topic's leaderships among the brokers holding its
replicas (a broker never leads more partitions than it holds: KAFKA-19048's "light
brokers"). A share is a whole part plus a remainder; the remainders of a topic add up to
a few *extra* units, and which bin (rack or broker) gets each extra is the only choice
left. KAFKA-19048 makes it per topic, so ties fall on the same brokers topic after topic
and the cluster totals drift apart. Here the extras of all topics are spread together:
every bin gets a cluster-wide quota (its expected extras, rounded), and each topic gives
its extras first to bins that must take them to meet their quota, then to bins that
already hold more than the whole part (keeping a replica where it is costs no move),
then to the bins with the most quota left. So every broker's total ends within one of
its fair share while each topic stays balanced, with the fewest moves the choice allows.

Everything here is pure integer arithmetic on NumPy arrays; ties break by bin index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]

# Float sums of exact fractions may land a hair below an integer; this keeps floor() honest.
_EPS = 1e-9


@dataclass(frozen=True, eq=False)
class Shares:
    """One topic's exact shares over some bins: whole parts plus remainders.

    Bin j's share is `whole[j] + remainder[j] / denominator`; `extra` is how many bins
    get one more than their whole part (the remainders sum to `extra * denominator`).
    """

    whole: IntArray
    remainder: IntArray
    denominator: int
    extra: int


def water_fill(total: int, weights: IntArray, caps: IntArray) -> Shares:
    """Share `total` in proportion to `weights`, no bin above its cap (exactly, in integers).

    A bin whose proportional share reaches its cap gets the cap; the rest is shared again
    among the others, until no share exceeds its cap. Raises ValueError when the caps
    cannot hold `total` (the caller validates inputs first, so this is a bug guard).
    """
    weights = np.asarray(weights, dtype=np.int64)
    caps = np.asarray(caps, dtype=np.int64)
    whole = np.zeros(len(weights), dtype=np.int64)
    remainder = np.zeros(len(weights), dtype=np.int64)
    active = (weights > 0) & (caps > 0)
    remaining = int(total)
    if remaining > int(caps[active].sum()):
        raise ValueError(f"cannot share {total} among bins holding at most {caps[active].sum()}")
    denominator = 1
    while remaining > 0:
        w = weights[active]
        total_weight = int(w.sum())
        # A bin is capped when remaining·w / W ≥ cap, i.e. remaining·w ≥ cap·W.
        capped = active & (remaining * weights >= caps * total_weight)
        if not capped.any():
            numerators = remaining * weights[active]
            whole[active] = numerators // total_weight
            remainder[active] = numerators % total_weight
            denominator = total_weight
            break
        whole[capped] = caps[capped]
        remaining -= int(caps[capped].sum())
        active &= ~capped
    extra = int(total) - int(whole.sum())
    return Shares(whole, remainder, denominator, extra)


def cluster_quotas(
    shares: Sequence[Shares], current: IntArray, ideal: npt.NDArray[np.float64] | None = None
) -> IntArray:
    """How many extras each bin takes over all topics.

    A bin expects the sum of its fractional shares, or, given `ideal` (the total it
    should end with), what its whole parts leave to reach it, within what its eligible
    topics allow. Every bin gets the floor; the units left (or over) go one by one to
    bins whose current total exceeds what they would otherwise get (fewer moves), then to
    the largest fractions, then by index.
    """
    bins = len(current)
    if not shares:
        return np.zeros(bins, dtype=np.int64)
    fractions = np.zeros(bins, dtype=np.float64)
    wholes = np.zeros(bins, dtype=np.int64)
    eligible = np.zeros(bins, dtype=np.int64)
    extras = 0
    for s in shares:
        if s.extra:
            fractions += s.remainder / s.denominator
            eligible += s.remainder > 0
        wholes += s.whole
        extras += s.extra
    expected = fractions if ideal is None else np.clip(ideal - wholes, 0, eligible)
    quota = np.minimum(np.floor(expected + _EPS).astype(np.int64), eligible)
    fraction = expected - np.floor(expected + _EPS)
    left = extras - int(quota.sum())
    while left > 0:
        room = np.flatnonzero(quota < eligible)
        useful = current[room] > wholes[room] + quota[room]
        order = np.lexsort((room, -fraction[room], ~useful))
        chosen = room[order[:left]]
        quota[chosen] += 1
        fraction[chosen] = 0.0
        left -= len(chosen)
    while left < 0:
        room = np.flatnonzero(quota > 0)
        spare = current[room] < wholes[room] + quota[room]
        order = np.lexsort((room, fraction[room], ~spare))
        chosen = room[order[:-left]]
        quota[chosen] -= 1
        fraction[chosen] = 1.0
        left += len(chosen)
    return quota


def _already_balanced(
    shares: Sequence[Shares],
    current: Sequence[IntArray],
    ideal: npt.NDArray[np.float64] | None,
) -> bool:
    """Is `current` itself a valid choice of extras, per topic and cluster-wide?"""
    bins = len(shares[0].whole)
    fractions = np.zeros(bins, dtype=np.float64)
    wholes = np.zeros(bins, dtype=np.int64)
    eligible = np.zeros(bins, dtype=np.int64)
    taken = np.zeros(bins, dtype=np.int64)
    for s, cur in zip(shares, current, strict=True):
        extra = cur - s.whole
        if (extra < 0).any() or (extra > (s.remainder > 0)).any() or extra.sum() != s.extra:
            return False
        if s.extra:
            fractions += s.remainder / s.denominator
            eligible += s.remainder > 0
        wholes += s.whole
        taken += extra
    expected = fractions if ideal is None else np.clip(ideal - wholes, 0, eligible)
    low = np.floor(expected + _EPS)
    high = np.ceil(expected - _EPS)
    return bool(((taken >= low) & (taken <= high)).all())


def spread_extras(
    shares: Sequence[Shares],
    current: Sequence[IntArray],
    ideal: npt.NDArray[np.float64] | None = None,
) -> list[IntArray]:
    """Integer targets for each topic: whole parts plus the extras spread over the cluster.

    `shares[t]` and `current[t]` cover the same bins for every topic t (current: what the
    bins hold now). Topics are taken fewest-choices first; each gives its extras to eligible
    bins (a non-zero remainder). `ideal`, when given, is the total each bin should end
    with over all topics (see `cluster_quotas`). A bin is *useful* in a topic when it
    holds more than the whole part there (an extra keeps a replica in place); its *slack*
    is its quota left minus the useful topics left. The ranking, so that no broker both
    gains and loses:

    1. forced: quota left ≥ eligible topics left (it must take one in each);
    2. useful with slack ≥ 0 (it can keep every useful replica: do not make it lose one);
    3. not useful with slack > 0 (it must receive somewhere anyway);
    4. useful with quota left (it loses elsewhere instead);
    5. any quota left; 6. the rest — then slack, quota left per topic left, remainder, index.
    """
    if not shares:
        return []
    bins = len(shares[0].whole)
    total_current = np.zeros(bins, dtype=np.int64)
    for c in current:
        total_current += c
    if _already_balanced(shares, current, ideal):
        # Every topic already within its shares and every bin within one of its expected
        # total: nothing to choose, and a plan's own result is planned again unchanged.
        return [c.copy() for c in current]
    quota = cluster_quotas(shares, total_current, ideal)
    eligible_left = np.zeros(bins, dtype=np.int64)
    useful_left = np.zeros(bins, dtype=np.int64)
    for s, cur in zip(shares, current, strict=True):
        if s.extra:
            eligible = s.remainder > 0
            eligible_left += eligible
            useful_left += eligible & (cur > s.whole)
    targets: list[IntArray] = [s.whole.copy() for s in shares]
    # Most constrained topics first (fewest bins that may take an extra): a topic with
    # a choice of many bins is served last, from whatever quota is left.
    choice = [int((s.remainder > 0).sum()) for s in shares]
    for t in sorted(range(len(shares)), key=lambda t: (choice[t], t)):
        s, cur, target = shares[t], current[t], targets[t]
        if s.extra:
            idx = np.flatnonzero(s.remainder > 0)
            left = quota[idx]
            can = eligible_left[idx]
            useful = cur[idx] > s.whole[idx]
            slack = left - useful_left[idx]
            rank = np.full(len(idx), 5, dtype=np.int64)
            rank[left > 0] = 4
            rank[useful & (left > 0)] = 3
            rank[~useful & (slack > 0)] = 2
            rank[useful & (slack >= 0) & (left > 0)] = 1
            rank[left >= can] = 0
            order = np.lexsort((idx, -s.remainder[idx], -(left / can), -slack, rank))
            chosen = idx[order[: s.extra]]
            target[chosen] += 1
            quota[chosen] -= 1
            eligible_left[idx] -= 1
            useful_left[idx[useful]] -= 1
    return targets
