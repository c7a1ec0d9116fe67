"""The virtual-time simulator: the leader's own state machine on a simulated cluster.

A `StoreCore` (the synchronous core of `MemoryStore`: etcd's revisions, transactions and
watch events) holds the cluster's keys; simulated brokers register, publish load reports,
serve what is assigned to them and seal (instantly) what is taken away; the leader is
`LeaderMachine`, the very policy the live leader runs (failover, drain, placement, the two
phases of a move, rebalancing with Danube's rule or a Pulsar shedder, bundle placement and
automatic bundle splits), fed the store's changes and a tick per step, its writes performed
on the store as the live shell performs them (`leader.perform`). Each step (one
rebalancing check interval of virtual time) applies the scenario's events, publishes fresh
load reports and lets the cluster settle. Hours of rebalancing take seconds and the result
is deterministic for a seed. `Simulator.inputs` records every event its own shell feeds the
machine; `Simulator.leader` is that shell, which `tests/simulate/test_replay.py` replaces
with the live leader's `LeaderSession` to show both decide alike.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ballast.balance import Decision, MoveHistory
from ballast.balance.imbalance import measure
from ballast.balance.pulsar.bundles import BundleError, NamespaceBundles
from ballast.balance.rebalance import active_scores
from ballast.config import BallastConfig
from ballast.leader import Bootstrap, HistoryRecord, LeaderMachine, Ready, Tick, Watched
from ballast.leader import Event as MachineEvent
from ballast.leader.broker_machine import BrokerEffect, BrokerMachine, GiveBack, Load, Unload
from ballast.leader.perform import drive
from ballast.metadata import Put, keys
from ballast.metadata.core import StoreCore, watch_log
from ballast.metadata.records import (
    Registration,
    TopicMeta,
    claim_ops,
    leader_fence,
    leader_value,
)
from ballast.model import (
    Assignment,
    BrokerId,
    BrokerMode,
    BrokerState,
    ClusterSnapshot,
    LoadReport,
    MarkerReason,
    Move,
    TopicLoad,
    UnassignedMarker,
)
from ballast.simulate.scenario import BrokerSpec, Event, GrowSpec, Scenario, TopicSpec

EPOCH = 1_700_000_000.0  # virtual time starts here; scenario times are offsets
LEADER = "sim-leader"


def modelled_usage(
    loads: tuple[TopicLoad, ...], cpu_capacity: float = 1.0, mem_capacity: float = 1.0
) -> tuple[float, float]:
    """(CPU %, memory %) a broker serving `loads` shows, unclipped.

    A simple cost model: traffic and topic count cost CPU and memory, scaled by the
    broker's capacity, so heterogeneous hardware shows up in the Balanced score. A replay
    (`simulate.replay`) uses it for the part of a recorded broker's usage that follows
    its topics."""
    mbps = sum(t.byte_rate for t in loads) / 1e6
    kmsgs = sum(t.msg_rate for t in loads) / 1e3
    cpu = 2.0 + (1.5 * mbps + 0.5 * kmsgs + 0.02 * len(loads)) / cpu_capacity
    mem = 8.0 + (0.6 * mbps + 0.08 * len(loads)) / mem_capacity
    return cpu, mem


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
    """Runs one scenario; `run()` returns the whole timeline. `store` (default: a fresh
    `StoreCore` on the virtual clock) must be empty."""

    def __init__(self, scenario: Scenario, store: StoreCore | None = None) -> None:
        self.scenario = scenario
        self.lm = scenario.load_manager
        self.config = BallastConfig(load_manager=scenario.load_manager)
        self.rng = np.random.default_rng(scenario.seed)
        self.now = EPOCH
        self.store = store if store is not None else StoreCore(lambda: self.now)
        self.events = watch_log(self.store)  # every change, read by the brokers and the leader
        # The leader holds the leader key, as if elected: its create revision is the term
        # that fences the leader's writes.
        self.term = self.store.put(keys.LEADER, leader_value(LEADER, EPOCH))
        # Rankings are posted once per timeline sample: nobody reads them in between.
        self.machine = LeaderMachine(
            LEADER, self.term, self.config, rankings_interval=scenario.sample_every_seconds
        )
        # The leader's shell: steps the leader with an event, performs the `Ready` and what
        # its outcomes produce, and returns every `Ready` in order. The replay test puts the
        # live leader's `LeaderSession` here.
        self.leader: Callable[[MachineEvent], list[Ready]] = self._drive
        # Where the leader's load-history records go (`None`: dropped), as the live
        # leader's sink: a simulated cluster records a history a replay can read.
        self.history_sink: Callable[[HistoryRecord], None] | None = None
        self.inputs: list[MachineEvent] = []
        self.outputs: list[Ready] = []
        self.brokers: dict[BrokerId, BrokerSpec] = {}
        self.machines: dict[BrokerId, BrokerMachine] = {}  # each broker's reactions
        self.assignments: dict[BrokerId, list[str]] = {}
        self.topics: dict[str, _Topic] = {}
        self.result = SimResult(scenario)
        self._watched = 0  # store events delivered to the leader
        self._reacted = 0  # store events the brokers have acted on
        self._checks = 0
        # What the leader decided, as its `Ready`s tell (never read from its insides).
        self._decision: Decision | None = None
        self._moves: list[Move] = []

    # --- the simulated cluster ---------------------------------------------------------

    def _report(self, broker: BrokerId) -> LoadReport:
        spec = self.brokers[broker]
        loads = tuple(self.topics[t].load(self.now) for t in self.assignments[broker])
        cpu, mem = modelled_usage(loads, spec.cpu_capacity, spec.mem_capacity)
        mbps = sum(t.byte_rate for t in loads) / 1e6
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
        """The cluster as it really is (fresh reports, unsmoothed): for the timeline."""
        live = tuple(sorted(self.brokers))
        return ClusterSnapshot(
            brokers=live,
            reports={b: self._report(b) for b in live},
            states={b: self.machines[b].state for b in live},
            assignments={b: tuple(self.assignments[b]) for b in live},
            topic_created={name: t.created for name, t in self.topics.items()},
        )

    def _add_broker(self, spec: BrokerSpec) -> None:
        self.brokers[spec.id] = spec
        self.machines.setdefault(spec.id, BrokerMachine(spec.id)).state = BrokerState()
        self.assignments.setdefault(spec.id, [])
        self.store.put(keys.register(spec.id), Registration(f"{spec.id}:6650").to_dict())
        self.store.put(keys.broker_state(spec.id), BrokerState().to_dict())

    def _create_topics(self, spec: TopicSpec) -> None:
        rates = self.rng.lognormal(0.0, spec.skew, spec.count) if spec.skew else np.ones(spec.count)
        start = sum(1 for t in self.topics if t.startswith(f"/{spec.namespace}/{spec.prefix}-"))
        for i in range(spec.count):
            name = f"/{spec.namespace}/{spec.prefix}-{start + i:05d}"
            created = self.now - spec.age_seconds
            self.topics[name] = _Topic(
                name,
                created,
                spec.msg_rate * float(rates[i]),
                spec.byte_rate * float(rates[i]),
                spec.producers,
                spec.consumers,
            )
            meta = Put(keys.topic_meta(name), TopicMeta(created).to_dict())
            if spec.place_on:
                broker = spec.place_on[i % len(spec.place_on)]
                value = Assignment(self.now).to_dict()
                self.store.txn([], [meta, *claim_ops(broker, name, value)])
            else:
                marker = Put(keys.unassigned(name), UnassignedMarker(timestamp=self.now).to_dict())
                self.store.txn([], [meta, marker])

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
            state = BrokerState(BrokerMode.DRAINING, "scenario")
            self.store.put(keys.broker_state(event.drain_broker), state.to_dict())
        if event.kill_broker is not None:
            dead = event.kill_broker
            # The registration and the load report go with the lease.
            self.store.delete(keys.register(dead))
            self.store.delete(keys.load(dead))
            del self.brokers[dead], self.machines[dead], self.assignments[dead]

    def _publish_reports(self) -> None:
        for broker in sorted(self.brokers):
            self.store.put(keys.load(broker), self._report(broker).to_dict())

    # --- the brokers' side: `BrokerMachine`, sealing at once ----------------------------

    def _brokers_react(self) -> None:
        """Apply the store's changes the brokers have not seen yet (their own included)."""
        while self._reacted < len(self.events):
            event = self.events[self._reacted]
            self._reacted += 1
            key = event.key
            if not key.startswith(keys.BROKERS_PREFIX):
                continue
            if keys.is_broker_state_key(key):
                broker = keys.parse_broker_state_key(key)
            else:
                broker = keys.parse_assignment_key(key)[0]
            machine = self.machines.get(broker)
            if machine is None:
                continue
            for effect in machine.watched(event, self.now):
                self._perform(machine, effect)

    def _perform(self, machine: BrokerMachine, effect: BrokerEffect) -> None:
        broker = machine.broker_id
        if isinstance(effect, Load):
            self.assignments[broker].append(effect.topic)
            machine.loaded(effect.topic)
            self._record(effect.topic, broker, effect.marker)
        elif isinstance(effect, Unload):
            if effect.serving:
                self.assignments[broker].remove(effect.topic)
            self._seal(machine, effect.topic)
        elif isinstance(effect, GiveBack):
            self.store.txn(effect.compares, effect.ops)
        # A `Reject` cannot happen: the simulated cluster writes only good records.

    def _record(self, topic: str, broker: BrokerId, marker: UnassignedMarker | None) -> None:
        if marker is None or marker.from_broker is None:
            return
        row = (self.now, topic, marker.from_broker, broker)
        if marker.reason is MarkerReason.FAILOVER:
            self.result.failovers.append(row)
        elif marker.reason in (MarkerReason.UNLOAD, MarkerReason.DRAIN_REDIRECT):
            self.result.drains.append(row)

    def _seal(self, machine: BrokerMachine, topic: str) -> None:
        """The source has sealed at once: its marker is handed off as a seal hands it off
        (placed on the destination the move names, or made ready); made ready if the
        placement's conditions fail."""
        kv = self.store.get(keys.unassigned(topic))
        if kv is None:
            return
        handoff = machine.handoff(topic, kv.value, kv.mod_revision, self.now)
        if handoff is not None and self.store.txn(handoff.compares, handoff.ops).succeeded:
            return
        ready = machine.ready_marker(kv.value)
        if ready is not None:
            self.store.put(keys.unassigned(topic), ready)

    # --- the leader ---------------------------------------------------------------------

    def _drive(self, event: MachineEvent) -> list[Ready]:
        ready = self.machine.step(event)
        fence = (leader_fence(self.term),)
        return drive(self.machine, self.store, ready, self.now, fence=fence, inputs=self.inputs)

    def _step(self, event: MachineEvent) -> None:
        """Step the leader and perform its writes on the store (outcomes fed back)."""
        self.inputs.append(event)
        self._observe(self.leader(event))

    def _pump(self, event: MachineEvent | None = None) -> None:
        """Feed `event`, then deliver the store's changes to the brokers and the leader
        (as its watch would) until the cluster is quiet."""
        if event is not None:
            self._step(event)
        while True:
            self._brokers_react()
            if self._watched == len(self.events):
                return
            pending = tuple(self.events[self._watched :])
            self._watched = len(self.events)
            self._step(Watched(pending, self.now))

    @property
    def layouts(self) -> dict[str, NamespaceBundles]:
        """The bundle layouts stored so far (namespaces the leader has split)."""
        out: dict[str, NamespaceBundles] = {}
        for kv in self.store.get_prefix(keys.BUNDLES_PREFIX).items:
            try:
                out[keys.parse_bundles_key(kv.key)] = NamespaceBundles.from_dict(kv.value)
            except (BundleError, ValueError):
                continue
        return out

    def _observe(self, readies: list[Ready]) -> None:
        self.outputs += readies
        for ready in readies:
            if self.history_sink is not None:
                for record in ready.history:
                    self.history_sink(record)
            if ready.decision is not None:
                self._decision = ready.decision
            self._moves += ready.moved
            splits = sum(m.value for m in ready.metrics if m.name == "bundle_splits")
            if splits:
                self.result.rules["bundle-split"] += int(splits)
            if any(m.name == "checks" for m in ready.metrics):
                self._checks += 1
                decision = self._decision
                rule = decision.rule if decision is not None else "in-flight"
                self.result.rules[rule] += 1

    def _sample(self, rule: str) -> None:
        snap = self.snapshot()
        scores = active_scores(snap, self.lm.assignment_strategy)
        self.result.samples.append(
            Sample(
                t=self.now - EPOCH,
                cv=measure(scores).cv,
                moves=len(self._moves),
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
        self._brokers_react()
        self._publish_reports()
        self._watched = len(self.events)  # the listing covers them
        cluster = self.store.get_prefix(keys.CLUSTER_PREFIX)
        topics = self.store.get_prefix(keys.TOPICS_PREFIX)
        self._pump(Bootstrap(cluster, topics, self.now))
        self.result.initial_topics = {b: len(ts) for b, ts in sorted(self.assignments.items())}
        events = sorted(sc.events, key=lambda e: e.at)
        end = EPOCH + sc.duration_hours * 3600
        next_sample = EPOCH
        rule = "start"
        while self.now <= end:
            checks = self._checks  # a check may come with the reports' watch events too
            while events and EPOCH + events[0].at <= self.now:
                self._apply(events.pop(0))
            self._publish_reports()
            self._pump()
            self._pump(Tick(self.now))
            if self._checks > checks:
                decision = self._decision
                rule = decision.rule if decision is not None else "in-flight"
            if self.now >= next_sample:
                self._sample(rule)
                next_sample += sc.sample_every_seconds
            if progress is not None:
                progress((self.now - EPOCH) / (end - EPOCH))
            self.now += sc.step
        if self.result.samples[-1].t != self.now - sc.step - EPOCH:
            self.now -= sc.step
            self._sample(rule)
        self.result.moves = list(MoveHistory.of(self._moves).moves)
        self.result.final_topics = {b: len(ts) for b, ts in sorted(self.assignments.items())}
        return self.result


def simulate(scenario: Scenario, progress: Callable[[float], None] | None = None) -> SimResult:
    """Run `scenario` and return its result."""
    return Simulator(scenario).run(progress)
