"""The decision core: pure functions from a cluster snapshot to decisions. No I/O here."""

from ballast.balance.history import MoveHistory
from ballast.balance.imbalance import Imbalance, measure
from ballast.balance.placement import (
    Placement,
    PlacementPlan,
    place_topics,
    plan_drain,
    plan_failover,
    select_broker,
)
from ballast.balance.plan import RebalancePlan, plan_rebalance
from ballast.balance.rankings import Rankings, rank, score_brokers
from ballast.balance.rebalance import Decision, decide_rebalance

__all__ = [
    "Decision",
    "Imbalance",
    "MoveHistory",
    "Placement",
    "PlacementPlan",
    "Rankings",
    "RebalancePlan",
    "decide_rebalance",
    "measure",
    "place_topics",
    "plan_drain",
    "plan_failover",
    "plan_rebalance",
    "rank",
    "score_brokers",
    "select_broker",
]
