"""A small history recorded by a simulated cluster (the leader's own history sink), read
back as the columnar tables the pipeline compacts it into."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import pyarrow as pa

from ballast.load_history import HistoryWriter
from ballast.pipeline.arrow_compact import convert
from ballast.simulate.engine import SimResult, Simulator
from ballast.simulate.replay import RecordedHistory
from ballast.simulate.scenario import Scenario, parse_scenario

# Three brokers, 30 skewed topics on two of them; a fourth broker joins, five topics grow
# fourfold, then a broker dies: moves, failovers and new capacity in an hour and a half of
# 30-second reports.
RECORDED: dict[str, Any] = {
    "name": "recorded",
    "seed": 3,
    "duration_hours": 1.5,
    "step_seconds": 30,
    "sample_every_seconds": 300,
    "load_manager": {"assignment_strategy": "balanced", "rebalancing": {"enabled": True}},
    "brokers": [{"id": "b1"}, {"id": "b2"}, {"id": "b3"}],
    "topics": [{"count": 30, "skew": 0.8, "place_on": ["b1", "b2"]}],
    "events": [
        {"at": 900, "add_brokers": [{"id": "b4"}]},
        {"at": 2400, "grow_topics": {"count": 5, "factor": 4, "over_seconds": 600}},
        {"at": 3600, "kill_broker": "b2"},
    ],
}


def scenario(**overrides: Any) -> Scenario:
    return parse_scenario({**RECORDED, **overrides}, "recorded")


def record(sc: Scenario, root: Path) -> SimResult:
    """Run `sc` as the live cluster, its leader's history sink writing under `root`."""
    with HistoryWriter(root, "leader-sim") as writer:
        sim = Simulator(sc)
        sim.history_sink = lambda r: writer.append(r.report, r.mode)
        return sim.run()


def columns(root: Path) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """(brokers, topics) columns of the history under `root`, converted by the
    compaction's Arrow path."""
    topics, brokers = [], []
    for index, path in enumerate(sorted(glob.glob(f"{root}/date=*/hour=*/*.jsonl"))):
        t, b = convert(Path(path).read_bytes(), index, path)
        topics.append(t)
        brokers.append(b)
    return pa.concat_tables(brokers).to_pydict(), pa.concat_tables(topics).to_pydict()


def recorded_history(root: Path) -> RecordedHistory:
    brokers, topics = columns(root)
    return RecordedHistory.from_columns(brokers, topics)
