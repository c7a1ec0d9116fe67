"""Pulsar's placement strategies, failure domains and anti-affinity groups, and bundle-wise
placement through `select_broker` (scenarios of ModularLoadManagerStrategyTest and of the
reference's anti-affinity table)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.balance import plan_failover, select_broker
from ballast.balance.estimate import add_topic
from ballast.balance.pulsar.bundles import NamespaceBundles
from ballast.balance.pulsar.domains import (
    DomainError,
    FailureDomains,
    filter_anti_affinity,
    should_unload,
)
from ballast.balance.pulsar.strategies import (
    least_long_term_message_rate,
    least_resource_usage_with_weight,
)
from ballast.balance.rankings import score_brokers
from ballast.config import PulsarConfig, Strategy
from ballast.model import ClusterSnapshot, LoadReport, MarkerReason, TopicLoad, UnassignedMarker

DEFAULT = PulsarConfig()


def test_least_long_term_message_rate() -> None:
    rates = {"1": 100.0, "2": 200.0, "3": 300.0}
    usage = {"1": 0.0, "2": 0.0, "3": 0.0}
    assert least_long_term_message_rate(list(rates), rates, usage, DEFAULT).broker == "1"
    rates["1"] = 400.0
    assert least_long_term_message_rate(list(rates), rates, usage, DEFAULT).broker == "2"
    usage["2"] = 0.90  # above the 85 % overload threshold
    choice = least_long_term_message_rate(list(rates), rates, usage, DEFAULT)
    assert choice.broker == "3"
    assert choice.rejected["2"] == "[overloaded] max usage 90.0% > 85%"
    assert choice.rejected["1"] == "[score] msg rate 400/s > 300/s"


def test_least_resource_usage_with_weight_sequence() -> None:
    cfg = PulsarConfig(
        memory_resource_weight=0.1,
        direct_memory_resource_weight=0.1,
        history_resource_percentage=0.5,
        average_resource_usage_difference_threshold_percentage=5,
    )
    state = least_resource_usage_with_weight(
        ["1", "2", "3", "4"], {"1": 0.1, "2": 0.3, "3": 0.6, "4": 0.05}, cfg
    ).usage
    candidates = ["1", "2", "3"]  # broker 4 is known but not a candidate
    for sample, expected in [
        ((0.1, 0.3, 0.6), "1"),
        ((0.2, 0.3, 0.5), "1"),
        ((0.3, 0.3, 0.4), "1"),
        ((0.3, 0.3, 0.4), "1"),
        ((0.35, 0.2, 0.45), "2"),
    ]:
        choice = least_resource_usage_with_weight(
            candidates, dict(zip(candidates, sample, strict=True)), cfg, state
        )
        assert choice.broker == expected, (sample, choice.reason)
        state = choice.usage
    # a restarted broker (no bundles) starts again from its sample and is among the best
    choice = least_resource_usage_with_weight(
        candidates, {"1": 0.35, "2": 0.2, "3": 0.0}, cfg, state, idle=["3"]
    )
    assert choice.broker == "3"


def test_least_resource_usage_with_weight_state_of_non_candidates_is_ignored() -> None:
    cfg = PulsarConfig(
        history_resource_percentage=0.5, average_resource_usage_difference_threshold_percentage=5
    )
    prev = {"1": 0.1, "2": 0.3, "4": 0.05}
    choice = least_resource_usage_with_weight(
        ["1", "2", "3"], {"1": 0.1, "2": 0.3, "3": 0.6}, cfg, prev
    )
    assert choice.broker == "1"


def test_all_overloaded_falls_back_to_the_least_used() -> None:
    choice = least_resource_usage_with_weight(["a", "b"], {"a": 0.5, "b": 0.5}, DEFAULT)
    assert choice.broker == "a"
    assert "none is 10% below the average 50.0%" in choice.reason


def test_no_load_data_brokers() -> None:
    # LeastResourceUsageWithWeightTest#testNoLoadDataBrokers: broker1 at 50 %, broker2 at
    # 100 %, broker5 without load data. The average is 75 % over the two with data, and
    # broker5 is not "0 % used": broker1 wins (50 + 10 ≤ 75).
    choice = least_resource_usage_with_weight(
        ["broker1", "broker2", "broker5"], {"broker1": 0.5, "broker2": 1.0}, DEFAULT
    )
    assert choice.broker == "broker1"
    assert "average 75.0%" in choice.reason
    assert choice.rejected["broker5"].startswith("[no-load-data]")
    assert "broker5" not in choice.usage
    # both at 100 %: nobody is far enough below the average; Pulsar picks any candidate at
    # random, Ballast the least used one with load data (not the broker it knows nothing of)
    even = least_resource_usage_with_weight(
        ["broker1", "broker2", "broker5"], {"broker1": 1.0, "broker2": 1.0}, DEFAULT
    )
    assert even.broker == "broker1"
    # nobody has load data: the one owning the fewest units
    none = least_resource_usage_with_weight(
        ["broker1", "broker2", "broker5"], {}, DEFAULT, units={"broker1": 3, "broker5": 1}
    )
    assert none.broker == "broker2"


def test_select_broker_lruw_leaves_a_broker_without_a_report_out() -> None:
    snap = reported({"a": (50.0, 0.0, 1.0), "b": (100.0, 0.0, 1.0)})
    snap = ClusterSnapshot(("a", "b", "new"), snap.reports, {}, snap.assignments)
    p = select_broker(snap, Strategy.LEAST_RESOURCE_USAGE_WITH_WEIGHT, topic="/default/x")
    assert p.broker == "a"  # before issue 23, "new" won as 0 % used
    assert p.rejected["new"].startswith("[no-load-data]")


def reported(spec: dict[str, tuple[float, float, float]]) -> ClusterSnapshot:
    """{broker: (cpu %, network bytes/s, msg rate)}; one topic per broker."""
    reports, assignments = {}, {}
    for b, (cpu, net, rate) in spec.items():
        t = f"/default/{b}-t"
        reports[b] = LoadReport(b, 0.0, cpu, 10.0, 0.0, net, (TopicLoad(t, msg_rate=rate),))
        assignments[b] = (t,)
    return ClusterSnapshot(tuple(spec), reports, {}, assignments)


def test_select_broker_with_pulsar_strategies() -> None:
    snap = reported({"a": (90.0, 0.0, 10.0), "b": (20.0, 0.0, 500.0), "c": (30.0, 0.0, 300.0)})
    lltmr = select_broker(snap, Strategy.LEAST_LONG_TERM_MESSAGE_RATE, topic="/default/new")
    assert lltmr.broker == "c"
    assert lltmr.rejected["a"].startswith("[overloaded] max usage 90.0%")
    lruw = select_broker(snap, Strategy.LEAST_RESOURCE_USAGE_WITH_WEIGHT, topic="/default/new")
    assert lruw.broker == "b"  # 20 % ≤ avg 46.7 % − 10 %
    # network counts as bandwidth: 1 Gb/s NIC, 250 MB/s reported = 125 MB/s each way = 100 %
    scores = score_brokers(
        reported({"x": (5.0, 250e6, 0.0)}), Strategy.LEAST_RESOURCE_USAGE_WITH_WEIGHT
    )
    assert scores == {"x": pytest.approx(100.0)}


# --- failure domains and anti-affinity ----------------------------------------------------


def test_a_broker_in_two_domains_is_an_error_naming_it() -> None:
    with pytest.raises(DomainError, match="broker 'b1' is in two failure domains: 'd1' and 'd2'"):
        FailureDomains({"d1": frozenset({"b1"}), "d2": frozenset({"b1", "b2"})})
    with pytest.raises(
        DomainError, match=r"'b1' is in two failure domains: 'x' \(its broker.domain\)"
    ):
        FailureDomains.merge({"b1": "x"}, {"d1": ["b1"]})
    merged = FailureDomains.merge({"b1": "d1", "b3": "d2", "b4": None}, {"d1": ["b2"]})
    assert merged.broker_to_domain() == {"b1": "d1", "b2": "d1", "b3": "d2"}


def test_pulsar_docstring_example_domains_then_brokers() -> None:
    counts = {"b1": 2, "b2": 1, "b3": 2, "b4": 1, "b5": 2, "b6": 2}
    domains = {"b1": "d1", "b2": "d1", "b3": "d2", "b4": "d2", "b5": "d3", "b6": "d3"}
    result = filter_anti_affinity(sorted(counts), counts, domains, "g")
    assert result.kept == ("b2", "b4")
    assert result.rejected["b5"] == (
        "[anti-affinity] domain d3 holds 4 namespace(s) of group 'g'; another domain holds 3"
    )
    assert result.rejected["b1"] == (
        "[anti-affinity] broker holds 2 namespace(s) of group 'g'; another broker holds 1"
    )


def test_reference_table_four_namespaces_two_domains_one_per_broker() -> None:
    brokers = ("broker1", "broker2", "broker3", "broker4")
    snap = ClusterSnapshot(
        brokers,
        broker_domains={
            "broker1": "domain1",
            "broker2": "domain1",
            "broker3": "domain2",
            "broker4": "domain2",
        },
        anti_affinity_groups={f"ns{i}": "group" for i in range(1, 5)},
    )
    chosen = []
    expected_candidates = [
        ("broker1", "broker2", "broker3", "broker4"),
        ("broker3", "broker4"),
        ("broker2", "broker4"),
        ("broker4",),
    ]
    for i, cands in enumerate(expected_candidates, start=1):
        topic = f"/ns{i}/t"
        placement = select_broker(snap, Strategy.FAIR, topic=topic)
        assert placement.candidates == cands, placement.explain()
        chosen.append(placement.broker)
        assert placement.broker is not None
        snap = add_topic(snap, topic, placement.broker)
    assert chosen == ["broker1", "broker3", "broker2", "broker4"]


def test_more_namespaces_than_brokers_spread_evenly() -> None:
    snap = ClusterSnapshot(
        ("a", "b", "c"),
        broker_domains={"a": "d1", "b": "d2", "c": "d2"},
        anti_affinity_groups={f"n{i}": "g" for i in range(6)},
    )
    for i in range(6):
        p = select_broker(snap, Strategy.FAIR, topic=f"/n{i}/t")
        assert p.broker is not None
        snap = add_topic(snap, f"/n{i}/t", p.broker)
    per_domain = {"d1": 0, "d2": 0}
    for b, ts in snap.assignments.items():
        per_domain[snap.broker_domains[b]] += len(ts)
    assert per_domain == {"d1": 3, "d2": 3}
    assert sorted(len(ts) for ts in snap.assignments.values()) == [1, 2, 3]


def test_should_unload_only_when_the_namespace_would_not_come_back() -> None:
    assert should_unload("a", ["a", "b"], {"a": 1, "b": 1}) == (
        False,
        "anti-affinity: every candidate holds 1 namespace(s) of the group, so the unit would "
        "come back here",
    )
    assert should_unload("a", ["a", "b"], {"a": 2, "b": 1})[0]
    assert should_unload("a", ["a", "b", "c"], {"a": 1, "b": 1})[0]  # c holds none
    assert should_unload("a", ["a", "b"], None)[0]


# --- bundle-wise placement ---------------------------------------------------------------


def test_topics_of_one_bundle_share_a_broker() -> None:
    layout = NamespaceBundles.create("default", 4)
    topics = [f"/default/t{i}" for i in range(40)]
    snap = ClusterSnapshot(("a", "b", "c"), bundle_boundaries={"default": layout.boundaries})
    last = None
    for t in topics:
        p = select_broker(snap, Strategy.FAIR, last_chosen=last, topic=t)
        assert p.broker is not None
        snap = add_topic(snap, t, p.broker)
        last = p.broker
    owners: dict[str, set[str]] = {}
    for b, ts in snap.assignments.items():
        for t in ts:
            owners.setdefault(layout.full_name(layout.bundle_for_topic(t)), set()).add(b)
    assert all(len(v) == 1 for v in owners.values())
    assert len(owners) == 4
    # the explanation names the bundle and its owner
    t = topics[0]
    owner = next(b for b, ts in snap.assignments.items() if t in ts)
    new = "/default/t-new"
    p = select_broker(snap, Strategy.FAIR, topic=new)
    bundle = layout.full_name(layout.bundle_for_topic(new))
    assert p.reason == f"[bundle] {bundle} is owned by {p.broker}"
    marker = UnassignedMarker(MarkerReason.FAILOVER, from_broker=owner)
    moved = select_broker(snap, Strategy.FAIR, marker, topic=t)
    assert moved.broker != owner


def test_remove_most_servicing_brokers_for_namespace() -> None:
    # LoadManagerShared.removeMostServicingBrokersForNamespace: a namespace's new bundle goes
    # only to the brokers serving the fewest of its bundles. a already serves one bundle of
    # `orders` and is the least loaded (Fair: 1 topic against 3); b and c serve none.
    layout = NamespaceBundles.create("orders", 4)
    first, second = (f"/orders/{n}" for n in ("t0", "t1"))
    assert layout.bundle_for_topic(first) != layout.bundle_for_topic(second)
    snap = ClusterSnapshot(
        ("a", "b", "c"),
        assignments={
            "a": (first,),
            "b": ("/default/b1", "/default/b2", "/default/b3"),
            "c": ("/default/c1", "/default/c2", "/default/c3"),
        },
        bundle_boundaries={"orders": layout.boundaries},
    )
    p = select_broker(snap, Strategy.FAIR, topic=second)
    assert p.broker == "b"
    assert p.rejected["a"] == "[namespace-spread] serves 1 bundle(s) of orders; 2 broker(s) serve 0"
    # the same for Pulsar's strategies
    lltmr = select_broker(snap, Strategy.LEAST_LONG_TERM_MESSAGE_RATE, topic=second)
    assert lltmr.broker in ("b", "c")
    # a topic of a bundle `a` owns still joins it
    same = next(
        t
        for t in (f"/orders/x{i}" for i in range(100))
        if layout.bundle_for_topic(t) == layout.bundle_for_topic(first)
    )
    assert select_broker(snap, Strategy.FAIR, topic=same).broker == "a"
    # placed by topic (no stored layout), the namespace is not spread: Fair picks a
    by_topic = ClusterSnapshot(snap.brokers, assignments=snap.assignments)
    assert select_broker(by_topic, Strategy.FAIR, topic=second).broker == "a"


@settings(max_examples=80, deadline=None)
@given(
    counts=st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 4), min_size=1),
    domains=st.dictionaries(st.sampled_from("abcdef"), st.sampled_from(["d1", "d2", "d3"])),
)
def test_anti_affinity_keeps_someone_and_only_the_least_loaded(
    counts: dict[str, int], domains: dict[str, str]
) -> None:
    candidates = sorted(counts)
    result = filter_anti_affinity(candidates, counts, domains, "g")
    assert result.kept
    assert set(result.kept) | set(result.rejected) == set(candidates)
    kept_counts = {counts[b] for b in result.kept}
    assert len(kept_counts) == 1
    if not domains:
        assert kept_counts == {min(counts.values())}


def test_failover_keeps_anti_affinity_namespaces_apart() -> None:
    snap = ClusterSnapshot(
        ("a", "b", "c"),
        assignments={"a": ("/ns1/t0", "/ns1/t1"), "b": ("/ns2/t0",), "c": ("/other/x", "/other/y")},
        anti_affinity_groups={"ns1": "g", "ns2": "g"},
    )
    plan = plan_failover(snap, "a", Strategy.FAIR)
    assert {p.broker for _, p in plan.placements} == {"c"}
    assert plan.placements[0][1].rejected["b"].startswith("[anti-affinity] broker holds 1")
