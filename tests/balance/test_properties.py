"""Invariants of the decision core, over generated clusters and histories."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.balance import MoveHistory, decide_rebalance, select_broker
from ballast.balance.candidates import is_blacklisted
from ballast.balance.imbalance import sum_squared_deviations
from ballast.balance.rebalance import active_scores
from ballast.config import RebalancingConfig, Strategy, parse_config
from ballast.model import (
    BrokerMode,
    BrokerState,
    ClusterSnapshot,
    LoadReport,
    MarkerReason,
    Move,
    TopicLoad,
    UnassignedMarker,
)

MODES = st.sampled_from(list(BrokerMode))
STRATEGIES = st.sampled_from(list(Strategy))


@st.composite
def snapshots(draw: st.DrawFn) -> ClusterSnapshot:
    n = draw(st.integers(2, 6))
    brokers = tuple(f"b{i}" for i in range(n))
    reports, assignments, states, created = {}, {}, {}, {}
    for b in brokers:
        k = draw(st.integers(0, 12))
        topics = []
        for j in range(k):
            name = draw(st.sampled_from(["/default/t", "/system/s", "/default/critical-c"]))
            topic = f"{name}-{b}-{j}"
            topics.append(
                TopicLoad(
                    topic,
                    msg_rate=draw(st.floats(0, 1e4)),
                    byte_rate=draw(st.floats(0, 5e7)),
                    producers=draw(st.integers(0, 5)),
                    consumers=draw(st.integers(0, 5)),
                    backlog=draw(st.integers(0, 100_000)),
                )
            )
            created[topic] = draw(st.floats(0, 2000))
        reports[b] = LoadReport(
            b, 0.0, draw(st.floats(0, 100)), draw(st.floats(0, 100)), topics=tuple(topics)
        )
        assignments[b] = tuple(t.topic for t in topics)
        states[b] = BrokerState(draw(MODES))
    return ClusterSnapshot(brokers, reports, states, assignments, created)


@st.composite
def histories(draw: st.DrawFn, snap: ClusterSnapshot) -> MoveHistory:
    topics = [t for ts in snap.assignments.values() for t in ts] or ["/default/x"]
    moves = [
        Move(draw(st.sampled_from(topics)), "b0", "b1", timestamp=draw(st.floats(0, 2000)))
        for _ in range(draw(st.integers(0, 12)))
    ]
    return MoveHistory.of(moves)


def config(enabled: bool = True) -> RebalancingConfig:
    return parse_config(
        {
            "load_manager": {
                "rebalancing": {
                    "enabled": enabled,
                    "max_moves_per_hour": 5,
                    "cooldown_seconds": 120,
                    "min_topic_age_seconds": 300,
                    "cv_threshold": 0.2,
                    "blacklist_topics": ["/system/*", "/default/critical-*"],
                }
            }
        }
    ).load_manager.rebalancing


@settings(max_examples=150, deadline=None)
@given(snapshots(), STRATEGIES, st.sampled_from(list(MarkerReason)), st.data())
def test_new_topic_goes_to_an_active_broker_never_the_source(
    snap: ClusterSnapshot, strategy: Strategy, reason: MarkerReason, data: st.DataObject
) -> None:
    source = data.draw(st.sampled_from(snap.brokers))
    hint = data.draw(st.sampled_from((None, *snap.brokers)))
    marker = UnassignedMarker(reason, from_broker=source, to_broker=hint)
    p = select_broker(snap, strategy, marker, data.draw(st.sampled_from((None, *snap.brokers))))
    if p.broker is None:
        assert all(b == source or not snap.state(b).is_active for b in snap.brokers)
    else:
        assert snap.state(p.broker).is_active
        assert p.broker != source


@settings(max_examples=200, deadline=None)
@given(snapshots(), STRATEGIES, st.floats(0, 4000), st.booleans(), st.data())
def test_every_move_is_safe_and_strictly_reduces_imbalance(
    snap: ClusterSnapshot, strategy: Strategy, now: float, episode: bool, data: st.DataObject
) -> None:
    history = data.draw(histories(snap))
    c = config()
    d = decide_rebalance(snap, history, now, c, strategy, episode)
    again = decide_rebalance(snap, history, now, c, strategy, episode)
    assert d == again  # deterministic
    if d.move is None:
        return
    m = d.move
    assert m.from_broker != m.to_broker
    assert snap.state(m.to_broker).is_active
    assert m.topic in snap.topics_of(m.from_broker)
    assert not is_blacklisted(m.topic, c.blacklist_topics)
    assert now - snap.topic_created[m.topic] >= c.min_topic_age_seconds
    assert m.topic not in history.recently_moved(now, c.cooldown_seconds)
    assert len(history.in_window(now)) < c.max_moves_per_hour
    assert history.cooldown_left(now, c.cooldown_seconds) == 0
    assert d.after is not None
    before = sum_squared_deviations(active_scores(snap, strategy))
    after = sum_squared_deviations(active_scores(d.after, strategy))
    assert after < before


@settings(max_examples=40, deadline=None)
@given(snapshots(), STRATEGIES, st.integers(1, 40))
def test_rate_limit_holds_over_any_simulated_history(
    snap: ClusterSnapshot, strategy: Strategy, cycles: int
) -> None:
    c = config()
    history, episode, now = MoveHistory(), False, 1000.0
    for _ in range(cycles):
        d = decide_rebalance(snap, history, now, c, strategy, episode)
        episode = d.episode
        if d.move is not None and d.after is not None:
            history, snap = history.add(d.move), d.after
        now += 150.0
    times = [m.timestamp for m in history.moves]
    for t in times:
        assert sum(1 for u in times if t <= u < t + 3600) <= c.max_moves_per_hour
    assert all(b - a >= c.cooldown_seconds for a, b in pairwise(times))


@settings(max_examples=50, deadline=None)
@given(snapshots(), STRATEGIES, st.floats(0, 4000))
def test_disabled_never_moves(snap: ClusterSnapshot, strategy: Strategy, now: float) -> None:
    d = decide_rebalance(snap, MoveHistory(), now, config(enabled=False), strategy, True)
    assert d.move is None and d.rule == "disabled"
