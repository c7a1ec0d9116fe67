"""Pulsar's shedders through the decision core's entry point `decide_rebalance`."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.balance import MoveHistory, decide_rebalance
from ballast.balance.estimate import apply_move
from ballast.balance.pulsar.bundles import NamespaceBundles
from ballast.balance.pulsar.policy import _rescored, auto_split
from ballast.balance.rankings import score_brokers
from ballast.config import (
    ConfigError,
    PulsarConfig,
    RebalancingConfig,
    RebalancingPolicy,
    Strategy,
    parse_config,
)
from ballast.model import ClusterSnapshot, LoadReport, Move, TopicLoad

MB = 1024 * 1024
NOW = 10_000.0


def cluster(spec: dict[str, tuple[float, list[float]]], ns: str = "default") -> ClusterSnapshot:
    """{broker: (cpu %, [topic throughput MB/s, …])}."""
    reports, assignments = {}, {}
    for b, (cpu, rates) in spec.items():
        loads = tuple(
            TopicLoad(f"/{ns}/{b}-{i:02d}", msg_rate=100.0, byte_rate=r * MB)
            for i, r in enumerate(rates)
        )
        reports[b] = LoadReport(b, NOW, cpu, 5.0, 0.0, 0.0, loads)
        assignments[b] = tuple(t.topic for t in loads)
    return ClusterSnapshot(tuple(spec), reports, {}, assignments)


def rules(policy: str) -> RebalancingConfig:
    return RebalancingConfig(enabled=True, policy=RebalancingPolicy(policy))


def test_threshold_policy_moves_the_heaviest_topics_with_numbers() -> None:
    snap = cluster({"a": (90.0, [30, 20, 10, 5]), "b": (20.0, [5]), "c": (10.0, [5])})
    d = decide_rebalance(snap, MoveHistory(), NOW, rules("threshold"), Strategy.FAIR)
    assert d.rule == "move"
    # avg 40 %, a at 90 %: offload 90 − 40 − 10 + 5 = 45 % of 65 MB/s = 29.25 MB/s
    assert d.reason.startswith("[threshold] avg usage 40.0% over 3 broker(s); shed above 50.0%")
    assert [m.topic for m in d.moves] == ["/default/a-00"]
    assert d.move == d.moves[0]
    assert d.move.from_broker == "a" and d.move.to_broker == "b"
    assert d.move.reason == "ThresholdShedder"
    assert any("offload 45.0% of 65.0 MB/s = 29.2 MB/s" in x for x in d.details)
    assert d.shedder_state == {"a": 0.9, "b": 0.2, "c": 0.1}
    assert d.after is not None and "/default/a-00" in d.after.assignments["b"]


def test_grace_period_excludes_recently_moved_topics() -> None:
    snap = cluster({"a": (90.0, [30, 20, 10, 5]), "b": (20.0, [5]), "c": (10.0, [5])})
    history = MoveHistory.of([Move("/default/a-00", "x", "a", timestamp=NOW - 29 * 60)])
    d = decide_rebalance(snap, history, NOW, rules("threshold"), Strategy.FAIR)
    assert [m.topic for m in d.moves] == ["/default/a-01", "/default/a-02"]
    assert any("excluded 1 recently unloaded (grace 30m)" in x for x in d.details)
    later = MoveHistory.of([Move("/default/a-00", "x", "a", timestamp=NOW - 31 * 60)])
    d = decide_rebalance(snap, later, NOW, rules("threshold"), Strategy.FAIR)
    assert [m.topic for m in d.moves] == ["/default/a-00"]


def test_a_brokers_only_bundle_is_never_shed() -> None:
    snap = cluster({"a": (99.0, [80]), "b": (10.0, [1]), "c": (10.0, [1])})
    for policy in ("threshold", "overload"):
        d = decide_rebalance(snap, MoveHistory(), NOW, rules(policy), Strategy.FAIR)
        assert d.rule == "no-shedding"
        assert d.move is None
        assert any("[only-bundle]" in x for x in d.details), d.details


def test_bundle_moves_take_every_topic_of_the_bundle_to_one_target() -> None:
    layout = NamespaceBundles.create("default", 4)
    topics = [f"/default/t{i:02d}" for i in range(24)]
    loads = tuple(TopicLoad(t, msg_rate=100.0, byte_rate=5 * MB) for t in topics)
    snap = ClusterSnapshot(
        ("a", "b", "c"),
        {
            "a": LoadReport("a", NOW, 95.0, 20.0, topics=loads),
            "b": LoadReport("b", NOW, 10.0, 20.0),
            "c": LoadReport("c", NOW, 10.0, 20.0),
        },
        {},
        {"a": tuple(topics), "b": (), "c": ()},
        bundle_boundaries={"default": layout.boundaries},
    )
    d = decide_rebalance(snap, MoveHistory(), NOW, rules("overload"), Strategy.FAIR)
    assert d.rule == "move"
    groups = layout.group_topics(topics)
    heaviest = max(groups, key=lambda r: (len(groups[r]), -r.lower))
    moved = {m.topic for m in d.moves}
    assert moved == set(groups[heaviest])
    assert len({m.to_broker for m in d.moves}) == 1
    assert f"default/{heaviest.name}" in " ".join(d.details)


def test_disabled_and_uniform_hold_reasons() -> None:
    snap = cluster({"a": (50.0, [1, 1]), "b": (50.0, [1, 1])})
    off = RebalancingConfig(enabled=True, policy=RebalancingPolicy.UNIFORM)
    d = decide_rebalance(
        snap, MoveHistory(), NOW, off, Strategy.FAIR, pulsar=PulsarConfig(shedding_enabled=False)
    )
    assert d.explanation == "[disabled] shedding is disabled (pulsar.shedding_enabled: false)"
    d = decide_rebalance(snap, MoveHistory(), NOW, off, Strategy.FAIR)
    assert d.rule == "no-shedding"
    assert "within both limits" in d.reason


def test_config_policy_and_pulsar_section() -> None:
    cfg = parse_config(
        {
            "load_manager": {
                "assignment_strategy": "least_resource_usage_with_weight",
                "placement_unit": "bundle",
                "rebalancing": {"enabled": True, "policy": "threshold"},
                "pulsar": {"lower_boundary_shedding_enabled": True},
            }
        }
    )
    lm = cfg.load_manager
    assert lm.rebalancing.policy is RebalancingPolicy.THRESHOLD
    assert lm.pulsar.default_number_of_namespace_bundles == 4
    assert lm.pulsar.shedding_grace_period_minutes == 30
    with pytest.raises(ConfigError, match=r"load_manager.rebalancing.policy: .*'shedder'"):
        parse_config({"load_manager": {"rebalancing": {"policy": "shedder"}}})
    with pytest.raises(ConfigError, match="specified_positions_divide' is admin-only"):
        parse_config(
            {
                "load_manager": {
                    "pulsar": {
                        "default_namespace_bundle_split_algorithm": "specified_positions_divide"
                    }
                }
            }
        )
    with pytest.raises(ConfigError, match=r"default_namespace_bundle_split_algorithm.*'halves'"):
        parse_config(
            {"load_manager": {"pulsar": {"default_namespace_bundle_split_algorithm": "halves"}}}
        )


@settings(max_examples=40, deadline=None)
@given(
    cpus=st.lists(st.floats(0, 100), min_size=3, max_size=6),
    strategy=st.sampled_from(list(Strategy)),
    seed=st.integers(0, 1000),
)
def test_incremental_rescoring_matches_full_scoring(
    cpus: list[float], strategy: Strategy, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    spec = {
        f"b{i}": (c, rng.uniform(0.1, 5, rng.integers(1, 6)).tolist()) for i, c in enumerate(cpus)
    }
    snap = cluster(spec)
    scores = score_brokers(snap, strategy)
    src, dst = "b0", "b1"
    topic = snap.assignments[src][0]
    after = apply_move(snap, topic, src, dst)
    assert _rescored(after, scores, (src, dst), strategy, PulsarConfig()) == pytest.approx(
        score_brokers(after, strategy)
    )


@settings(max_examples=30, deadline=None)
@given(
    cpus=st.lists(st.floats(0, 100), min_size=2, max_size=6),
    policy=st.sampled_from(["threshold", "overload", "uniform"]),
    seed=st.integers(0, 1000),
)
def test_shedders_never_move_a_brokers_only_unit_nor_a_topic_twice(
    cpus: list[float], policy: str, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    spec = {
        f"b{i}": (c, rng.uniform(0, 40, rng.integers(0, 5)).tolist()) for i, c in enumerate(cpus)
    }
    snap = cluster(spec)
    d = decide_rebalance(snap, MoveHistory(), NOW, rules(policy), Strategy.FAIR)
    moved = [m.topic for m in d.moves]
    assert len(moved) == len(set(moved))
    for m in d.moves:
        assert len(snap.assignments[m.from_broker]) > 1
        assert m.to_broker != m.from_broker


def test_a_broker_yet_to_report_does_not_drag_the_average_down() -> None:
    snap = cluster({"a": (60.0, [20, 20]), "b": (50.0, [20, 20])})
    joined = ClusterSnapshot(
        (*snap.brokers, "new"), snap.reports, {}, {**snap.assignments, "new": ()}
    )
    d = decide_rebalance(joined, MoveHistory(), NOW, rules("threshold"), Strategy.FAIR)
    assert d.rule == "no-shedding"
    assert "over 2 broker(s)" in d.reason


def test_auto_split_splits_a_hot_bundle_and_unloads_its_topics() -> None:
    topics = tuple(TopicLoad(f"/default/t{i:02d}", msg_rate=1000.0) for i in range(40))
    snap = ClusterSnapshot(
        ("a", "b"),
        {"a": LoadReport("a", NOW, 50.0, 5.0, topics=topics)},
        {},
        {"a": tuple(t.topic for t in topics), "b": ()},
        bundle_boundaries={"default": (0, 0x80000000, 0xFFFFFFFF)},
    )
    out = auto_split(snap, PulsarConfig())
    hot = [s.name for s in out.plan.splits]
    layout = NamespaceBundles("default", (0, 0x80000000, 0xFFFFFFFF))
    groups = layout.group_topics([t.topic for t in topics])
    expected = [layout.full_name(r) for r, ts in groups.items() if 1000 * len(ts) > 30_000]
    assert hot == expected
    assert len(out.layouts["default"]) == 2 + len(expected)
    assert {t for t, _ in out.unload} == {
        t for r, ts in groups.items() if 1000 * len(ts) > 30_000 for t in ts
    }
    quiet = auto_split(snap, PulsarConfig(auto_unload_split_bundles_enabled=False))
    assert quiet.unload == () and quiet.layouts == out.layouts


def test_shedders_never_return_a_topic_to_the_broker_it_left_within_the_window() -> None:
    snap = cluster({"a": (90.0, [30, 20, 10, 5]), "b": (20.0, [5]), "c": (20.0, [5])})
    d = decide_rebalance(snap, MoveHistory(), NOW, rules("threshold"), Strategy.FAIR)
    assert [(m.topic, m.to_broker) for m in d.moves] == [("/default/a-00", "b")]
    # a-00 came from b 31 minutes ago: past the grace period, inside the return window.
    history = MoveHistory.of([Move("/default/a-00", "b", "a", timestamp=NOW - 31 * 60)])
    d = decide_rebalance(snap, history, NOW, rules("threshold"), Strategy.FAIR)
    assert [(m.topic, m.to_broker) for m in d.moves] == [("/default/a-00", "c")]
    assert any("b: [return-window] /default/a-00 left b" in x for x in d.details), d.details
    # Both targets ruled out: the unit stays, and the decision says why.
    history = MoveHistory.of(
        [
            Move("/default/a-00", "b", "a", timestamp=NOW - 50 * 60),
            Move("/default/a-00", "c", "b", timestamp=NOW - 40 * 60),
            Move("/default/a-00", "b", "a", timestamp=NOW - 31 * 60),
        ]
    )
    d = decide_rebalance(snap, history, NOW, rules("threshold"), Strategy.FAIR)
    assert d.moves == () and d.rule == "no-shedding"
    assert any("/default/a-00: no target" in x for x in d.details), d.details
    window = RebalancingConfig(
        enabled=True, policy=RebalancingPolicy.THRESHOLD, return_window_seconds=30 * 60
    )
    d = decide_rebalance(snap, history, NOW, window, Strategy.FAIR)
    assert [m.topic for m in d.moves] == ["/default/a-00"]


def test_shedders_move_within_the_rate_limits_and_never_split_a_unit() -> None:
    snap = cluster({"a": (90.0, [30, 20, 10, 5]), "b": (20.0, [5]), "c": (10.0, [5])})
    grace = MoveHistory.of([Move("/default/a-00", "x", "a", timestamp=NOW - 29 * 60)])
    one = RebalancingConfig(enabled=True, policy=RebalancingPolicy.THRESHOLD, max_moves_per_hour=2)
    d = decide_rebalance(snap, grace, NOW, one, Strategy.FAIR)
    assert [m.topic for m in d.moves] == ["/default/a-01"]  # 1 move left in the hour
    assert any("/default/a-02: [rate-limit]" in x for x in d.details), d.details
    full = MoveHistory.of([*grace.moves, Move("/default/b-00", "x", "b", timestamp=NOW - 10 * 60)])
    d = decide_rebalance(snap, full, NOW, one, Strategy.FAIR)
    assert d.rule == "rate-limit" and d.moves == ()
    assert "2 moves in the last hour (max 2)" in d.reason
    assert d.shedder_state is not None  # the shedder ran: its smoothing goes on


def test_a_bundle_larger_than_the_hourly_cap_moves_alone_in_an_empty_hour() -> None:
    # a's bundle 0x00000000_0x80000000 holds a-00, a-01, a-04, a-05 (65 MB/s); the other
    # one a-02, a-03 (2 MB/s). OverloadShedder sheds the heavy bundle: 4 moves, cap 2.
    snap = cluster({"a": (90.0, [30, 20, 1, 1, 10, 5]), "b": (20.0, [5]), "c": (10.0, [5])})
    layout = NamespaceBundles.create("default", 2)
    snap = replace(snap, bundle_boundaries={"default": layout.boundaries})
    two = RebalancingConfig(enabled=True, policy=RebalancingPolicy.OVERLOAD, max_moves_per_hour=2)
    d = decide_rebalance(snap, MoveHistory(), NOW, two, Strategy.FAIR)
    assert d.rule == "move", d.explain()
    assert sorted(m.topic for m in d.moves) == [f"/default/a-0{i}" for i in (0, 1, 4, 5)]
    assert len({m.to_broker for m in d.moves}) == 1
    # One move already in the hour: the bundle waits whole (never split across the limit).
    history = MoveHistory.of([Move("/default/x-00", "b", "c", timestamp=NOW - 10 * 60)])
    d = decide_rebalance(snap, history, NOW, two, Strategy.FAIR)
    assert d.moves == () and d.rule == "rate-limit"
    assert "1 moves in the last hour (max 2)" in d.reason
    assert any("[rate-limit]" in x for x in d.details), d.details
