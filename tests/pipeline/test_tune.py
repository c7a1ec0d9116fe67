"""`ballast tune` end to end on a real Spark session: a history recorded by a simulated
cluster (the leader's own sink), a grid of four configurations, one Spark task each."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from ballast.cli.main import app
from ballast.config import LoadManagerConfig
from tests.simulate.recorded import record, scenario

GRID = {
    "base": {"assignment_strategy": "balanced", "rebalancing": {"enabled": True}},
    "grid": {
        "rebalancing.enabled": [True, False],
        "rebalancing.max_moves_per_hour": [2, 10],
    },
}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("history")
    live = record(scenario(), root)
    return root, len(live.moves)


def _grid(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_tune_replays_every_configuration_and_recommends(
    spark: SparkSession, recorded: tuple[Path, int], tmp_path: Path
) -> None:
    history, live_moves = recorded
    out = tmp_path / "out"
    args = ["tune", "--history", str(history), "--grid", str(_grid(tmp_path, GRID))]
    result = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "recommended: configuration" in result.stdout

    table = pd.read_parquet(out / "tuning.parquet")
    assert len(table) == 4
    settings = [json.loads(s) for s in table["settings"]]
    moves = {
        (s["rebalancing.enabled"], s["rebalancing.max_moves_per_hour"]): m
        for s, m in zip(settings, table["moves"], strict=True)
    }
    # The live configuration makes the live leader's moves; the rate limit makes fewer
    # (at most two in any hour of the hour and a half); no rebalancing, none.
    assert moves[(True, 10)] == live_moves
    assert 0 < moves[(True, 2)] <= 4 < live_moves
    assert moves[(False, 2)] == moves[(False, 10)] == 0
    # Replayed with the configuration the cluster ran, the replay is faithful.
    reproduced = {
        (s["rebalancing.enabled"], s["rebalancing.max_moves_per_hour"]): share
        for s, share in zip(settings, table["live_moves_reproduced"], strict=True)
    }
    assert reproduced[(True, 10)] >= 0.9
    assert reproduced[(False, 10)] == 0.0
    for column in (
        "moved_mbps",
        "cv_p50",
        "cv_p95",
        "cv_max",
        "minutes_above_threshold",
        "broker_minutes_overloaded",
    ):
        assert column in table
    assert (table["cv_p50"] <= table["cv_p95"]).all()
    assert (table["cv_p95"] <= table["cv_max"]).all()
    # Moving nothing leaves the cluster more unbalanced for longer.
    quiet = table[table["moves"] == 0]
    busy = table[table["moves"] == live_moves]
    assert quiet["cv_p50"].min() > busy["cv_p50"].max()

    summary = json.loads((out / "tuning.json").read_text())
    assert len(summary["configurations"]) == 4
    assert summary["live_moves"] == live_moves
    front = summary["pareto"]
    assert set(front) == set(table.loc[table["pareto"], "config_id"])
    # The fewest moves are always on the front; the live configuration's more balanced
    # cluster is too.
    assert any(table.loc[i, "moves"] == 0 for i in front)
    chosen = summary["recommended"]
    assert chosen["config_id"] in front
    assert "fewest moves" in chosen["reason"]

    text = (out / "recommended.yaml").read_text()
    assert "# Why: fewest moves" in text
    section = yaml.safe_load(text)["load_manager"]
    config = LoadManagerConfig.model_validate(section)
    assert config.rebalancing.enabled == chosen["settings"]["rebalancing.enabled"]
    assert (
        config.rebalancing.max_moves_per_hour
        == chosen["settings"]["rebalancing.max_moves_per_hour"]
    )
    assert "tuning.png" in (out / "report.html").read_text()
    assert (out / "tuning.png").read_bytes()[:4] == b"\x89PNG"


def test_tune_range_without_reports_is_an_error(
    spark: SparkSession, recorded: tuple[Path, int], tmp_path: Path
) -> None:
    history, _ = recorded
    args = ["tune", "--history", str(history), "--grid", str(_grid(tmp_path, GRID))]
    result = CliRunner().invoke(app, [*args, "--from", "2030-01-01", "--out", str(tmp_path)])
    assert result.exit_code == 1
    said = " ".join(result.stderr.split())  # rich wraps lines to the terminal's width
    assert "fewer than two load reports between 2030-01-01T00:00:00Z and the end" in said


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"grid": {"rebalancing.cv_treshold": [0.2]}}, "no setting 'cv_treshold'"),
        ({"grid": {"rebalancing.max_moves_per_hour": [5, "many"]}}, "value 'many' is invalid"),
    ],
)
def test_tune_bad_grid_exits_before_spark(tmp_path: Path, grid: object, message: str) -> None:
    args = ["tune", "--history", str(tmp_path), "--grid", str(_grid(tmp_path, grid))]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert "starting Spark" not in result.stderr
