"""The grid, the figures of a replay, the Pareto front and the recommendation (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ballast.config import ConfigError, LoadManagerConfig, Strategy
from ballast.model import Move
from ballast.simulate.replay import RecordedMove, ReplayResult, ReplaySample
from ballast.simulate.tuning import (
    Measure,
    Outcome,
    load_grid,
    outcome,
    pareto_front,
    parse_grid,
    recommend,
    recommended_section,
)

GRID = {
    "base": {"rebalancing": {"enabled": True}},
    "grid": {
        "assignment_strategy": ["balanced", "fair"],
        "rebalancing.cv_threshold": [0.2, 0.3, 0.4],
    },
}


def test_grid_combinations_and_configs() -> None:
    grid = parse_grid(GRID, "g.yaml")
    combos = grid.combinations()
    assert len(combos) == 6
    assert combos[1] == {"assignment_strategy": "balanced", "rebalancing.cv_threshold": 0.3}
    config = grid.config(combos[5])
    assert config.assignment_strategy is Strategy.FAIR
    assert config.rebalancing.cv_threshold == 0.4
    assert config.rebalancing.enabled  # from base, kept beside the grid's setting
    # The yardstick defaults to base's strategy and threshold.
    assert grid.measure == Measure(Strategy.BALANCED, 0.30, 85.0)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"grid": {"rebalancing.cv_treshold": [0.2]}}, "rebalancing has no setting 'cv_treshold'"),
        ({"grid": {"strategy": ["fair"]}}, "load_manager has no setting 'strategy'"),
        ({"grid": {"rebalancing.cv_threshold": [0.2, -1]}}, "value -1 is invalid"),
        ({"grid": {"assignment_strategy": ["fastest"]}}, "value 'fastest' is invalid"),
        ({"grid": {"rebalancing": [1]}}, "is a section"),
        ({"grid": {"assignment_strategy.x": [1]}}, "'assignment_strategy' is not a section"),
        ({"grid": {"rebalancing.cv_threshold": []}}, "no values"),
        ({"grid": {}}, "grid: expected settings"),
        ({"grids": {}}, "unknown section(s) 'grids'"),
        ({"base": {"rebalancing": {"nope": 1}}, "grid": {}}, "rebalancing.nope: unknown key"),
        ({"grid": {"rebalancing.enabled": [True]}, "measure": {"x": 1}}, "measure: expected"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_bad_grids_are_named(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_grid(data, "g.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("g.yaml: ")


def test_grid_file(tmp_path: Path) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(GRID))
    assert len(load_grid(path).combinations()) == 6
    path.write_text("grid: [unclosed")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_grid(path)
    with pytest.raises(ConfigError, match="cannot read grid"):
        load_grid(tmp_path / "absent.yaml")


def _outcome(config_id: int, moves: int, cv_p95: float, above: float = 0.0) -> Outcome:
    return Outcome(config_id, {}, moves, 0.0, cv_p95, cv_p95, cv_p95, above, 0.0, 0, 0.0, 0.0)


def test_pareto_front() -> None:
    outcomes = [
        _outcome(0, 10, 0.10),
        _outcome(1, 4, 0.20),
        _outcome(2, 6, 0.25),  # beaten by 1 on both
        _outcome(3, 0, 0.50),
        _outcome(4, 10, 0.12),  # beaten by 0 on imbalance, same moves
    ]
    assert pareto_front(outcomes) == [3, 1, 0]


def test_recommendation_takes_fewest_moves_near_the_best_imbalance() -> None:
    outcomes = [_outcome(0, 10, 0.100), _outcome(1, 6, 0.108), _outcome(2, 2, 0.200)]
    chosen = recommend(outcomes)
    assert chosen.config_id == 1  # within 10 % of 0.100; 2 is too unbalanced
    assert "fewest moves (6)" in chosen.reason
    assert "up to 10 moves" in chosen.reason
    # Equal moves: less time above the threshold wins.
    tie = [_outcome(0, 3, 0.1, above=20.0), _outcome(1, 3, 0.1, above=5.0)]
    assert recommend(tie).config_id == 1


def test_recommended_section_is_a_loadable_load_manager() -> None:
    grid = parse_grid(GRID, "g.yaml")
    section = recommended_section(grid, grid.combinations()[4])
    assert section == {
        "load_manager": {
            "assignment_strategy": "fair",
            "rebalancing": {"enabled": True, "cv_threshold": 0.3},
        }
    }
    config = LoadManagerConfig.model_validate(
        yaml.safe_load(yaml.safe_dump(section))["load_manager"]
    )
    assert config == grid.config(grid.combinations()[4])


def test_outcome_figures() -> None:
    samples = tuple(
        ReplaySample(t=30.0 * i, cv=cv, recorded_cv=None, overloaded=over, brokers=3)
        for i, (cv, over) in enumerate([(0.5, 2), (0.4, 1), (0.2, 0), (0.1, 0)])
    )
    moved = (Move("/n/x", "a", "b", timestamp=600.0),)
    result = ReplayResult(LoadManagerConfig(), 30.0, samples, moved, 1.5, 0, 0, 0)
    live = (RecordedMove("/n/x", "a", "b", 610.0), RecordedMove("/n/y", "a", "b", 610.0))
    o = outcome(7, {"a": 1}, result, Measure(Strategy.BALANCED, 0.3), 0.25, live)
    assert (o.config_id, o.moves, o.moved_mbps) == (7, 1, 1.5)
    assert o.live_moves_reproduced == 0.5  # /n/x, not /n/y
    assert o.cv_max == 0.5
    assert o.cv_p50 == pytest.approx(0.3)
    assert o.minutes_above_threshold == 1.0  # two 30-second steps above 0.3
    assert o.broker_minutes_overloaded == 1.5  # three broker-steps of 30 s
