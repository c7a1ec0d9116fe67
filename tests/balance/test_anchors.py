"""The reference document's worked example and Danube's own test anchors."""

from __future__ import annotations

import pytest

from ballast.balance import decide_rebalance, measure, rank, score_brokers
from ballast.balance.history import MoveHistory
from ballast.config import RebalancingConfig, Strategy, parse_config

from .helpers import counts, snapshot_of


def test_document_worked_example() -> None:
    stats = measure({"1": 45.0, "2": 30.0, "3": 25.0})
    assert stats.mean == pytest.approx(33.333, abs=1e-3)
    assert stats.std == pytest.approx(8.498, abs=1e-3)
    assert stats.cv == pytest.approx(0.255, abs=1e-3)
    assert stats.overloaded == ("1",)
    assert stats.underloaded == ()
    assert stats.normal == ("2", "3")


def test_balanced_single_broker_anchor() -> None:
    scores = score_brokers(snapshot_of({"b1": (50, 30, 10)}), Strategy.BALANCED)
    assert scores["b1"] == pytest.approx(28.6)
    assert int(scores["b1"]) == 28  # what Danube reports after truncation


def test_balanced_three_brokers_order_and_values() -> None:
    snap = snapshot_of({"broker1": (50, 30, 10), "broker2": (20, 20, 5), "broker3": (10, 10, 2)})
    ranking = rank(snap, Strategy.BALANCED)
    assert ranking.brokers() == ("broker3", "broker2", "broker1")
    values = [s for _, s in ranking.entries]
    assert values == pytest.approx([7.12, 14.3, 28.6])
    assert [int(v) for v in values] == [7, 14, 28]


def test_identical_brokers_score_equally() -> None:
    snap = snapshot_of({b: (10, 10, 5) for b in ("a", "b", "c")})
    assert list(score_brokers(snap, Strategy.BALANCED).values()) == pytest.approx([7.3] * 3)


def test_balanced_falls_back_to_topic_count_without_resources() -> None:
    snap = snapshot_of({"a": (0, 0, 4), "b": (0, 0, 9)})
    assert score_brokers(snap, Strategy.BALANCED) == {"a": 4.0, "b": 9.0}


def test_cv_anchor_5_10_20() -> None:
    stats = measure({"1": 5, "2": 10, "3": 20})
    assert stats.mean == pytest.approx(11.67, abs=0.01)
    assert stats.cv > 0.20


def test_overloaded_anchor_5_10_30() -> None:
    assert measure({"1": 5, "2": 10, "3": 30}).overloaded == ("3",)


def test_cv_is_zero_for_one_broker_or_zero_mean() -> None:
    assert measure({"a": 10}).cv == 0.0
    assert measure({"a": 0, "b": 0}).cv == 0.0


def _config(**rebalancing: object) -> RebalancingConfig:
    data = {"enabled": True, "min_topic_age_seconds": 0, "cooldown_seconds": 0, **rebalancing}
    return parse_config({"load_manager": {"rebalancing": data}}).load_manager.rebalancing


def test_disabled_means_no_move_even_at_high_cv() -> None:
    snap = counts({"a": 30, "b": 10})  # CV 0.50
    assert measure({"a": 30, "b": 10}).cv == pytest.approx(0.5)
    d = decide_rebalance(snap, MoveHistory(), 0.0, _config(enabled=False), Strategy.FAIR)
    assert d.move is None and d.rule == "disabled"
    assert "disabled" in d.explanation


@pytest.mark.parametrize(
    ("loads", "moves"),
    [((125, 75), False), ((135, 65), True)],  # CV 0.25 and 0.35 under "balanced" (30 %)
)
def test_balanced_threshold(loads: tuple[int, int], moves: bool) -> None:
    a, b = loads
    assert measure({"a": a, "b": b}).cv == pytest.approx((a - b) / (a + b))
    d = decide_rebalance(counts({"a": a, "b": b}), MoveHistory(), 0.0, _config(), Strategy.FAIR)
    assert (d.move is not None) == moves
    assert d.rule == ("move" if moves else "balanced")
