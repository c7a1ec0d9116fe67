from __future__ import annotations

from collections import Counter

from ballast.balance import place_topics, plan_drain, plan_failover, select_broker
from ballast.config import Strategy
from ballast.model import (
    BrokerMode,
    BrokerState,
    ClusterSnapshot,
    LoadReport,
    MarkerReason,
    TopicLoad,
    UnassignedMarker,
)

from .helpers import counts, idle_topics


def test_round_robin_among_brokers_within_ten_percent() -> None:
    snap = counts({"a": 10, "b": 10, "c": 11, "d": 20})  # band: <= 11
    p = select_broker(snap, Strategy.FAIR)
    assert p.candidates == ("a", "b", "c")
    assert p.broker == "a"
    assert select_broker(snap, Strategy.FAIR, last_chosen="a").broker == "b"
    assert select_broker(snap, Strategy.FAIR, last_chosen="c").broker == "a"  # wraps
    assert "[score]" in p.rejected["d"]


def test_hint_honoured_only_when_active() -> None:
    snap = counts({"a": 0, "b": 50})
    hinted = UnassignedMarker(MarkerReason.REBALANCE, from_broker="a", to_broker="b")
    assert select_broker(snap, Strategy.FAIR, hinted).broker == "b"
    draining = ClusterSnapshot(
        snap.brokers, assignments=snap.assignments, states={"b": BrokerState(BrokerMode.DRAINING)}
    )
    hinted = UnassignedMarker(MarkerReason.REBALANCE, to_broker="b")
    p = select_broker(draining, Strategy.FAIR, hinted)
    assert p.broker == "a"
    assert "draining" in p.rejected["b"]


def test_unload_excludes_the_source_even_when_least_loaded() -> None:
    snap = counts({"a": 0, "b": 5, "c": 6})
    p = select_broker(snap, Strategy.FAIR, UnassignedMarker(MarkerReason.UNLOAD, from_broker="a"))
    assert p.broker == "b"
    assert "[source]" in p.rejected["a"]


def test_no_active_broker_is_a_value_not_an_exception() -> None:
    snap = ClusterSnapshot(("a",), states={"a": BrokerState(BrokerMode.DRAINED, "maintenance")})
    p = select_broker(snap, Strategy.FAIR)
    assert p.broker is None and "[no-broker]" in p.reason


def test_burst_spreads_through_placeholders() -> None:
    snap = counts({"a": 0, "b": 0, "c": 0})
    topics = [(f"/default/new-{i}", None) for i in range(999)]
    plan = place_topics(snap, Strategy.BALANCED, topics)
    per_broker = Counter(p.broker for _, p in plan.placements)
    assert per_broker == {"a": 333, "b": 333, "c": 333}


def test_burst_with_resources_goes_to_idle_broker_first() -> None:
    reports = {"a": LoadReport("a", 0, 80, 80), "b": LoadReport("b", 0, 5, 5)}
    snap = ClusterSnapshot(("a", "b"), reports=reports)
    plan = place_topics(snap, Strategy.BALANCED, [("/d/x", None), ("/d/y", None)])
    assert [p.broker for _, p in plan.placements] == ["b", "b"]


def test_failover_spreads_over_survivors() -> None:
    dead_topics = tuple(
        TopicLoad(f"/default/hot-{i:03d}", byte_rate=1e6 * (1 + i % 7), producers=2)
        for i in range(150)
    )
    reports = {
        "dead": LoadReport("dead", 0, 60, 50, topics=dead_topics),
        "a": LoadReport("a", 0, 30, 30, topics=tuple(TopicLoad(t) for t in idle_topics("a", 50))),
        "b": LoadReport("b", 0, 20, 20, topics=tuple(TopicLoad(t) for t in idle_topics("b", 50))),
        "c": LoadReport("c", 0, 25, 25, topics=tuple(TopicLoad(t) for t in idle_topics("c", 50))),
    }
    assignments = {b: tuple(t.topic for t in r.topics) for b, r in reports.items()}
    snap = ClusterSnapshot(("a", "b", "c", "dead"), reports=reports, assignments=assignments)
    plan = plan_failover(snap, "dead", Strategy.BALANCED)
    got = Counter(p.broker for _, p in plan.placements)
    assert sum(got.values()) == 150 and set(got) == {"a", "b", "c"}
    assert max(got.values()) < 150 * 0.6, got  # never piled onto one broker
    assert "dead" not in plan.snapshot.brokers


def test_drain_unloads_every_topic_and_broker_gets_no_new_ones() -> None:
    snap = counts({"a": 3, "b": 1})
    markers = plan_drain(snap, "a", now=5.0)
    assert [t for t, _ in markers] == sorted(snap.topics_of("a"))
    assert all(m.reason is MarkerReason.UNLOAD and m.from_broker == "a" for _, m in markers)
    assert all(not m.ready for _, m in markers)
    draining = ClusterSnapshot(
        snap.brokers, assignments=snap.assignments, states={"a": BrokerState(BrokerMode.DRAINING)}
    )
    plan = place_topics(draining, Strategy.FAIR, [(f"/d/n{i}", None) for i in range(10)])
    assert {p.broker for _, p in plan.placements} == {"b"}
