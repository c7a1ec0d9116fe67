from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ballast.cli.main import app
from ballast.config import ConfigError
from ballast.simulate.engine import simulate
from ballast.simulate.scenario import builtin_names, load_scenario


def test_scale_out_converges_with_minimum_moves_and_rate_limit() -> None:
    sc = load_scenario("scale-out")
    assert sc.load_manager.assignment_strategy.value == "fair"
    assert sc.load_manager.rebalancing.aggressiveness.value == "balanced"
    result = simulate(sc)
    assert result.initial_cv > 0.8
    assert result.final_cv < 0.10
    topics_moved = Counter(m.topic for m in result.moves)
    assert max(topics_moved.values()) == 1  # no topic moves twice
    initial, final = result.initial_topics, result.final_topics
    minimum = sum(max(0, initial.get(b, 0) - n) for b, n in final.items())
    assert len(result.moves) == minimum
    limit = sc.load_manager.rebalancing.max_moves_per_hour
    times = [m.timestamp for m in result.moves]
    for t in times:
        assert sum(1 for u in times if t <= u < t + 3600) <= limit
    assert result.rules["rate-limit"] > 0  # the limit actually bound the pace


def test_broker_failure_spreads_topics_over_survivors() -> None:
    result = simulate(load_scenario("broker-failure"))
    assert len(result.failovers) == 150
    receivers = Counter(to for _, _, _, to in result.failovers)
    assert set(receivers) == {"broker-1", "broker-3", "broker-4"}
    assert max(receivers.values()) <= 60
    assert "broker-2" not in result.final_topics


def test_workload_growth_triggers_moves_that_lower_cv() -> None:
    result = simulate(load_scenario("workload-growth"))
    peak = max(s.cv for s in result.samples)
    assert peak > result.scenario.load_manager.rebalancing.cv_threshold * 0.9
    assert result.moves and result.final_cv < peak


def test_heterogeneous_brokers_take_more_topics() -> None:
    result = simulate(load_scenario("heterogeneous"))
    big = min(result.final_topics["big-1"], result.final_topics["big-2"])
    std = max(result.final_topics[b] for b in ("std-1", "std-2", "std-3"))
    assert big > std


def test_deterministic_with_seed() -> None:
    a = simulate(load_scenario("workload-growth"))
    b = simulate(load_scenario("workload-growth"))
    assert [m.topic for m in a.moves] == [m.topic for m in b.moves]
    c = simulate(load_scenario("workload-growth", {"seed": 99}))
    assert [m.topic for m in c.moves] != [m.topic for m in a.moves]


def test_custom_scenario_file_with_drain(tmp_path: Path) -> None:
    f = tmp_path / "drain.yaml"
    f.write_text(
        "name: drain\n"
        "duration_hours: 1\n"
        "load_manager: {assignment_strategy: fair}\n"
        "brokers: [{id: a}, {id: b}, {id: c}]\n"
        "topics: [{count: 30}]\n"
        "events: [{at: 600, drain_broker: c}]\n"
    )
    result = simulate(load_scenario(str(f)))
    assert result.final_topics["c"] == 0
    assert len(result.drains) == 10
    assert result.final_topics["a"] == result.final_topics["b"] == 15


def test_bad_scenarios_are_explained(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown scenario 'nope'"):
        load_scenario("nope")
    f = tmp_path / "bad.yaml"
    f.write_text("name: x\nbrokers: [{id: a}]\nevents: [{at: 5}]\n")
    with pytest.raises(ConfigError, match="an event needs exactly one of"):
        load_scenario(str(f))
    f.write_text("name: x\nbrokers: [{id: a, cpu: 3}]\n")
    with pytest.raises(ConfigError, match=r"brokers\.0\.cpu: unknown key"):
        load_scenario(str(f))
    f.write_text("name: x\nbrokers: [{id: a}]\nload_manager: {rebalancing: {bogus: 1}}\n")
    with pytest.raises(ConfigError) as caught:
        load_scenario(str(f))
    # The key's full path, and the keys allowed where it is (not the scenario's).
    assert "load_manager.rebalancing.bogus: unknown key" in str(caught.value)
    assert "target_cv" in str(caught.value) and "duration_hours" not in str(caught.value)


def test_cli_writes_csv_and_png(tmp_path: Path) -> None:
    csv, png = tmp_path / "t.csv", tmp_path / "t.png"
    res = CliRunner().invoke(
        app, ["simulate", "scale-out", "--hours", "2", "--csv", str(csv), "--png", str(png)]
    )
    assert res.exit_code == 0, res.output
    assert "Summary" in res.output
    rows = csv.read_text().splitlines()
    assert rows[0].startswith("t_seconds,cv,moves,decision,broker-1_topics")
    assert len(rows) > 3
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    listed = CliRunner().invoke(app, ["simulate", "--list"])
    assert listed.output.split() == builtin_names()
    bad = CliRunner().invoke(app, ["simulate", "nope"])
    assert bad.exit_code == 2 and "unknown scenario" in bad.output
