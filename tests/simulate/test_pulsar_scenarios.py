"""Pulsar's policies in the simulator: a scenario chooses the shedder and the unit."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ballast.balance.bundles import NamespaceBundles
from ballast.simulate.engine import EPOCH, simulate
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
