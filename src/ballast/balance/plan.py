"""A multi-move rebalance plan toward `target_cv` with as few moves as possible.

Offline counterpart of the one-move-per-cycle loop, for operators and the data pipeline:
the rate limit and the global cooldown do not apply (an operator applies the plan), but
every rule about *which* topic may move (blacklist, age, recent moves, active brokers) and
the no-regret rule do. Each topic moves at most once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ballast.balance.history import MoveHistory
from ballast.balance.imbalance import Imbalance, measure
from ballast.balance.rebalance import active_scores, find_move
from ballast.config import RebalancingConfig, Strategy
from ballast.model import ClusterSnapshot, Move


@dataclass(frozen=True)
class RebalancePlan:
    moves: tuple[Move, ...]
    before: Imbalance
    after: Imbalance
    reason: str
    strategy: Strategy
    target_cv: float

    def to_dict(self) -> dict[str, object]:
        return {
            "version": 1,
            "strategy": self.strategy.value,
            "target_cv": self.target_cv,
            "reason": self.reason,
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
) -> RebalancePlan:
    """Greedy plan: each step takes the move with the largest imbalance reduction."""
    history = history or MoveHistory()
    before = measure(active_scores(snapshot, strategy))
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
