"""Pulsar's policies in the simulator: a scenario chooses the shedder and the unit."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ballast.balance.pulsar.bundles import NamespaceBundles
from ballast.simulate.engine import EPOCH, Simulator, simulate
from ballast.simulate.scenario import load_scenario


def test_builtin_threshold_scenario_spreads_the_hot_broker() -> None:
    sc = load_scenario("pulsar-threshold")
    assert sc.load_manager.rebalancing.policy.value == "threshold"
    result = simulate(sc)
    assert result.initial_cv > 0.4 and result.final_cv < 0.15
    assert {m.reason for m in result.moves} == {"ThresholdShedder"}
    assert result.rules["no-shedding"] > 0
    # the grace period: no topic moves twice within 30 minutes
    last: dict[str, float] = {}
    for m in result.moves:
        assert m.timestamp - last.get(m.topic, -1e18) >= 30 * 60
        last[m.topic] = m.timestamp


def test_yaml_scenario_with_overload_shedder_moves_whole_bundles(tmp_path: Path) -> None:
    path = tmp_path / "bundles.yaml"
    path.write_text(
        """
name: bundles
duration_hours: 1
step_seconds: 60
load_manager:
  assignment_strategy: least_long_term_message_rate
  placement_unit: bundle
  rebalancing: {enabled: true, policy: overload}
  pulsar: {default_number_of_namespace_bundles: 8, nic_speed_gbps: 10}
brokers:
  - {id: a, cpu_capacity: 1.0}
  - {id: b, cpu_capacity: 4.0}
  - {id: c, cpu_capacity: 4.0}
topics:
  - {count: 80, byte_rate: 1000000, msg_rate: 100, place_on: [a]}
"""
    )
    result = simulate(load_scenario(str(path)))
    assert result.moves
    layout = NamespaceBundles.create("default", 8)
    moves_at = Counter(
        (m.timestamp, m.to_broker, layout.bundle_for_topic(m.topic)) for m in result.moves
    )
    by_bundle = Counter(layout.bundle_for_topic(m.topic) for m in result.moves)
    # every moved bundle moved whole, in one decision, to one target
    assert sorted(moves_at.values()) == sorted(by_bundle.values())
    assert all(m.reason == "OverloadShedder" for m in result.moves)
    assert all(m.timestamp >= EPOCH for m in result.moves)


def test_hot_bundle_splits_and_the_halves_spread(tmp_path: Path) -> None:
    path = tmp_path / "split.yaml"
    path.write_text(
        """
name: split
duration_hours: 1
step_seconds: 60
load_manager:
  assignment_strategy: least_long_term_message_rate
  placement_unit: bundle
  rebalancing: {enabled: true, policy: threshold}
  pulsar: {default_number_of_namespace_bundles: 2, nic_speed_gbps: 10}
brokers: [{id: a, cpu_capacity: 4}, {id: b, cpu_capacity: 4}, {id: c, cpu_capacity: 4}]
topics:
  - {count: 60, byte_rate: 200000, msg_rate: 400, place_on: [a]}
events:
  - {at: 600, grow_topics: {count: 60, factor: 3, over_seconds: 1200}}
"""
    )
    sim = Simulator(load_scenario(str(path)))
    result = sim.run()
    assert result.rules["bundle-split"] >= 1
    layout = sim.layouts["default"]
    assert len(layout) >= 3
    owners: dict[str, set[str]] = {}
    for broker, topics in sim.assignments.items():
        for t in topics:
            owners.setdefault(layout.full_name(layout.bundle_for_topic(t)), set()).add(broker)
    assert all(len(v) == 1 for v in owners.values())  # every bundle on one broker
    assert all(result.final_topics[b] > 0 for b in ("a", "b", "c"))
