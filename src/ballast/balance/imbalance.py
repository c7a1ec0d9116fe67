"""Imbalance statistics and the overloaded / underloaded / normal classification."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ballast.balance.scoring import cluster_stats
from ballast.model import PYTHON_OPS, BrokerId, Ops

OVERLOADED, UNDERLOADED, NORMAL = "overloaded", "underloaded", "normal"


def classify(score: Any, mean: Any, std: Any, ops: Ops = PYTHON_OPS) -> Any:
    """The reference document's classification of one score against its cluster:
    overloaded above mean + std, underloaded below mean - std *and* below half the mean,
    normal otherwise. Works on floats, NumPy arrays and Spark columns (through `ops`)."""
    return ops.where(
        score > mean + std,
        OVERLOADED,
        ops.where((score < mean - std) & (score < mean * 0.5), UNDERLOADED, NORMAL),
    )


@dataclass(frozen=True)
class Imbalance:
    """Balance of the active brokers' scores.

    overloaded: score > mean + std; underloaded: score < mean - std and < mean / 2
    (the reference document's rules); everything else is normal.
    """

    mean: float
    std: float
    cv: float
    min: float
    max: float
    overloaded: tuple[BrokerId, ...] = ()
    underloaded: tuple[BrokerId, ...] = ()
    normal: tuple[BrokerId, ...] = ()
    scores: Mapping[BrokerId, float] = field(default_factory=dict)

    def classification(self, broker: BrokerId) -> str:
        if broker in self.overloaded:
            return "overloaded"
        if broker in self.underloaded:
            return "underloaded"
        return "normal"

    def to_dict(self) -> dict[str, object]:
        return {
            "cv": self.cv,
            "mean": self.mean,
            "std": self.std,
            "min": self.min,
            "max": self.max,
            "brokers": [
                {"broker_id": b, "score": s, "class": self.classification(b)}
                for b, s in sorted(self.scores.items())
            ],
        }


def measure(scores: Mapping[BrokerId, float]) -> Imbalance:
    """Statistics and classification of `scores` (pass only the active brokers)."""
    if not scores:
        return Imbalance(0.0, 0.0, 0.0, 0.0, 0.0)
    values = np.fromiter(scores.values(), dtype=float, count=len(scores))
    mean, std, cv = cluster_stats(values)
    classes: dict[str, list[BrokerId]] = {OVERLOADED: [], UNDERLOADED: [], NORMAL: []}
    for broker in sorted(scores):
        classes[classify(scores[broker], mean, std)].append(broker)
    over, under, normal = classes[OVERLOADED], classes[UNDERLOADED], classes[NORMAL]
    return Imbalance(
        mean=mean,
        std=std,
        cv=cv,
        min=float(values.min()),
        max=float(values.max()),
        overloaded=tuple(over),
        underloaded=tuple(under),
        normal=tuple(normal),
        scores=dict(scores),
    )


def sum_squared_deviations(values: Mapping[BrokerId, float]) -> float:
    """Σ (score − mean)²: a move is useful only if it lowers this."""
    arr = np.fromiter(values.values(), dtype=float, count=len(values))
    return float(((arr - arr.mean()) ** 2).sum()) if arr.size else 0.0
