"""Issue 23: a broker's idle host load stays with the host when topics move.

An empty broker that has just joined reports its host's idle CPU and memory. Only the load
above that baseline travels with topics, so a useful move from a loaded broker to an idle
one is estimated as it will really turn out, not refused as an overshoot. The property
test drives the decision against a ground truth (the readings the next reports would
show) and checks liveness (a useful move is made within the rate limits) together with
the noise guarantees (no overshoot, no return within the window).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hypothesis import event, given, settings
from hypothesis import strategies as st

from ballast.balance import MoveHistory, decide_rebalance
from ballast.balance.estimate import apply_move, idle_baseline, remove_broker, topic_weight
from ballast.balance.imbalance import measure, sum_squared_deviations
from ballast.balance.rebalance import active_scores
from ballast.config import RebalancingConfig, Strategy
from ballast.model import ClusterSnapshot, LoadReport, TopicLoad
from tests.balance.test_noise import cfg


@dataclass(frozen=True)
class Truth:
    """What the brokers would really report: every host idles at the same CPU and memory;
    each topic adds CPU and memory in proportion to its weighted load (`cpu_per_weight`)."""

    brokers: tuple[str, ...]
    loads: Mapping[str, TopicLoad]
    idle_cpu: float
    idle_mem: float
    cpu_per_weight: float
    mem_per_weight: float

    def snapshot(self, owner: Mapping[str, str]) -> ClusterSnapshot:
        assignments = {
            b: tuple(sorted(t for t, o in owner.items() if o == b)) for b in self.brokers
        }
        reports = {}
        for b, topics in assignments.items():
            weight = sum(topic_weight(self.loads[t]) for t in topics)
            reports[b] = LoadReport(
                b,
                0.0,
                self.idle_cpu + self.cpu_per_weight * weight,
                self.idle_mem + self.mem_per_weight * weight,
                topics=tuple(self.loads[t] for t in topics),
            )
        return ClusterSnapshot(self.brokers, reports, assignments=assignments)


def two_brokers_one_idle() -> ClusterSnapshot:
    """The issue's case: equal readings, b1 holds two topics of different weights, b2 has
    just joined and holds nothing."""
    light = TopicLoad("/default/light", byte_rate=10e6, producers=3, consumers=6)  # w 5.9
    heavy = TopicLoad("/default/heavy", byte_rate=30e6, producers=4, consumers=12)  # w 14
    b1 = LoadReport("b1", 0.0, 10.0, 10.0, topics=(light, heavy))
    b2 = LoadReport("b2", 0.0, 10.0, 10.0)
    return ClusterSnapshot(
        ("b1", "b2"),
        {"b1": b1, "b2": b2},
        assignments={"b1": ("/default/heavy", "/default/light"), "b2": ()},
    )


def test_danube_moves_a_topic_to_a_new_idle_broker_reporting_its_host_load() -> None:
    # Danube's scale-out promise: a broker that joins receives topics. Before issue 23 the
    # estimate moved 30 % of b1's whole CPU and memory with the light topic, predicted an
    # overshoot (b1 12.97 → 9.12, b2 7 → 10.85) and answered "[no-regret] moving
    # /default/light ... does not reduce imbalance" for ever.
    snap = two_brokers_one_idle()
    d = decide_rebalance(snap, MoveHistory(), 100.0, cfg(), Strategy.BALANCED)
    assert d.rule == "move", d.explanation
    assert d.move is not None and d.after is not None
    assert (d.move.topic, d.move.from_broker, d.move.to_broker) == ("/default/light", "b1", "b2")
    # The host load stays where it is: both brokers still read 10 % CPU and memory.
    for b in ("b1", "b2"):
        assert (d.after.reports[b].cpu_percent, d.after.reports[b].memory_percent) == (10, 10)


def test_idle_baseline_is_the_reading_of_a_broker_without_topics() -> None:
    assert idle_baseline(two_brokers_one_idle()) == (10.0, 10.0, 0.0, 0.0)


def test_idle_baseline_without_an_idle_broker_is_the_fitted_intercept() -> None:
    # cpu = 10 + 2 * weighted topic load, mem = 20 + 1 * load: the intercept is the host's.
    loads = {f"/default/t{i}": TopicLoad(f"/default/t{i}", byte_rate=i * 1e6) for i in range(4)}
    truth = Truth(("b1", "b2", "b3"), loads, 10.0, 20.0, 2.0, 1.0)
    owner = {"/default/t0": "b1", "/default/t1": "b2", "/default/t2": "b2", "/default/t3": "b3"}
    cpu, mem, disk, net = idle_baseline(truth.snapshot(owner))
    assert (round(cpu, 9), round(mem, 9), disk, net) == (10.0, 20.0, 0.0, 0.0)


def test_idle_baseline_never_exceeds_the_least_reading_nor_goes_below_zero() -> None:
    snap = ClusterSnapshot(
        ("b1", "b2"),
        {
            # One topic each, loads 0.2 and 0.5: the line through (0.2, 50) and (0.5, 5)
            # crosses zero load at 80 (above the least reading, 5); memory's at -2.
            "b1": LoadReport("b1", 0.0, 50.0, 0.0, topics=(TopicLoad("/default/a"),)),
            "b2": LoadReport("b2", 0.0, 5.0, 3.0, topics=(TopicLoad("/default/b", byte_rate=1e6),)),
        },
        assignments={"b1": ("/default/a",), "b2": ("/default/b",)},
    )
    assert idle_baseline(snap) == (5.0, 0.0, 0.0, 0.0)


def test_failover_orphans_carry_only_their_load_above_the_idle_baseline() -> None:
    snap = two_brokers_one_idle()
    _, orphans = remove_broker(snap, "b1")
    assert [(t, r) for t, _, r in orphans] == [
        ("/default/heavy", (0.0, 0.0, 0.0, 0.0)),
        ("/default/light", (0.0, 0.0, 0.0, 0.0)),
    ]


def test_the_estimate_matches_the_next_reports_under_the_host_plus_topics_model() -> None:
    loads = {f"/default/t{i}": TopicLoad(f"/default/t{i}", byte_rate=i * 1e6) for i in range(5)}
    truth = Truth(("b1", "b2", "b3"), loads, 12.0, 25.0, 1.5, 0.5)
    owner = {t: "b1" for t in loads} | {"/default/t4": "b2"}
    after = apply_move(truth.snapshot(owner), "/default/t3", "b1", "b3")
    real = truth.snapshot(owner | {"/default/t3": "b3"})
    for b in truth.brokers:
        assert abs(after.reports[b].cpu_percent - real.reports[b].cpu_percent) < 1e-9
        assert abs(after.reports[b].memory_percent - real.reports[b].memory_percent) < 1e-9


MARGIN = 1e-6


def useful_moves(
    truth: Truth,
    owner: Mapping[str, str],
    strategy: Strategy,
    history: MoveHistory,
    now: float,
    config: RebalancingConfig,
) -> list[tuple[str, str, str]]:
    """Every one-topic move the rules allow that strictly reduces the spread (max - min) of
    the *actual* post-move scores without the source ending below the target."""
    scores = active_scores(truth.snapshot(owner), strategy)
    spread = max(scores.values()) - min(scores.values())
    cooling = history.recently_moved(now, config.cooldown_seconds)
    window = config.return_window_seconds
    found = []
    for topic, source in sorted(owner.items()):
        if topic in cooling:
            continue
        for target in truth.brokers:
            left = any(
                m.topic == topic and m.from_broker == target and now - m.timestamp < window
                for m in history.moves
            )
            if target == source or left:
                continue
            after = active_scores(truth.snapshot({**owner, topic: target}), strategy)
            if (
                max(after.values()) - min(after.values()) < spread - MARGIN
                and after[source] >= after[target] + MARGIN
            ):
                found.append((topic, source, target))
    return found


@st.composite
def truths(draw: st.DrawFn) -> tuple[Truth, dict[str, str]]:
    n = draw(st.integers(2, 5))
    brokers = tuple(f"b{i}" for i in range(n))
    count = draw(st.integers(1, 12))
    loads = {}
    for i in range(count):
        name = f"/default/t{i:02d}"
        loads[name] = TopicLoad(
            name,
            byte_rate=draw(st.integers(0, 20)) * 1e6,
            producers=draw(st.integers(0, 3)),
            consumers=draw(st.integers(0, 3)),
        )
    # Often several brokers hold nothing (just joined); sometimes every broker holds some.
    used = draw(st.integers(1, n))
    owner = {t: brokers[draw(st.integers(0, used - 1))] for t in loads}
    truth = Truth(
        brokers,
        loads,
        float(draw(st.integers(0, 40))),
        float(draw(st.integers(0, 40))),
        draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
        draw(st.sampled_from([0.0, 0.25, 1.0])),
    )
    return truth, owner


@settings(max_examples=120, deadline=None)
@given(
    truths(),
    st.sampled_from([Strategy.FAIR, Strategy.BALANCED]),
    st.sampled_from([1, 3]),
    st.sampled_from([20.0, 60.0, 400.0]),
)
def test_a_useful_move_is_made_within_the_rate_limits_and_never_returns(
    world: tuple[Truth, dict[str, str]], strategy: Strategy, per_hour: int, step: float
) -> None:
    """Replay decisions against the ground truth (each move is followed by the reports the
    brokers would then send). At every check: when a one-topic move the rules allow would
    strictly reduce the actual score spread without overshooting, the cycle is above its CV
    threshold and the noise floor, and the rate limits leave a slot, a move is made; with
    no slot, the hold names the rate limit. Every move strictly lowers the actual imbalance
    without overshoot, never exceeds `max_moves_per_hour`, and no topic returns to a broker
    it left within the return window. (Linear strategies: for WeightedLoad a useful move
    need not be from the most to the least loaded broker.)"""
    truth, owner = world
    config = cfg(
        max_moves_per_hour=per_hour,
        cooldown_seconds=60,
        min_imbalance=1.0,
        return_window_seconds=3600,
    )
    history, episode = MoveHistory(), False
    for i in range(10):
        now = 1000.0 + i * step
        snap = truth.snapshot(owner)
        scores = active_scores(snap, strategy)
        stats = measure(scores)
        d = decide_rebalance(snap, history, now, config, strategy, episode)
        above = stats.cv >= config.target_cv if episode else stats.cv > config.cv_threshold
        worth = above and stats.max - stats.min >= config.min_imbalance
        slot = (
            history.next_rate_slot(now, per_hour) == 0
            and history.cooldown_left(now, config.cooldown_seconds) == 0
        )
        if worth and useful_moves(truth, owner, strategy, history, now, config):
            if slot:
                event("a useful move and a free slot")
                assert d.rule == "move", d.explanation
            else:
                assert d.rule in ("rate-limit", "cooldown"), d.explanation
        if d.move is None:
            episode = d.episode
            continue
        m = d.move
        assert slot, d.explanation
        assert not any(
            p.topic == m.topic and p.from_broker == m.to_broker and now - p.timestamp < 3600
            for p in history.moves
        ), (m, history.moves)
        owner = {**owner, m.topic: m.to_broker}
        real = active_scores(truth.snapshot(owner), strategy)
        assert real[m.from_broker] >= real[m.to_broker] - 1e-9, (m, scores, real)
        assert sum_squared_deviations(real) < sum_squared_deviations(scores), (m, scores, real)
        history = history.add(m)
        assert len(history.in_window(now)) <= per_hour
        episode = d.episode
