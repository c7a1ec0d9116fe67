"""Replaying a recorded load history through the leader's machine.

`RecordedHistory` is the columnar history (the pipeline's compacted `topics` and
`brokers` tables, one time range) held as arrays; `Replay` runs the simulator on it
instead of a scenario's generators: a broker exists from its first report, drains when
its reports say ``draining``, and is gone once it has not reported for
`gone_after_seconds` (its topics fail over, as the live leader would do on the lost
lease); every topic's load is its latest recorded load wherever the replay placed it, so
a topic moved by the replay brings its recorded load to its new broker. Topics present in
the first interval start where they were recorded; topics that appear later are created
unassigned and placed by the replayed configuration's strategy.

A broker's CPU, memory, disk and network usage are split in two: the part the
simulator's cost model (`engine.modelled_usage`) explains from the topics it serves,
which follows the topics, and the rest (recorded minus modelled, per report), kept as
recorded. So with the recorded placement the replayed reports are the recorded ones.

What a replay cannot reproduce (docs/pipeline.md says it too): load that depended on placement
(a topic's rate throttled by an overloaded broker, consumers that fell behind during a
move), the recorded cost of serving a topic on a different broker (only the model's),
the exact moment of the live leader's checks (its phase is unknown: the replay checks
from the range's start), reports lost in flight, and the moves the live leader made
before the range (their cooldowns and return windows).

Everything here is pure: the history arrives as arrays and leaves as values.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ballast.balance.imbalance import measure
from ballast.balance.rebalance import active_scores
from ballast.config import LoadManagerConfig, Strategy
from ballast.leader import Bootstrap, Tick
from ballast.metadata import Put, keys
from ballast.metadata.records import TopicMeta, claim_ops
from ballast.model import (
    Assignment,
    BrokerId,
    BrokerMode,
    BrokerState,
    ClusterSnapshot,
    LoadReport,
    Move,
    TopicLoad,
    UnassignedMarker,
)
from ballast.simulate.engine import Simulator, _Topic, modelled_usage
from ballast.simulate.scenario import BrokerSpec, Scenario

MODES = (BrokerMode.ACTIVE, BrokerMode.DRAINING, BrokerMode.DRAINED)
# A topic already present when the range starts is "old enough" for the minimum-age rule:
# its creation time is not in the history.
OLD_TOPIC_AGE_SECONDS = 86_400.0
# A broker that misses this many report intervals is gone (the live lease, 32 s, is about
# one interval at the default 30 s: one missed report plus a late one is not a death).
GONE_AFTER_INTERVALS = 3.0


@dataclass(frozen=True, eq=False)
class RecordedHistory:
    """Reports of one time range, sorted by (timestamp, broker), as arrays.

    Report `i` was sent by `brokers[broker[i]]` at `time[i]` in mode `MODES[state[i]]`;
    its topics are rows `offsets[i]:offsets[i + 1]` of the topic arrays."""

    brokers: tuple[str, ...]
    topics: tuple[str, ...]
    time: np.ndarray
    broker: np.ndarray
    state: np.ndarray
    cpu: np.ndarray
    memory: np.ndarray
    disk: np.ndarray
    network: np.ndarray
    offsets: np.ndarray
    topic: np.ndarray
    msg_rate: np.ndarray
    byte_rate: np.ndarray
    producers: np.ndarray
    consumers: np.ndarray
    subscriptions: np.ndarray
    backlog: np.ndarray

    @property
    def reports(self) -> int:
        return int(self.time.size)

    @property
    def start(self) -> float:
        return float(self.time[0]) if self.time.size else 0.0

    @property
    def end(self) -> float:
        return float(self.time[-1]) if self.time.size else 0.0

    @property
    def report_interval(self) -> float:
        """The median gap between a broker's consecutive reports (30 s if unknown)."""
        gaps = []
        for b in range(len(self.brokers)):
            times = self.time[self.broker == b]
            if times.size > 1:
                gaps.append(np.diff(times))
        if not gaps:
            return 30.0
        return float(np.median(np.concatenate(gaps)))

    def loads(self, i: int) -> tuple[TopicLoad, ...]:
        """Report `i`'s topics."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        names = self.topics
        return tuple(
            TopicLoad(
                names[t],
                msg_rate=m,
                byte_rate=b,
                producers=p,
                consumers=c,
                subscriptions=s,
                backlog=k,
            )
            for t, m, b, p, c, s, k in zip(
                self.topic[lo:hi].tolist(),
                self.msg_rate[lo:hi].tolist(),
                self.byte_rate[lo:hi].tolist(),
                self.producers[lo:hi].tolist(),
                self.consumers[lo:hi].tolist(),
                self.subscriptions[lo:hi].tolist(),
                self.backlog[lo:hi].tolist(),
                strict=True,
            )
        )

    @classmethod
    def from_columns(cls, brokers: Mapping[str, Any], topics: Mapping[str, Any]) -> RecordedHistory:
        """From the columnar tables' columns (anything `np.asarray` takes: pandas, Arrow
        as NumPy, lists): `brokers` needs report_id, broker_id, timestamp, state,
        cpu_percent, memory_percent, disk_io_bps, network_io_bps; `topics` needs
        report_id, topic and the load fields. Duplicate report ids keep their first row."""
        rid = np.asarray(brokers["report_id"], dtype=np.int64)
        when = np.asarray(brokers["timestamp"], dtype=np.float64)
        names = np.asarray(brokers["broker_id"], dtype=object).astype(str)
        _, first = np.unique(rid, return_index=True)
        order = first[np.lexsort((names[first], when[first]))]
        broker_names, broker_index = np.unique(names[order], return_inverse=True)
        modes = [m.value for m in MODES]
        states = np.asarray(brokers["state"], dtype=object)[order]
        state = np.array(
            [modes.index(s) if s in modes else 0 for s in states.tolist()], dtype=np.int8
        )
        position = dict(zip(rid[order].tolist(), range(order.size), strict=True))

        t_rid = np.asarray(topics["report_id"], dtype=np.int64)
        parent = np.fromiter((position.get(r, -1) for r in t_rid.tolist()), np.int64, t_rid.size)
        keep = parent >= 0
        t_names = np.asarray(topics["topic"], dtype=object)[keep].astype(str)
        parent = parent[keep]
        row_order = np.lexsort((t_names, parent))
        topic_names, topic_index = np.unique(t_names[row_order], return_inverse=True)
        counts = np.bincount(parent, minlength=order.size)

        def column(table: Mapping[str, Any], name: str, rows: np.ndarray) -> np.ndarray:
            values = np.asarray(table[name], dtype=np.float64)
            return np.nan_to_num(values)[rows]

        kept = np.flatnonzero(keep)[row_order]

        def counts_of(name: str) -> np.ndarray:
            return column(topics, name, kept).astype(np.int64)

        return cls(
            brokers=tuple(broker_names.tolist()),
            topics=tuple(topic_names.tolist()),
            time=when[order],
            broker=broker_index.astype(np.int32),
            state=state,
            cpu=column(brokers, "cpu_percent", order),
            memory=column(brokers, "memory_percent", order),
            disk=column(brokers, "disk_io_bps", order),
            network=column(brokers, "network_io_bps", order),
            offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            topic=topic_index.astype(np.int32),
            msg_rate=column(topics, "msg_rate", kept),
            byte_rate=column(topics, "byte_rate", kept),
            producers=counts_of("producers"),
            consumers=counts_of("consumers"),
            subscriptions=counts_of("subscriptions"),
            backlog=counts_of("backlog"),
        )


@dataclass(frozen=True)
class RecordedMove:
    """A topic seen on a new broker while its former broker, active, still reported."""

    topic: str
    from_broker: BrokerId
    to_broker: BrokerId
    timestamp: float  # the new broker's first report of it


def recorded_moves(
    history: RecordedHistory, gone_after: float | None = None
) -> tuple[RecordedMove, ...]:
    """The live leader's rebalancing moves as the history shows them. A topic that changes
    broker is a move when its former broker was active and still reported within
    `gone_after` seconds after (else it was a failover or a drain, not a decision of the
    rebalancer)."""
    gone = gone_after if gone_after is not None else GONE_AFTER_INTERVALS * history.report_interval
    times = {b: history.time[history.broker == b] for b in range(len(history.brokers))}
    owner: dict[int, tuple[int, int]] = {}  # topic -> (broker, its mode then)
    out = []
    for i in range(history.reports):
        b, t = int(history.broker[i]), float(history.time[i])
        lo, hi = int(history.offsets[i]), int(history.offsets[i + 1])
        for topic in history.topic[lo:hi].tolist():
            previous = owner.get(topic)
            owner[topic] = (b, int(history.state[i]))
            if previous is None or previous[0] == b or previous[1] != 0:
                continue
            former = times[previous[0]]
            later = former[bisect_left(former.tolist(), t) :]
            if later.size and later[0] <= t + gone:
                out.append(
                    RecordedMove(
                        history.topics[topic],
                        history.brokers[previous[0]],
                        history.brokers[b],
                        t,
                    )
                )
    return tuple(out)


@dataclass(frozen=True)
class Fidelity:
    """How many of the live moves the replay made: same topic, same destination, within
    `tolerance_seconds`."""

    live_moves: int
    replay_moves: int
    reproduced: int
    tolerance_seconds: float

    @property
    def share(self) -> float:
        return self.reproduced / self.live_moves if self.live_moves else 1.0


def fidelity(
    live: tuple[RecordedMove, ...], replayed: tuple[Move, ...], tolerance: float
) -> Fidelity:
    """Match each live move with the nearest unused replayed move of the same topic and
    destination within `tolerance` seconds."""
    unused = list(replayed)
    reproduced = 0
    for move in sorted(live, key=lambda m: m.timestamp):
        candidates = [
            (abs(r.timestamp - move.timestamp), k)
            for k, r in enumerate(unused)
            if r.topic == move.topic
            and r.to_broker == move.to_broker
            and abs(r.timestamp - move.timestamp) <= tolerance
        ]
        if candidates:
            unused.pop(min(candidates)[1])
            reproduced += 1
    return Fidelity(len(live), len(replayed), reproduced, tolerance)


@dataclass(frozen=True)
class ReplayOptions:
    """How a replay steps and what it measures (the same for every configuration of a
    tuning run, so that their results compare)."""

    step_seconds: float | None = None  # default: the recorded report interval
    gone_after_seconds: float | None = None  # default: GONE_AFTER_INTERVALS intervals
    measure_strategy: Strategy | None = None  # CV over these scores; default: the config's
    overload_percent: float = 85.0  # a broker above this CPU % is overloaded
    recorded_cv: bool = False  # also measure the recorded placement's CV at each step


@dataclass(frozen=True)
class ReplaySample:
    t: float  # epoch seconds
    cv: float
    recorded_cv: float | None
    overloaded: int  # brokers above `overload_percent` CPU
    brokers: int


@dataclass(frozen=True)
class ReplayResult:
    load_manager: LoadManagerConfig
    step_seconds: float
    samples: tuple[ReplaySample, ...]
    moves: tuple[Move, ...]
    moved_mbps: float  # recorded throughput of the moved topics when they moved
    failovers: int
    drains: int
    placed: int  # topics that appeared during the range (placed by the strategy)


@dataclass
class _Usage:
    """A broker's recorded usage minus what the cost model explains (kept as recorded)."""

    cpu: float = 0.0
    memory: float = 0.0
    disk: float = 0.0
    network: float = 0.0


def _modelled(loads: tuple[TopicLoad, ...]) -> tuple[float, float, float, float]:
    cpu, mem = modelled_usage(loads)
    mbps = sum(t.byte_rate for t in loads) / 1e6
    return cpu, mem, mbps * 1e6 * 0.5, mbps * 1e6 * 2


def _clip(value: float, top: float | None = None) -> float:
    value = max(0.0, value)
    return min(top, value) if top is not None else value


class Replay(Simulator):
    """One replay of `history` under `load_manager` (see the module docstring)."""

    def __init__(
        self,
        history: RecordedHistory,
        load_manager: LoadManagerConfig,
        options: ReplayOptions = ReplayOptions(),
    ) -> None:
        interval = history.report_interval
        step = options.step_seconds or interval
        scenario = Scenario(
            name="replay",
            brokers=(),
            load_manager=load_manager,
            step_seconds=step,
            sample_every_seconds=step,
        )
        super().__init__(scenario)
        self.history = history
        self.options = options
        self.step = step
        self.gone_after = options.gone_after_seconds or GONE_AFTER_INTERVALS * interval
        self.measure_strategy = options.measure_strategy or load_manager.assignment_strategy
        self._cursor = 0
        self._loads: dict[str, TopicLoad] = {}
        self._usage: dict[BrokerId, _Usage] = {}
        self._last_seen: dict[BrokerId, float] = {}
        self._recorded: dict[BrokerId, tuple[LoadReport, BrokerMode]] = {}
        self._draining: set[BrokerId] = set()
        self._placed = 0
        self._moved_mbps = 0.0
        self._samples: list[ReplaySample] = []
        self._recorded_owner: dict[str, BrokerId] = {}  # where the first interval had them

    # --- the recorded cluster -----------------------------------------------------------

    def _consume(self, until: float) -> dict[BrokerId, BrokerMode]:
        """Read the reports up to `until`: the brokers that reported, with their mode."""
        h = self.history
        reported: dict[BrokerId, BrokerMode] = {}
        while self._cursor < h.reports and h.time[self._cursor] <= until:
            i = self._cursor
            self._cursor += 1
            broker = h.brokers[int(h.broker[i])]
            loads = h.loads(i)
            for load in loads:
                self._loads[load.topic] = load
            cpu, mem, disk, net = _modelled(loads)
            self._usage[broker] = _Usage(
                float(h.cpu[i]) - cpu,
                float(h.memory[i]) - mem,
                float(h.disk[i]) - disk,
                float(h.network[i]) - net,
            )
            mode = MODES[int(h.state[i])]
            self._last_seen[broker] = float(h.time[i])
            if self.options.recorded_cv:
                report = LoadReport(
                    broker,
                    float(h.time[i]),
                    cpu_percent=float(h.cpu[i]),
                    memory_percent=float(h.memory[i]),
                    disk_io_bps=float(h.disk[i]),
                    network_io_bps=float(h.network[i]),
                    topics=loads,
                )
                self._recorded[broker] = (report, mode)
            reported[broker] = mode
        return reported

    def _report(self, broker: BrokerId) -> LoadReport:
        loads = tuple(self._loads[t] for t in self.assignments[broker])
        cpu, mem, disk, net = _modelled(loads)
        usage = self._usage.get(broker, _Usage())
        return LoadReport(
            broker,
            self.now,
            cpu_percent=_clip(cpu + usage.cpu, 100.0),
            memory_percent=_clip(mem + usage.memory, 100.0),
            disk_io_bps=_clip(disk + usage.disk),
            network_io_bps=_clip(net + usage.network),
            topics=loads,
        )

    def _new_topics(self, created: float, place: bool) -> None:
        """Create the topics seen for the first time: where recorded (`place`), or
        unassigned for the replayed strategy to place."""
        for name in sorted(set(self._loads) - set(self.topics)):
            self.topics[name] = _Topic(name, created, 0.0, 0.0, 0, 0)
            meta = Put(keys.topic_meta(name), TopicMeta(created).to_dict())
            owner = self._recorded_owner.get(name) if place else None
            if owner is not None and owner in self.brokers:
                value = Assignment(self.now).to_dict()
                self.store.txn([], [meta, *claim_ops(owner, name, value)])
            else:
                self._placed += 1
                marker = Put(keys.unassigned(name), UnassignedMarker(timestamp=self.now).to_dict())
                self.store.txn([], [meta, marker])

    def _follow(self, reported: dict[BrokerId, BrokerMode]) -> None:
        """Brokers appear, drain, come back to service and disappear as recorded."""
        for broker, mode in sorted(reported.items()):
            if broker not in self.brokers:
                self._add_broker(BrokerSpec(id=broker))
                self._draining.discard(broker)
            draining = mode is not BrokerMode.ACTIVE
            if draining and broker not in self._draining:
                state = BrokerState(BrokerMode.DRAINING, "recorded")
                self.store.put(keys.broker_state(broker), state.to_dict())
                self._draining.add(broker)
            elif not draining and broker in self._draining:
                self.store.put(keys.broker_state(broker), BrokerState().to_dict())
                self._draining.discard(broker)
        for broker in sorted(self.brokers):
            if self.now - self._last_seen.get(broker, self.now) > self.gone_after:
                # The registration and the load report go with the lease.
                self.store.delete(keys.register(broker))
                self.store.delete(keys.load(broker))
                del self.brokers[broker], self.machines[broker], self.assignments[broker]
                self._draining.discard(broker)

    # --- measuring ----------------------------------------------------------------------

    def _recorded_cv(self) -> float:
        live = {
            b: rm
            for b, rm in self._recorded.items()
            if self.now - self._last_seen[b] <= self.gone_after
        }
        snap = ClusterSnapshot(
            brokers=tuple(sorted(live)),
            reports={b: r for b, (r, _) in live.items()},
            states={b: BrokerState(mode) for b, (_, mode) in live.items()},
            assignments={b: tuple(t.topic for t in r.topics) for b, (r, _) in live.items()},
        )
        return measure(active_scores(snap, self.measure_strategy)).cv

    def _measure(self) -> None:
        snap = self.snapshot()
        cv = measure(active_scores(snap, self.measure_strategy)).cv
        overloaded = sum(
            1 for r in snap.reports.values() if r.cpu_percent > self.options.overload_percent
        )
        recorded = self._recorded_cv() if self.options.recorded_cv else None
        self._samples.append(ReplaySample(self.now, cv, recorded, overloaded, len(snap.brokers)))

    # --- the run ------------------------------------------------------------------------

    def replay(self, progress: Callable[[float], None] | None = None) -> ReplayResult:
        """Replay the whole range; return what the replayed leader did and the cluster's
        imbalance at every step."""
        h = self.history
        start = h.start
        self.now = start
        # The first interval holds every broker's first report: the cluster as it was.
        first = self._consume(start + self.step * 0.999)
        for i in range(self._cursor):
            broker = h.brokers[int(h.broker[i])]
            for load in h.loads(i):
                self._recorded_owner[load.topic] = broker
        self._follow(first)
        self._new_topics(start - OLD_TOPIC_AGE_SECONDS, place=True)
        self._placed = 0
        self._brokers_react()
        for broker in sorted(first):
            self.store.put(keys.load(broker), self._report(broker).to_dict())
        self._watched = len(self.events)  # the listing covers them
        cluster = self.store.get_prefix(keys.CLUSTER_PREFIX)
        topics = self.store.get_prefix(keys.TOPICS_PREFIX)
        self._pump(Bootstrap(cluster, topics, self.now))
        self._measure()
        end = h.end
        counted = 0
        while self.now < end:
            # The last step ends with the history: past it there is nothing to learn, and
            # a check there would decide on data the live leader never had.
            self.now = min(self.now + self.step, end)
            reported = self._consume(self.now)
            self._follow(reported)
            self._new_topics(self.now, place=False)
            for broker in sorted(reported):
                if broker in self.brokers:
                    self.store.put(keys.load(broker), self._report(broker).to_dict())
            self._pump()
            self._pump(Tick(self.now))
            for move in self._moves[counted:]:
                moved = self._loads.get(move.topic)
                self._moved_mbps += moved.throughput_mbps if moved is not None else 0.0
            counted = len(self._moves)
            self._measure()
            if progress is not None and end > start:
                progress((self.now - start) / (end - start))
        return ReplayResult(
            load_manager=self.lm,
            step_seconds=self.step,
            samples=tuple(self._samples),
            moves=tuple(self._moves),
            moved_mbps=self._moved_mbps,
            failovers=len(self.result.failovers),
            drains=len(self.result.drains),
            placed=self._placed,
        )


def replay(
    history: RecordedHistory,
    load_manager: LoadManagerConfig,
    options: ReplayOptions = ReplayOptions(),
    progress: Callable[[float], None] | None = None,
) -> ReplayResult:
    """Replay `history` through the leader's machine under `load_manager`."""
    return Replay(history, load_manager, options).replay(progress)
