from __future__ import annotations

import pytest

from ballast.balance import MoveHistory, decide_rebalance, plan_rebalance
from ballast.balance.candidates import is_blacklisted
from ballast.config import RebalancingConfig, Strategy, parse_config
from ballast.model import ClusterSnapshot, Move

from .helpers import counts, idle_topics


def cfg(**over: object) -> RebalancingConfig:
    data = {"enabled": True, "min_topic_age_seconds": 0, "cooldown_seconds": 0, **over}
    return parse_config({"load_manager": {"rebalancing": data}}).load_manager.rebalancing


def test_too_few_brokers() -> None:
    d = decide_rebalance(counts({"a": 10}), MoveHistory(), 0, cfg(), Strategy.FAIR)
    assert d.rule == "too-few-brokers" and d.move is None


def test_scale_out_first_move_uses_fallback_sources() -> None:
    snap = counts({"b1": 100, "b2": 100, "b3": 100, "b4": 0, "b5": 0})
    d = decide_rebalance(snap, MoveHistory(), 0, cfg(), Strategy.FAIR)
    assert d.rule == "move" and d.move is not None
    assert d.move.from_broker == "b1" and d.move.to_broker == "b4"
    assert d.move.topic == sorted(snap.topics_of("b1"))[0]
    assert d.episode
    assert d.after is not None and len(d.after.topics_of("b4")) == 1


def test_rate_limit_counts_moves_in_the_last_hour() -> None:
    snap = counts({"a": 100, "b": 0})
    history = MoveHistory.of(
        Move(f"/default/x{i}", "a", "b", timestamp=1000.0 + i * 60) for i in range(10)
    )
    d = decide_rebalance(snap, history, 1600.0, cfg(max_moves_per_hour=10), Strategy.FAIR)
    assert d.rule == "rate-limit" and d.episode
    assert "10 moves in the last hour (max 10)" in d.reason
    assert "next slot in 50m00s" in d.reason  # the oldest move leaves the window at 4600
    d = decide_rebalance(snap, history, 4600.5, cfg(max_moves_per_hour=10), Strategy.FAIR)
    assert d.rule == "move"


def test_global_cooldown_between_moves() -> None:
    snap = counts({"a": 100, "b": 0})
    history = MoveHistory.of([Move("/default/x", "a", "b", timestamp=100.0)])
    d = decide_rebalance(snap, history, 130.0, cfg(cooldown_seconds=60), Strategy.FAIR)
    assert d.rule == "cooldown" and "30s left" in d.reason
    assert decide_rebalance(snap, history, 161.0, cfg(cooldown_seconds=60), Strategy.FAIR).move


def test_blacklist_globs() -> None:
    patterns = ("/system/*", "/default/critical-*", "/analytics/logs")
    assert is_blacklisted("/system/x", patterns)
    assert is_blacklisted("/default/critical-orders", patterns)
    assert is_blacklisted("/analytics/logs", patterns)
    assert not is_blacklisted("/analytics/logs2", patterns)
    assert not is_blacklisted("/default/orders", patterns)


def test_blacklisted_and_young_topics_never_move_and_reason_says_why() -> None:
    snap = ClusterSnapshot(
        ("a", "b"),
        assignments={"a": ("/system/one", "/default/young"), "b": ()},
        topic_created={"/default/young": 990.0},
    )
    c = cfg(blacklist_topics=["/system/*"], min_topic_age_seconds=300)
    d = decide_rebalance(snap, MoveHistory(), 1000.0, c, Strategy.FAIR)
    assert d.move is None and d.rule == "no-useful-move"
    assert "1 blacklisted" in d.reason and "1 too young" in d.reason


def test_no_regret_rule_refuses_a_move_that_does_not_help() -> None:
    # a: 1 topic, b: 0 topics → moving it just swaps the imbalance.
    snap = ClusterSnapshot(("a", "b"), assignments={"a": ("/default/only",), "b": ()})
    d = decide_rebalance(snap, MoveHistory(), 0, cfg(min_imbalance=0), Strategy.FAIR)
    assert d.move is None and "[no-regret]" in d.reason


def test_hysteresis_continues_below_threshold_until_target() -> None:
    snap = counts({"a": 70, "b": 50})  # CV 0.167: below 0.30 but above target 0.10
    d = decide_rebalance(snap, MoveHistory(), 0, cfg(), Strategy.FAIR, episode=False)
    assert d.rule == "balanced" and d.move is None
    d = decide_rebalance(snap, MoveHistory(), 0, cfg(), Strategy.FAIR, episode=True)
    assert d.rule == "move" and d.episode
    done = counts({"a": 62, "b": 58})
    d = decide_rebalance(done, MoveHistory(), 0, cfg(), Strategy.FAIR, episode=True)
    assert d.rule == "balanced" and not d.episode


def test_plan_reaches_target_with_minimum_moves() -> None:
    snap = counts({"b1": 100, "b2": 100, "b3": 100, "b4": 0, "b5": 0})
    plan = plan_rebalance(snap, cfg(target_cv=0.01), Strategy.FAIR, now=0)
    assert plan.after.cv < 0.01
    assert len(plan.moves) == 120  # Σ max(0, 100 − 60) over the three old brokers
    assert len({m.topic for m in plan.moves}) == len(plan.moves)
    data = plan.to_dict()
    assert data["moves"][0]["reason"] == "Plan" and data["before"]["cv"] == pytest.approx(
        0.8165, abs=1e-4
    )


def test_plan_respects_max_moves_and_inactive_brokers() -> None:
    snap = counts({"a": 50, "b": 0})
    plan = plan_rebalance(snap, cfg(), Strategy.FAIR, now=0, max_moves=3)
    assert len(plan.moves) == 3 and "move limit" in plan.reason


def test_weighted_load_moves_reduce_imbalance() -> None:
    from ballast.balance.rebalance import active_scores
    from ballast.model import LoadReport, TopicLoad

    topics_a = tuple(TopicLoad(t, byte_rate=3e6, producers=1) for t in idle_topics("a", 30))
    reports = {"a": LoadReport("a", 0, 90, 70, topics=topics_a), "b": LoadReport("b", 0, 5, 10)}
    snap = ClusterSnapshot(
        ("a", "b"), reports=reports, assignments={"a": tuple(t.topic for t in topics_a)}
    )
    d = decide_rebalance(snap, MoveHistory(), 0, cfg(), Strategy.WEIGHTED_LOAD)
    assert d.move is not None and d.after is not None
    before = active_scores(snap, Strategy.WEIGHTED_LOAD)
    after = active_scores(d.after, Strategy.WEIGHTED_LOAD)
    assert abs(after["a"] - after["b"]) < abs(before["a"] - before["b"])
