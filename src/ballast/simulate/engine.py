"""The virtual-time simulator: the real decision core on a simulated cluster.

Each step (one rebalancing check interval of virtual time) applies the scenario's events,
fails over dead brokers, drains draining ones, places new topics, publishes fresh load
reports and asks the core for this cycle's move. Hours of rebalancing take seconds and the
result is deterministic for a seed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ballast.balance import MoveHistory, decide_rebalance, place_topics, plan_failover
from ballast.balance.bundles import NamespaceBundles
from ballast.balance.imbalance import measure
from ballast.balance.rebalance import active_scores
from ballast.balance.shedding import auto_split, prepare_snapshot
from ballast.config import PlacementUnit
from ballast.model import (
    BrokerId,
    BrokerMode,
    BrokerState,
    ClusterSnapshot,
    LoadReport,
    Move,
    TopicLoad,
)
from ballast.simulate.scenario import BrokerSpec, Event, GrowSpec, Scenario, TopicSpec

EPOCH = 1_700_000_000.0  # virtual time starts here; scenario times are offsets


@dataclass
class _Topic:
    name: str
    created: float
    msg_rate: float
    byte_rate: float
    producers: int
    consumers: int
    growth: tuple[float, float, float] | None = None  # (start, factor, over_seconds)

    def load(self, now: float) -> TopicLoad:
        m = 1.0
        if self.growth is not None:
            start, factor, over = self.growth
            progress = min(1.0, max(0.0, (now - start) / over))
            m = 1.0 + (factor - 1.0) * progress
        return TopicLoad(
            self.name,
            msg_rate=self.msg_rate * m,
            byte_rate=self.byte_rate * m,
            producers=self.producers,
            consumers=self.consumers,
            subscriptions=1 if self.consumers else 0,
        )


@dataclass(frozen=True)
class Sample:
    """One row of the timeline."""

    t: float
    cv: float
    moves: int
    scores: dict[BrokerId, float]
    topics: dict[BrokerId, int]
    rule: str


@dataclass
class SimResult:
    scenario: Scenario
    samples: list[Sample] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    failovers: list[tuple[float, str, BrokerId, BrokerId]] = field(default_factory=list)
    drains: list[tuple[float, str, BrokerId, BrokerId]] = field(default_factory=list)
    rules: Counter[str] = field(default_factory=Counter)
    initial_topics: dict[BrokerId, int] = field(default_factory=dict)
    final_topics: dict[BrokerId, int] = field(default_factory=dict)

    @property
    def final_cv(self) -> float:
        return self.samples[-1].cv if self.samples else 0.0

    @property
    def initial_cv(self) -> float:
        return self.samples[0].cv if self.samples else 0.0


class Simulator:
    """Runs one scenario; `run()` returns the whole timeline."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.lm = scenario.load_manager
        self.rng = np.random.default_rng(scenario.seed)
        self.brokers: dict[BrokerId, BrokerSpec] = {}
        self.states: dict[BrokerId, BrokerState] = {}
        self.assignments: dict[BrokerId, list[str]] = {}
        self.topics: dict[str, _Topic] = {}
        self.pending: list[str] = []  # created, not yet placed
        self.history = MoveHistory()
        self.episode = False
        self.shedder_state: dict[BrokerId, float] | None = None
        self.layouts: dict[str, NamespaceBundles] = {}  # bundles, when placed by bundle
        self.last_chosen: BrokerId | None = None
        self.now = EPOCH
        self.result = SimResult(scenario)

    # --- the simulated cluster ---------------------------------------------------------

    def _report(self, broker: BrokerId) -> LoadReport:
        spec = self.brokers[broker]
        loads = tuple(self.topics[t].load(self.now) for t in self.assignments[broker])
        mbps = sum(t.byte_rate for t in loads) / 1e6
        kmsgs = sum(t.msg_rate for t in loads) / 1e3
        # A simple cost model: traffic and topic count cost CPU and memory, scaled by the
        # broker's capacity, so heterogeneous hardware shows up in the Balanced score.
        cpu = 2.0 + (1.5 * mbps + 0.5 * kmsgs + 0.02 * len(loads)) / spec.cpu_capacity
        mem = 8.0 + (0.6 * mbps + 0.08 * len(loads)) / spec.mem_capacity
        return LoadReport(
            broker,
            self.now,
            cpu_percent=min(100.0, cpu),
            memory_percent=min(100.0, mem),
            disk_io_bps=mbps * 1e6 * 0.5,
            network_io_bps=mbps * 1e6 * 2,
            topics=loads,
        )

    def snapshot(self) -> ClusterSnapshot:
        live = tuple(sorted(self.brokers))
        snap = ClusterSnapshot(
            brokers=live,
            reports={b: self._report(b) for b in live},
            states={b: self.states[b] for b in live},
            assignments={b: tuple(self.assignments[b]) for b in live},
            topic_created={name: t.created for name, t in self.topics.items()},
        )
        return prepare_snapshot(snap, self.lm, self.layouts)

    def _add_broker(self, spec: BrokerSpec) -> None:
        self.brokers[spec.id] = spec
        self.states[spec.id] = BrokerState()
        self.assignments.setdefault(spec.id, [])

    def _create_topics(self, spec: TopicSpec) -> None:
        rates = self.rng.lognormal(0.0, spec.skew, spec.count) if spec.skew else np.ones(spec.count)
        start = sum(1 for t in self.topics if t.startswith(f"/{spec.namespace}/{spec.prefix}-"))
        for i in range(spec.count):
            name = f"/{spec.namespace}/{spec.prefix}-{start + i:05d}"
            self.topics[name] = _Topic(
                name,
                self.now - spec.age_seconds,
                spec.msg_rate * float(rates[i]),
                spec.byte_rate * float(rates[i]),
                spec.producers,
                spec.consumers,
            )
            if spec.place_on:
                self.assignments[spec.place_on[i % len(spec.place_on)]].append(name)
            else:
                self.pending.append(name)

    def _grow(self, spec: GrowSpec) -> None:
        names = sorted(t for t in self.topics if spec.prefix is None or spec.prefix in t)
        chosen = self.rng.choice(len(names), size=min(spec.count, len(names)), replace=False)
        for i in sorted(chosen.tolist()):
            self.topics[names[i]].growth = (self.now, spec.factor, spec.over_seconds)

    def _apply(self, event: Event) -> None:
        for spec in event.add_brokers:
            self._add_broker(spec)
        if event.create_topics is not None:
            self._create_topics(event.create_topics)
        if event.grow_topics is not None:
            self._grow(event.grow_topics)
        if event.drain_broker is not None:
            self.states[event.drain_broker] = BrokerState(BrokerMode.DRAINING, "scenario")
        if event.kill_broker is not None:
            self._fail_over(event.kill_broker)

    def _fail_over(self, dead: BrokerId) -> None:
        plan = plan_failover(
            self.snapshot(),
            dead,
            self.lm.assignment_strategy,
            self.last_chosen,
            pulsar=self.lm.pulsar,
        )
        del self.brokers[dead], self.states[dead], self.assignments[dead]
        for topic, placement in plan.placements:
            if placement.broker is None:
                self.pending.append(topic)
                continue
            self.assignments[placement.broker].append(topic)
            self.result.failovers.append((self.now, topic, dead, placement.broker))
        self.last_chosen = plan.last_chosen

    def _drain(self) -> None:
        for broker, state in list(self.states.items()):
            if state.mode is not BrokerMode.DRAINING:
                continue
            snap = self.snapshot()
            topics = list(self.assignments[broker])
            plan = place_topics(
                snap,
                self.lm.assignment_strategy,
                [(t, None) for t in topics],
                self.last_chosen,
                pulsar=self.lm.pulsar,
            )
            for topic, placement in plan.placements:
                if placement.broker is None or placement.broker == broker:
                    continue
                self.assignments[broker].remove(topic)
                self.assignments[placement.broker].append(topic)
                self.result.drains.append((self.now, topic, broker, placement.broker))
            self.last_chosen = plan.last_chosen
            if not self.assignments[broker]:
                self.states[broker] = BrokerState(BrokerMode.DRAINED, "scenario")

    def _place_pending(self) -> None:
        if not self.pending:
            return
        plan = place_topics(
            self.snapshot(),
            self.lm.assignment_strategy,
            [(t, None) for t in self.pending],
            self.last_chosen,
            pulsar=self.lm.pulsar,
        )
        self.pending = []
        for topic, placement in plan.placements:
            if placement.broker is None:
                self.pending.append(topic)
            else:
                self.assignments[placement.broker].append(topic)
        self.last_chosen = plan.last_chosen

    def _split(self) -> None:
        """Pulsar's automatic bundle split (placement by bundle); split topics re-placed."""
        if self.lm.placement_unit is not PlacementUnit.BUNDLE:
            return
        out = auto_split(self.snapshot(), self.lm.pulsar)
        self.layouts.update(out.layouts)
        self.result.rules["bundle-split"] += sum(1 for r in out.results if r.positions)
        for topic, broker in out.unload:
            self.assignments[broker].remove(topic)
            self.pending.append(topic)

    def _rebalance(self) -> str:
        snap = self.snapshot()
        d = decide_rebalance(
            snap,
            self.history,
            self.now,
            self.lm.rebalancing,
            self.lm.assignment_strategy,
            self.episode,
            pulsar=self.lm.pulsar,
            shedder_state=self.shedder_state,
        )
        self.episode = d.episode
        self.shedder_state = dict(d.shedder_state) if d.shedder_state else None
        self.result.rules[d.rule] += 1
        for m in d.moves or ((d.move,) if d.move is not None else ()):
            self.assignments[m.from_broker].remove(m.topic)
            self.assignments[m.to_broker].append(m.topic)
            self.history = self.history.add(m)
            self.result.moves.append(m)
        return d.rule

    def _sample(self, rule: str) -> None:
        snap = self.snapshot()
        scores = active_scores(snap, self.lm.assignment_strategy)
        self.result.samples.append(
            Sample(
                t=self.now - EPOCH,
                cv=measure(scores).cv,
                moves=len(self.result.moves),
                scores=scores,
                topics={b: len(self.assignments[b]) for b in sorted(self.brokers)},
                rule=rule,
            )
        )

    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        """Run the scenario to its end."""
        sc = self.scenario
        for b in sc.brokers:
            self._add_broker(b)
        for t in sc.topics:
            self._create_topics(t)
        self._place_pending()
        self.result.initial_topics = {b: len(ts) for b, ts in sorted(self.assignments.items())}
        events = sorted(sc.events, key=lambda e: e.at)
        end = EPOCH + sc.duration_hours * 3600
        next_sample = EPOCH
        rule = "start"
        while self.now <= end:
            while events and EPOCH + events[0].at <= self.now:
                self._apply(events.pop(0))
            self._drain()
            self._split()
            self._place_pending()
            rule = self._rebalance()
            if self.now >= next_sample:
                self._sample(rule)
                next_sample += sc.sample_every_seconds
            if progress is not None:
                progress((self.now - EPOCH) / (end - EPOCH))
            self.now += sc.step
        if self.result.samples[-1].t != self.now - sc.step - EPOCH:
            self.now -= sc.step
            self._sample(rule)
        self.result.final_topics = {b: len(ts) for b, ts in sorted(self.assignments.items())}
        return self.result


def simulate(scenario: Scenario, progress: Callable[[float], None] | None = None) -> SimResult:
    """Run `scenario` and return its result."""
    return Simulator(scenario).run(progress)
