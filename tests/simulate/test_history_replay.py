"""Replaying a recorded history through the leader's machine reproduces the live leader.

The "live" cluster is the simulator driving `LeaderMachine` with a 30-second report
cadence and its history sink on; the replay sees only what the history holds (reports,
their topics and loads, the brokers' modes) and must rebuild the same decisions.
"""

from __future__ import annotations

import pytest

from ballast.config import LoadManagerConfig
from ballast.simulate.replay import (
    RecordedHistory,
    ReplayOptions,
    fidelity,
    recorded_moves,
    replay,
)
from tests.simulate.recorded import record, recorded_history, scenario


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[RecordedHistory, int, int]:
    root = tmp_path_factory.mktemp("history")
    live = record(scenario(), root)
    return recorded_history(root), len(live.moves), len(live.failovers)


def test_history_shows_the_live_moves(recorded: tuple[RecordedHistory, int, int]) -> None:
    history, live_moves, _ = recorded
    moves = recorded_moves(history)
    # Every rebalancing move, and no failover (b2's topics) counted as one.
    assert live_moves >= 5
    assert len(moves) == live_moves
    assert all(m.from_broker != "b2" or m.timestamp < history.start + 3600 for m in moves)


def test_replay_with_the_live_configuration_reproduces_its_moves(
    recorded: tuple[RecordedHistory, int, int],
) -> None:
    history, _, live_failovers = recorded
    lm = scenario().load_manager
    result = replay(history, lm, ReplayOptions(recorded_cv=True))
    tolerance = lm.rebalancing.check_interval_seconds + history.report_interval
    f = fidelity(recorded_moves(history), result.moves, tolerance)
    assert f.share >= 0.9, f
    # Brokers came and went as recorded: b4 joined, b2's topics failed over.
    assert max(s.brokers for s in result.samples) == 4
    assert result.samples[-1].brokers == 3
    assert result.failovers == live_failovers
    # The CV trajectories agree (the recorded one lags by at most one report).
    assert result.samples[-1].cv == pytest.approx(result.samples[-1].recorded_cv, abs=0.02)
    assert result.moved_mbps > 0


def test_another_configuration_decides_otherwise(
    recorded: tuple[RecordedHistory, int, int],
) -> None:
    history, _, _ = recorded
    off = LoadManagerConfig.model_validate({"rebalancing": {"enabled": False}})
    quiet = replay(history, off)
    assert quiet.moves == ()
    f = fidelity(recorded_moves(history), quiet.moves, 330.0)
    assert f.share == 0.0
    # Without rebalancing the new broker stays idle: the imbalance stays above the
    # live leader's until b2 dies.
    live = replay(history, scenario().load_manager)
    at = len(quiet.samples) // 2
    assert quiet.samples[at].cv > live.samples[at].cv


def _history(reports: list[tuple[str, float, str, list[str]]]) -> RecordedHistory:
    brokers: dict[str, list[object]] = {
        k: []
        for k in (
            "report_id",
            "broker_id",
            "timestamp",
            "state",
            "cpu_percent",
            "memory_percent",
            "disk_io_bps",
            "network_io_bps",
        )
    }
    topics: dict[str, list[object]] = {
        k: []
        for k in (
            "report_id",
            "topic",
            "msg_rate",
            "byte_rate",
            "producers",
            "consumers",
            "subscriptions",
            "backlog",
        )
    }
    for rid, (broker, t, state, names) in enumerate(reports):
        for k, v in zip(brokers, (rid, broker, t, state, 10.0, 10.0, 0.0, 0.0), strict=True):
            brokers[k].append(v)
        for name in names:
            for k, v in zip(topics, (rid, name, 1.0, 1e6, 1, 1, 1, None), strict=True):
                topics[k].append(v)
    return RecordedHistory.from_columns(brokers, topics)


def test_recorded_moves_leave_out_failovers_and_drains() -> None:
    history = _history(
        [
            ("a", 0, "active", ["/n/x", "/n/y"]),
            ("b", 0, "active", ["/n/z"]),
            ("c", 0, "draining", ["/n/w"]),
            ("a", 30, "active", ["/n/y"]),
            ("b", 30, "active", ["/n/x", "/n/z", "/n/w"]),  # x moved; w drained off c
            ("c", 30, "drained", []),
            ("b", 60, "active", ["/n/x", "/n/z", "/n/w", "/n/y"]),  # a died: a failover
        ]
    )
    assert history.brokers == ("a", "b", "c")
    assert history.report_interval == 30.0
    moves = recorded_moves(history)
    assert [(m.topic, m.from_broker, m.to_broker, m.timestamp) for m in moves] == [
        ("/n/x", "a", "b", 30.0)
    ]


def test_fidelity_matches_topic_destination_and_time() -> None:
    from ballast.model import Move
    from ballast.simulate.replay import RecordedMove

    live = (RecordedMove("/n/x", "a", "b", 100.0), RecordedMove("/n/y", "a", "b", 100.0))
    replayed = (
        Move("/n/x", "a", "b", timestamp=400.0),  # in time
        Move("/n/y", "a", "c", timestamp=100.0),  # elsewhere
    )
    f = fidelity(live, replayed, 330.0)
    assert (f.live_moves, f.replay_moves, f.reproduced) == (2, 2, 1)
    assert fidelity(live, replayed, 200.0).reproduced == 0
