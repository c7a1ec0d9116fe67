"""A multi-move rebalance plan toward `target_cv` with as few moves as possible.

Offline counterpart of the one-move-per-cycle loop, for operators and the data pipeline:
the rate limit and the global cooldown do not apply (an operator applies the plan), but
every rule about *which* topic may move (blacklist, age, recent moves, active brokers) and
the no-regret rule do. Each topic moves at most once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ballast.balance.estimate import apply_move
from ballast.balance.history import MoveHistory
from ballast.balance.imbalance import Imbalance, measure
from ballast.balance.pulsar.policy import shed
from ballast.balance.rebalance import active_scores, find_move
from ballast.config import PulsarConfig, RebalancingConfig, RebalancingPolicy, Strategy
from ballast.model import ClusterSnapshot, Move


@dataclass(frozen=True)
class RebalancePlan:
    moves: tuple[Move, ...]
    before: Imbalance
    after: Imbalance
    reason: str
    strategy: Strategy
    target_cv: float
    details: tuple[str, ...] = ()  # a shedder's per-broker explanations (Pulsar policies)

    def to_dict(self) -> dict[str, object]:
        return {
            "version": 1,
            "strategy": self.strategy.value,
            "target_cv": self.target_cv,
            "reason": self.reason,
            "details": list(self.details),
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "moves": [m.to_dict() for m in self.moves],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def plan_rebalance(
    snapshot: ClusterSnapshot,
    config: RebalancingConfig,
    strategy: Strategy,
    now: float,
    max_moves: int | None = None,
    history: MoveHistory | None = None,
    *,
    pulsar: PulsarConfig | None = None,
) -> RebalancePlan:
    """Greedy plan: each step takes the move with the largest imbalance reduction.

    Under one of Pulsar's shedders (`config.policy`), the plan is the shedder's decision
    now: its moves (up to `max_moves`) and, in `details`, why each broker sheds or not."""
    history = history or MoveHistory()
    before = measure(active_scores(snapshot, strategy))
    if config.policy is not RebalancingPolicy.DANUBE:
        return _shedding_plan(snapshot, config, strategy, now, max_moves, history, pulsar, before)
    limit = (
        max_moves if max_moves is not None else sum(len(t) for t in snapshot.assignments.values())
    )
    moves: list[Move] = []
    moved: set[str] = set()
    stats = before
    reason = ""
    while True:
        if stats.cv < config.target_cv:
            reason = f"CV {stats.cv:.1%} is below target_cv {config.target_cv:.0%}"
            break
        if len(moves) >= limit:
            reason = f"reached the move limit ({limit})"
            break
        found = find_move(snapshot, history, now, config, strategy, "largest_gain", moved, "Plan")
        if found.move is None or found.after is None:
            reason = f"no useful move left: {found.reason}"
            break
        moves.append(found.move)
        moved.add(found.move.topic)
        snapshot = found.after
        stats = measure(active_scores(snapshot, strategy))
    return RebalancePlan(tuple(moves), before, stats, reason, strategy, config.target_cv)


def _shedding_plan(
    snapshot: ClusterSnapshot,
    config: RebalancingConfig,
    strategy: Strategy,
    now: float,
    max_moves: int | None,
    history: MoveHistory,
    pulsar: PulsarConfig | None,
    before: Imbalance,
) -> RebalancePlan:
    out = shed(snapshot, history, now, config, strategy, pulsar)
    moves = out.moves if max_moves is None else out.moves[:max_moves]
    after = snapshot
    for m in moves:
        after = apply_move(after, m.topic, m.from_broker, m.to_broker)
    res = out.result
    reason = f"[{res.shedder.value}] {res.summary}"
    if max_moves is not None and len(out.moves) > max_moves:
        reason += f"; limited to {max_moves} of {len(out.moves)} move(s)"
    details = tuple(v.line() for v in res.verdicts) + out.notes
    return RebalancePlan(
        tuple(moves),
        before,
        measure(active_scores(after, strategy)),
        reason,
        strategy,
        config.target_cv,
        details,
    )
