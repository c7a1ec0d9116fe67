"""The unreachable-owner rule (`ballast.leader.reachability`): snapshots in, decisions out."""

from __future__ import annotations

from collections.abc import Mapping

from ballast.leader.reachability import (
    Evict,
    ReachabilityRule,
    ReachabilitySnapshot,
    Restore,
    decide,
)
from ballast.model import BrokerMode, BrokerState

RULE = ReachabilityRule(evict_after_seconds=1.0)
BROKERS = frozenset({"b1", "b2", "b3"})


def snapshot(
    reports: Mapping[str, Mapping[str, float]],
    *,
    gateways: frozenset[str] = frozenset({"g1", "g2"}),
    now: float = 10.0,
    brokers: frozenset[str] = BROKERS,
    states: Mapping[str, BrokerState] | None = None,
    evicted: frozenset[str] = frozenset(),
) -> ReachabilitySnapshot:
    return ReachabilitySnapshot(now, gateways, reports, brokers, states or {}, evicted)


def test_a_broker_every_gateway_reports_for_long_enough_is_evicted() -> None:
    decisions = decide(RULE, snapshot({"g1": {"b2": 8.0}, "g2": {"b2": 8.5}}))
    assert decisions == [Evict("b2", ("g1", "g2"), 8.5)]
    assert "unreachable from every gateway (g1, g2)" in decisions[0].reason


def test_not_before_every_report_is_old_enough() -> None:
    assert decide(RULE, snapshot({"g1": {"b2": 8.0}, "g2": {"b2": 9.5}})) == []


def test_one_flaky_gateway_cannot_evict_a_broker_the_others_reach() -> None:
    assert decide(RULE, snapshot({"g1": {"b2": 0.0}})) == []
    three = frozenset({"g1", "g2", "g3"})
    assert decide(RULE, snapshot({"g1": {"b2": 0.0}, "g2": {"b2": 0.0}}, gateways=three)) == []


def test_a_gateway_that_reaches_no_broker_is_the_one_cut_off() -> None:
    cut_off = {"g1": {b: 0.0 for b in BROKERS}}
    assert decide(RULE, snapshot(cut_off, gateways=frozenset({"g1"}))) == []
    # ... and it does not veto the others' verdict either: it does not count at all.
    both = {**cut_off, "g2": {"b2": 0.0}}
    assert decide(RULE, snapshot(both)) == [Evict("b2", ("g2",), 0.0)]


def test_reports_of_dead_gateways_and_of_brokers_that_left_do_not_count() -> None:
    reports = {"g1": {"b2": 0.0}, "gone": {"b3": 0.0}}
    assert decide(RULE, snapshot(reports, gateways=frozenset({"g1"}))) == [
        Evict("b2", ("g1",), 0.0)
    ]
    assert decide(RULE, snapshot({"g1": {"b9": 0.0}}, gateways=frozenset({"g1"}))) == []


def test_min_gateways() -> None:
    rule = ReachabilityRule(evict_after_seconds=1.0, min_gateways=2)
    one = frozenset({"g1"})
    assert decide(rule, snapshot({"g1": {"b2": 0.0}}, gateways=one)) == []
    assert decide(rule, snapshot({"g1": {"b2": 0.0}, "g2": {"b2": 0.0}})) != []


def test_never_the_last_reachable_active_broker() -> None:
    reports = {"g1": {"b1": 0.0, "b2": 0.0}, "g2": {"b1": 0.0, "b2": 0.0}}
    brokers = frozenset({"b1", "b2", "b3"})
    drained = {"b3": BrokerState(BrokerMode.DRAINED, "by admin")}
    assert decide(RULE, snapshot(reports, brokers=brokers, states=drained)) == []
    assert [d.broker for d in decide(RULE, snapshot(reports, brokers=brokers))] == ["b1", "b2"]


def test_an_operators_drain_is_left_alone() -> None:
    states = {"b2": BrokerState(BrokerMode.DRAINING, "drained by admin")}
    assert decide(RULE, snapshot({"g1": {"b2": 0.0}, "g2": {"b2": 0.0}}, states=states)) == []


def test_an_evicted_broker_is_restored_once_no_gateway_reports_it() -> None:
    draining = {"b2": BrokerState(BrokerMode.DRAINED, "drained: every topic moved away")}
    evicted = frozenset({"b2"})
    still = snapshot({"g1": {"b2": 0.0}, "g2": {"b2": 0.0}}, states=draining, evicted=evicted)
    assert decide(RULE, still) == []  # evicted already: nothing more to do
    half = snapshot({"g1": {"b2": 0.0}}, states=draining, evicted=evicted)
    assert decide(RULE, half) == [Restore("b2", registered=True)]
    gone = snapshot({}, states=draining, evicted=evicted, brokers=frozenset({"b1", "b3"}))
    assert decide(RULE, gone) == [Restore("b2", registered=False)]
