"""Noise must not move topics: smoothing, the spread floor, no overshoot, the return window."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.balance import (
    MoveHistory,
    decide_rebalance,
    place_topics,
    plan_failover,
    select_broker,
)
from ballast.balance.estimate import add_topic
from ballast.balance.smoothing import smooth_report
from ballast.config import RebalancingConfig, Strategy, parse_config
from ballast.model import ClusterSnapshot, LoadReport, TopicLoad, UnassignedMarker
from tests.balance.test_properties import STRATEGIES, snapshots


def cfg(**over: object) -> RebalancingConfig:
    data = {
        "enabled": True,
        "aggressiveness": "aggressive",
        "min_topic_age_seconds": 0,
        "cooldown_seconds": 1,
        "max_moves_per_hour": 10_000,
        **over,
    }
    return parse_config({"load_manager": {"rebalancing": data}}).load_manager.rebalancing


def idle(broker: str, cpu: float, mem: float, topics: int, start: int = 0) -> LoadReport:
    names = tuple(TopicLoad(f"/default/t{start + i}") for i in range(topics))
    return LoadReport(broker, 0.0, cpu, mem, topics=names)


def snapshot_of(*reports: LoadReport) -> ClusterSnapshot:
    return ClusterSnapshot(
        tuple(r.broker_id for r in reports),
        {r.broker_id: r for r in reports},
        assignments={r.broker_id: tuple(t.topic for t in r.topics) for r in reports},
    )


def test_smoothing_is_seeded_with_the_first_sample_then_weighted() -> None:
    first = LoadReport("b1", 0.0, cpu_percent=10.0, memory_percent=50.0)
    assert smooth_report(None, first, 0.9) == first
    second = smooth_report(first, LoadReport("b1", 1.0, cpu_percent=20.0), 0.9)
    assert second.cpu_percent == 11.0  # 0.9 * 10 + 0.1 * 20
    assert second.memory_percent == 45.0
    assert second.timestamp == 1.0


def test_idle_brokers_with_noisy_readings_do_not_move_anything() -> None:
    # Three idle brokers on one machine: a CV of 40 % over tiny numbers is noise.
    snap = snapshot_of(
        idle("b1", 1.5, 0.9, 10), idle("b2", 0.2, 0.5, 10, 10), idle("b3", 0.4, 0.6, 10, 20)
    )
    d = decide_rebalance(snap, MoveHistory(), 100.0, cfg(), Strategy.BALANCED)
    assert d.move is None
    assert d.rule == "noise-floor", d.explanation
    assert d.explanation.startswith("[noise-floor] score spread")


def test_a_move_never_overshoots() -> None:
    # b1 carries one heavy topic: moving it to b2 would just swap the two brokers.
    heavy = TopicLoad("/default/heavy", byte_rate=50e6, producers=5, consumers=5)
    b1 = LoadReport("b1", 0.0, 40.0, 40.0, topics=(heavy,))
    b2 = LoadReport("b2", 0.0, 5.0, 5.0)
    d = decide_rebalance(snapshot_of(b1, b2), MoveHistory(), 100.0, cfg(), Strategy.BALANCED)
    assert d.move is None


@settings(max_examples=150, deadline=None)
@given(snapshots(), STRATEGIES, st.floats(0, 4000), st.data())
def test_no_topic_returns_to_the_broker_it_left_within_the_window(
    snap: ClusterSnapshot, strategy: Strategy, now: float, data: st.DataObject
) -> None:
    """Replay decisions: apply each move, then ask again; never a return within the window."""
    window = data.draw(st.sampled_from([600.0, 3600.0]))
    c = cfg(return_window_seconds=window, min_imbalance=0, cooldown_seconds=0)
    history = MoveHistory()
    left: dict[str, list[tuple[str, float]]] = {}
    for step in range(12):
        t = now + step * 10.0
        d = decide_rebalance(snap, history, t, c, strategy, True)
        if d.move is None or d.after is None:
            break
        m = d.move
        for broker, when in left.get(m.topic, []):
            assert not (broker == m.to_broker and t - when < window), (m, left[m.topic])
        left.setdefault(m.topic, []).append((m.from_broker, t))
        history = history.add(m)
        snap = d.after


def test_failover_levels_out_the_survivors() -> None:
    # Fair, equal brokers: 150 topics of a dead broker onto survivors with 10/20/30/40.
    owned = {"b1": 10, "b2": 20, "b3": 30, "b4": 40, "dead": 150}
    assignments = {b: tuple(f"/default/{b}-{i}" for i in range(n)) for b, n in owned.items()}
    snap = ClusterSnapshot(tuple(owned), assignments=assignments)
    plan = plan_failover(snap, "dead", Strategy.FAIR)
    final = {b: n for b, n in owned.items() if b != "dead"}
    for _, placement in plan.placements:
        assert placement.broker is not None
        final[placement.broker] += 1
    assert sum(final.values()) == 250
    assert max(final.values()) - min(final.values()) <= 1, final


@settings(max_examples=100, deadline=None)
@given(snapshots(), STRATEGIES, st.data())
def test_bulk_placement_chooses_what_one_by_one_selection_chooses(
    snap: ClusterSnapshot, strategy: Strategy, data: st.DataObject
) -> None:
    """`place_topics` updates metric columns in place; the choices are `select_broker`'s."""
    n = data.draw(st.integers(1, 12))
    sources = data.draw(st.lists(st.sampled_from((None, *snap.brokers)), min_size=n, max_size=n))
    topics = [
        (f"/default/new-{i}", None if s is None else UnassignedMarker(from_broker=s))
        for i, s in enumerate(sources)
    ]
    plan = place_topics(snap, strategy, topics)
    reference, last = snap, None
    for (topic, marker), (_, placed) in zip(topics, plan.placements, strict=True):
        expected = select_broker(reference, strategy, marker, last)
        assert placed.broker == expected.broker
        if expected.broker is not None:
            reference = add_topic(reference, topic, expected.broker)
            last = expected.broker
