"""`LoadManager`: the leader's shell. It decides nothing itself: `LeaderMachine` does.

While this broker leads (see `LeaderElection`), a `LeaderSession`:

1. lists ``/cluster/`` and ``/topics/`` and feeds them to a fresh `LeaderMachine`
   (`ballast.leader`), then watches both prefixes from the listed revisions + 1;
2. feeds every batch of watch events, and a tick every `rankings_interval`, to the
   machine (`step`), reading the clock once per step;
3. performs the effects of each `Ready` in their documented order: the writes (each a
   transaction fenced on the leader key; a bounded number at once), whose outcomes it
   feeds back (a failed write comes back with its keys read again: the machine drops the
   decision and decides again from that fresh state; a write refused by the fence ends
   the term), then load-history records, metrics and log lines; rankings go to a task
   of their own that posts the latest (the step loop never waits for that write).

The policy (failover, drain, the two phases of a move, seal timeout, placement,
rebalancing) is in the machine; this module only owns I/O, time and tasks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from ballast.aio import first_completed
from ballast.balance import Decision, MoveHistory
from ballast.clock import Clock
from ballast.cluster.election import FenceLost, LeaderElection, Term
from ballast.cluster.metrics import ClusterMetrics
from ballast.cluster.service import Service, watching
from ballast.config import BallastConfig
from ballast.leader import (
    Bootstrap,
    LeaderMachine,
    MetricDelta,
    Ready,
    Refreshed,
    Tick,
    Watched,
    Write,
    WriteDone,
)
from ballast.leader.perform import WRITES_IN_FLIGHT, ReadyQueue, refreshed
from ballast.leader.reachability import (
    Evict,
    ReachabilityRule,
    ReachabilitySnapshot,
    Restore,
    decide,
)
from ballast.load_history import HistoryWriter
from ballast.metadata import (
    Compare,
    Delete,
    MetadataError,
    MetadataStore,
    OutcomeUnknownError,
    Put,
    ValueDecodeError,
    WatchEvent,
    keys,
)
from ballast.model import BrokerMode, BrokerState

log = logging.getLogger(__name__)


class Resync(Exception):
    """The watch lost its place (compaction): list again."""


class LoadManager(Service):
    """Runs a `LeaderSession` whenever `election` makes this broker the leader."""

    def __init__(
        self,
        store: MetadataStore,
        clock: Clock,
        config: BallastConfig,
        election: LeaderElection,
        *,
        metrics: ClusterMetrics | None = None,
        sink: HistoryWriter | None = None,
        rankings_interval: float = 0.1,
        retry_delay: float = 0.5,
    ) -> None:
        super().__init__()
        self.broker_id = election.broker_id
        self.name = f"load-manager/{self.broker_id}"
        self.store = store
        self.clock = clock
        self.config = config
        self.election = election
        self.metrics = metrics if metrics is not None else ClusterMetrics(self.broker_id)
        self.sink = sink
        self.rankings_interval = rankings_interval
        self.retry_delay = retry_delay
        self.session: LeaderSession | None = None
        self.events: deque[str] = deque(maxlen=200)  # human-readable log (demo, admin)
        self.terms = 0

    def note(self, message: str, level: int = logging.INFO) -> None:
        """Record and log one human-readable control-plane event."""
        self.events.append(message)
        log.log(level, "%s: %s", self.name, message)

    async def _start(self) -> None:
        self.spawn(self._supervise(), "supervisor")

    async def _stop(self) -> None:
        if self.sink is not None:
            self.sink.close()

    async def _supervise(self) -> None:
        while True:
            term = await self.election.elected()
            self.terms += 1
            session = LeaderSession(self, term)
            self.session = session
            self.note(f"leading (term {term.revision})")
            try:
                await session.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an ExceptionGroup from the session's task group
                if _only(exc, FenceLost):
                    self.note(f"term {term.revision} is over (a fenced write was refused)")
                elif _only(exc, Resync):
                    self.note("watch compacted; bootstrapping again")
                else:
                    self.metrics.session_failures.inc()
                    log.error("%s: leader session crashed; restarting", self.name, exc_info=exc)
                    await self.clock.sleep(self.retry_delay)
            finally:
                self.session = None
            if term.active:
                # The session ended but we still lead (watch closed, resync): start over.
                await self.clock.sleep(min(self.retry_delay, 0.05))


def _only(exc: BaseException, kind: type[BaseException]) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only(e, kind) for e in exc.exceptions)
    return isinstance(exc, kind)


_TICK = object()


class LeaderSession:
    """One term of leadership: a `LeaderMachine` and the I/O it asks for."""

    def __init__(self, manager: LoadManager, term: Term) -> None:
        self.manager = manager
        self.term = term
        self.store = manager.store
        self.clock = manager.clock
        self.config = manager.config
        self.metrics = manager.metrics
        self.machine = LeaderMachine(
            manager.broker_id,
            term.revision,
            manager.config,
            rankings_interval=manager.rankings_interval,
        )
        self.ready = asyncio.Event()  # set once bootstrapped
        # The latest rebalancing decision, as the machine's `Ready`s tell.
        self.last_decision: Decision | None = None
        self.steps = 0
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        # The latest rankings not posted yet: posted by their own task, so the step loop
        # never waits for that write (a ready marker arriving meanwhile is placed at once).
        self._rankings: dict[str, Any] | None = None
        self._rankings_due = asyncio.Event()
        self._rankings_posting = False

    # -- what the admin, the demo and tests read -------------------------------------------

    @property
    def history(self) -> MoveHistory:
        """The moves recorded under ``/cluster/rebalancing_history/``, ours included as
        soon as their write succeeded."""
        return self.machine.history

    @property
    def episode(self) -> bool:
        """Whether the last check left a rebalancing episode open."""
        return self.last_decision is not None and self.last_decision.episode

    def balance(self) -> dict[str, Any]:
        """Rankings and balance statistics of the current view."""
        return self.machine.balance()

    # -- running -------------------------------------------------------------------------

    async def run(self) -> None:
        """Bootstrap, then step the machine until the term ends (or a loop fails)."""
        cluster = await self.store.get_prefix(keys.CLUSTER_PREFIX)
        topics = await self.store.get_prefix(keys.TOPICS_PREFIX)
        await self.perform(self.machine.step(Bootstrap(cluster, topics, self.clock.now())))
        self.ready.set()
        name = self.manager.name
        await first_completed(
            name,
            {
                "watch": self._watch(keys.CLUSTER_PREFIX, cluster.revision),
                "watch-topics": self._watch(keys.TOPICS_PREFIX, topics.revision),
                "tick": self._tick(),
                "step": self._step_loop(),
                "rankings": self._post_rankings(),
                "reachability": self._reachability(),
                "term": self.term.ended.wait(),
            },
        )

    async def _reachability(self) -> None:
        """The unreachable-owner rule (`ballast.leader.reachability`) every
        `reachability.check_interval_seconds`: the gateways' reports read, the rule's
        evictions (a drain) and restorations written, fenced on the term."""
        settings = self.config.reachability
        if not settings.enabled:
            await self.term.ended.wait()
            return
        rule = ReachabilityRule(settings.evict_after_seconds, settings.min_gateways)
        # When this term first saw each (gateway, broker) report: the rule counts a
        # report's age on the leader's clock, whatever the gateway's clock says.
        seen: dict[tuple[str, str], float] = {}
        while True:
            await asyncio.sleep(settings.check_interval_seconds)
            try:
                listing = await self.store.get_prefix(keys.REACHABILITY_PREFIX)
            except MetadataError as exc:
                log.warning("%s: reachability reports: %s", self.manager.name, exc)
                continue
            now = time.monotonic()
            gateways: set[str] = set()
            reports: dict[str, dict[str, float]] = {}
            evicted: set[str] = set()
            for kv in listing.items:
                try:
                    kind, gateway, broker = keys.parse_reachability_key(kv.key)
                except ValueError:
                    continue
                if kind == "gateway" and gateway is not None:
                    gateways.add(gateway)
                elif kind == "report" and gateway is not None and broker is not None:
                    reports.setdefault(gateway, {})[broker] = seen.setdefault(
                        (gateway, broker), now
                    )
                elif kind == "evicted" and broker is not None:
                    evicted.add(broker)
            for key in [k for k in seen if k[1] not in reports.get(k[0], {})]:
                del seen[key]
            view = self.machine.view
            snapshot = ReachabilitySnapshot(
                now,
                frozenset(gateways),
                reports,
                frozenset(view.registrations),
                dict(view.states),
                frozenset(evicted),
            )
            for decision in decide(rule, snapshot):
                await self._reachability_write(decision)

    async def _reachability_write(self, decision: Evict | Restore) -> None:
        view = self.machine.view
        broker = decision.broker
        state_key = keys.broker_state(broker)
        eviction = keys.reachability_eviction(broker)
        if isinstance(decision, Evict):
            revision = view.state_revisions.get(broker, 0)
            compares = [
                Compare.present(keys.register(broker)),
                Compare.mod_revision_equals(state_key, revision),
                Compare.absent(eviction),
            ]
            ops: list[Put | Delete] = [
                Put(state_key, BrokerState(BrokerMode.DRAINING, decision.reason).to_dict()),
                Put(eviction, {"gateways": list(decision.gateways)}),
            ]
            message = f"broker {broker} {decision.reason}: draining it"
        elif decision.registered:
            compares = [Compare.present(eviction), Compare.present(keys.register(broker))]
            ops = [Delete(eviction)]
            if not view.state(broker).is_active:
                active = BrokerState(BrokerMode.ACTIVE, "reachable again from the gateways")
                ops.insert(0, Put(state_key, active.to_dict()))
            message = f"broker {broker} is reachable again from the gateways: active"
        else:
            compares, ops = [Compare.present(eviction)], [Delete(eviction)]
            message = f"broker {broker} left the cluster: its eviction is forgotten"
        try:
            result = await self.store.txn([self.term.fence, *compares], ops)
        except MetadataError as exc:
            log.warning("%s: reachability: %s", self.manager.name, exc)
            return
        if result.succeeded:
            # An eviction and its end are what an operator must see at the default level.
            self.manager.note(message, logging.WARNING)
        elif not await self.manager.election.verify(self.term):
            raise FenceLost(self.term)

    async def _watch(self, prefix: str, revision: int) -> None:
        async with watching(self.store, prefix, revision + 1) as watch:
            async for event in watch:
                if event.kind == "compacted":
                    raise Resync(event.error or prefix)
                self._inbox.put_nowait(event)

    async def _tick(self) -> None:
        while True:
            await self.clock.sleep(self.manager.rankings_interval)
            self._inbox.put_nowait(_TICK)

    async def _step_loop(self) -> None:
        while True:
            items = [await self._inbox.get()]
            while not self._inbox.empty():
                items.append(self._inbox.get_nowait())
            events = tuple(i for i in items if isinstance(i, WatchEvent))
            now = self.clock.now()
            started = time.perf_counter()
            if events:
                await self.perform(self.machine.step(Watched(events, now)))
            if len(events) < len(items):
                await self.perform(self.machine.step(Tick(self.clock.now())))
            self.metrics.cycle_duration.observe(time.perf_counter() - started)
            # Let the watches deliver what our writes caused before the next step.
            await asyncio.sleep(0)

    # -- performing effects --------------------------------------------------------------

    async def perform(self, ready: Ready) -> list[Ready]:
        """Perform `ready` and every `Ready` the outcomes of its writes produce, in order;
        return them all (the first one included)."""
        done: list[Ready] = []
        queue = ReadyQueue(self.machine, ready, WRITES_IN_FLIGHT)
        for current in queue:
            done.append(current)
            self.steps += 1
            if current.decision is not None:
                self.last_decision = current.decision
            for batch in queue.batches(current):
                queue.feed(await asyncio.gather(*(self._perform_write(w) for w in batch)))
            if current.rankings is not None:
                await self._post(current.rankings.payload)
            for record in current.history:
                self._sink(record.report, record.mode)
            for delta in current.metrics:
                self._metric(delta)
            for line in current.logs:
                if line.note:
                    self.manager.note(line.message)
                else:
                    log.log(line.level, "%s: %s", self.manager.name, line.message)
        return done

    async def _post(self, payload: dict[str, Any]) -> None:
        """To the rankings task while it runs (a newer payload replaces one not posted
        yet); before it does (the bootstrap, or a replay that drives `perform` alone),
        written here, in order."""
        if self._rankings_posting:
            self._rankings = payload
            self._rankings_due.set()
        else:
            await self._fenced([Put(keys.LOAD_BALANCE, payload)])

    async def _post_rankings(self) -> None:
        self._rankings_posting = True
        while True:
            await self._rankings_due.wait()
            self._rankings_due.clear()
            payload, self._rankings = self._rankings, None
            if payload is not None:
                await self._fenced([Put(keys.LOAD_BALANCE, payload)])

    async def _perform_write(self, write: Write) -> WriteDone:
        try:
            result = await self.store.txn([self.term.fence, *write.compares], list(write.ops))
        except OutcomeUnknownError as exc:
            log.warning(
                "%s: %s: outcome unknown (%s); re-reading", self.manager.name, write.what, exc
            )
            return WriteDone(
                write.id, False, 0, self.clock.now(), await self._read(write.touched_keys())
            )
        if result.succeeded:
            return WriteDone(write.id, True, result.revision, self.clock.now())
        if not await self.manager.election.verify(self.term):
            raise FenceLost(self.term)
        return WriteDone(
            write.id, False, 0, self.clock.now(), await self._read(write.touched_keys())
        )

    async def _fenced(self, ops: list[Put]) -> None:
        result = await self.store.txn([self.term.fence], ops)
        if not result.succeeded and not await self.manager.election.verify(self.term):
            raise FenceLost(self.term)

    async def _read(self, keys_: tuple[str, ...]) -> tuple[Refreshed, ...]:
        """The keys of a failed write, as they are now."""
        out: list[Refreshed] = []
        for key in keys_:
            if key == keys.LEADER:
                continue
            try:
                kv = await self.store.get(key)
            except ValueDecodeError as exc:
                log.warning("%s: %s", self.manager.name, exc)
                out.append(Refreshed(key, undecodable=True))
                continue
            out.append(refreshed(key, kv))
        return tuple(out)

    def _metric(self, delta: MetricDelta) -> None:
        m = self.metrics
        labels = dict(delta.labels)
        if delta.kind == "balance":
            m.observe_balance(delta.extra, int(delta.value))
        elif delta.name == "rejected":
            m.reject(labels["kind"])
        elif delta.name == "assignments":
            m.assignments.labels(**labels).inc(delta.value)
        else:
            getattr(m, delta.name).inc(delta.value)

    def _sink(self, report: Any, mode: Any) -> None:
        sink = self.manager.sink
        if sink is None:
            return
        try:
            sink.append(report, mode)
        except OSError as exc:
            self.metrics.reject("history_sink")
            log.warning("%s: load-history sink failed: %s", self.manager.name, exc)
