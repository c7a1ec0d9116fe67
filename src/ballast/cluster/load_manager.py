"""`LoadManager`: the leader's control loop. It decides nothing itself: the core does.

While this broker leads (see `LeaderElection`), a `LeaderSession`:

1. Bootstraps: lists ``/cluster/`` in one consistent read (registrations, states,
   assignments, markers, load reports, the persisted move history) and ``/topics/``
   (topic metadata), then watches both from the listed revision + 1.
2. Ranks the brokers on every load report (coalesced) and posts rankings and balance
   statistics to ``/cluster/load_balance``; appends every report to the load-history sink.
3. Reconciles, level-triggered, whenever the view changes:
   - failover: a broker without registration that still owns topics is dead; its
     assignments become ``failover`` markers hinted by `plan_failover`;
   - drain: a draining broker's topics get ``unload`` markers (`plan_drain`,
     ``ready: false``); once it owns nothing and nothing waits for it to seal, ``drained``;
   - placement: every ready marker is placed (`place_topics`: hint honoured, source
     excluded) by ONE transaction that writes the assignment and deletes the marker.
4. Rebalances every `check_interval_seconds` with `decide_rebalance`: a move is a marker
   ``{rebalance, from, to, ready: false}`` written together with the deletion of the source
   assignment and the history record; the source seals and sets ``ready: true``; step 3
   then assigns the target.

Every write is a transaction fenced on the leader key's create revision plus compares on
the keys the decision read. If a write fails, the decision is dropped, the keys involved
are read again, and the next round decides from fresh state. One bad record (malformed
JSON, an unknown broker, a marker for a deleted topic) is logged, counted, and skipped.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from typing import Any

from ballast.balance import (
    Decision,
    MoveHistory,
    decide_rebalance,
    measure,
    place_topics,
    plan_drain,
    plan_failover,
    rank,
)
from ballast.clock import Clock
from ballast.cluster.election import FenceLost, LeaderElection, Term
from ballast.cluster.metrics import ClusterMetrics
from ballast.cluster.records import assignment_value
from ballast.cluster.service import Service, watching
from ballast.cluster.view import BadRecord, ClusterView, RecordKind, classify
from ballast.config import BallastConfig
from ballast.metadata import (
    Compare,
    Delete,
    MetadataStore,
    OutcomeUnknownError,
    Put,
    TxnResult,
    ValueDecodeError,
    WatchEvent,
    keys,
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
    UnassignedMarker,
)
from ballast.pipeline.history import HistoryWriter

log = logging.getLogger(__name__)

# etcd refuses transactions with more than 128 operations (its default --max-txn-ops).
TOPICS_PER_TXN = 40
# Placement writes in flight at once (each is its own fenced transaction).
WRITES_IN_FLIGHT = 16


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

    def note(self, message: str) -> None:
        """Record and log one human-readable control-plane event."""
        self.events.append(message)
        log.info("%s: %s", self.name, message)

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


class LeaderSession:
    """One term of leadership: the view, the move history and the loops that act on them."""

    def __init__(self, manager: LoadManager, term: Term) -> None:
        self.manager = manager
        self.term = term
        self.store = manager.store
        self.clock = manager.clock
        self.config = manager.config
        self.metrics = manager.metrics
        self.strategy = manager.config.load_manager.assignment_strategy
        self.view = ClusterView()
        self.history = MoveHistory()
        self.episode = False
        self.last_chosen: BrokerId | None = None
        self.last_decision: Decision | None = None
        self.ready = asyncio.Event()  # set once bootstrapped
        self._wake = asyncio.Event()
        self._reports_dirty = asyncio.Event()
        self._lock = asyncio.Lock()  # one writer at a time: reconcile or rebalance
        self._repairs: dict[str, int] = {}
        self._unknown_hints: set[tuple[str, int]] = set()
        self._stuck: set[str] = set()
        self._seq = itertools.count()
        self._last_rule = ""
        # Estimated reports after our own moves (the core's `apply_move`), kept until a
        # broker's real report shows the move: {broker: (report, {topic: present}, since)}.
        self._estimates: dict[BrokerId, tuple[LoadReport, dict[str, bool], float]] = {}

    # -- running -------------------------------------------------------------------------

    async def run(self) -> None:
        """Bootstrap, then run the loops until the term ends (or one of them fails)."""
        cluster, topics = await self.bootstrap()
        name = self.manager.name
        async with asyncio.TaskGroup() as group:
            loops = [
                group.create_task(self._watch(keys.CLUSTER_PREFIX, cluster), name=f"{name}/watch"),
                group.create_task(
                    self._watch(keys.TOPICS_PREFIX, topics), name=f"{name}/watch-topics"
                ),
                group.create_task(self._reconcile_loop(), name=f"{name}/reconcile"),
                group.create_task(self._rebalance_loop(), name=f"{name}/rebalance"),
                group.create_task(self._rankings_loop(), name=f"{name}/rankings"),
                group.create_task(self.term.ended.wait(), name=f"{name}/term"),
            ]
            await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
            for task in loops:
                task.cancel()

    async def bootstrap(self) -> tuple[int, int]:
        """List the cluster and the topics; return the revisions to watch from."""
        cluster = await self.store.get_prefix(keys.CLUSTER_PREFIX)
        topics = await self.store.get_prefix(keys.TOPICS_PREFIX)
        for bad in self.view.load(cluster, topics):
            self._rejected(bad)
        for error in topics.undecodable:
            kind, _, _ = _classify_quietly(error.key)
            if kind is RecordKind.TOPIC:
                # Not ours to repair; the topic counts as old (its age is unknown).
                self.metrics.reject(kind)
                log.warning("%s: %s", self.manager.name, error)
        for error in cluster.undecodable:
            kind, _, _ = _classify_quietly(error.key)
            self.metrics.reject(kind)
            log.warning("%s: %s", self.manager.name, error)
            await self._repair(error.key, None)
        self.history = MoveHistory.of(self.view.moves.values())
        for broker in list(self.view.reports):
            if broker not in self.view.registrations:
                self.view.forget_report(broker)
        self.manager.note(
            f"bootstrapped: {len(self.view.registrations)} brokers, "
            f"{len(self.view.owners)} assigned topics, {len(self.view.markers)} markers, "
            f"{len(self.history.moves)} moves in history"
        )
        self.ready.set()
        self._wake.set()
        self._reports_dirty.set()
        return cluster.revision, topics.revision

    # -- watching ------------------------------------------------------------------------

    async def _watch(self, prefix: str, revision: int) -> None:
        async with watching(self.store, prefix, revision + 1) as watch:
            async for event in watch:
                if event.kind == "compacted":
                    raise Resync(event.error or prefix)
                self.on_event(event)

    def on_event(self, event: WatchEvent) -> None:
        """Apply one watch event to the view and note what needs doing."""
        kind, broker, _ = _classify_quietly(event.key)
        if event.kind == "error":
            self.metrics.reject(kind)
            log.warning("%s: %s", self.manager.name, event.error)
            if kind in (RecordKind.MARKER, RecordKind.ASSIGNMENT, RecordKind.STATE):
                self._repairs[event.key] = event.revision
                self._wake.set()
            return
        unknown = broker is not None and broker not in self.view.registrations
        if kind is RecordKind.LOAD and event.kind == "put" and unknown:
            self.metrics.reject("unknown_broker")
            log.warning("%s: load report from unknown broker %r ignored", self.manager.name, broker)
            return
        try:
            change = self.view.apply(event.kind, event.key, event.value, event.revision)  # type: ignore[arg-type]
        except BadRecord as bad:
            self._rejected(bad)
            return
        if change is None:
            return
        if change.kind is RecordKind.LOAD:
            if not change.deleted and change.broker is not None:
                self._sink(change.broker)
                self._retire_estimate(change.broker)
            self._reports_dirty.set()
        elif change.kind in (
            RecordKind.REGISTRATION,
            RecordKind.STATE,
            RecordKind.ASSIGNMENT,
            RecordKind.MARKER,
        ):
            self._wake.set()
            if change.kind in (RecordKind.REGISTRATION, RecordKind.STATE):
                self._reports_dirty.set()
        elif change.kind is RecordKind.HISTORY:
            self.history = MoveHistory.of(self.view.moves.values())

    def snapshot(self, *, pending: bool = True, exclude: Collection[str] = ()) -> ClusterSnapshot:
        """The view's snapshot, with estimated reports where a move is not yet reported."""
        snap = self.view.snapshot(pending=pending, exclude=exclude)
        if not self._estimates:
            return snap
        reports = dict(snap.reports)
        for broker, (estimate, _, _) in self._estimates.items():
            if broker in reports or broker in snap.brokers:
                reports[broker] = estimate
        return replace(snap, reports=reports)

    def _estimate(self, after: ClusterSnapshot, move: Move, now: float) -> None:
        for broker, present in ((move.from_broker, False), (move.to_broker, True)):
            report = after.reports.get(broker)
            if report is None:
                continue
            expected = dict(self._estimates[broker][1]) if broker in self._estimates else {}
            expected[move.topic] = present
            self._estimates[broker] = (report, expected, now)

    def _retire_estimate(self, broker: BrokerId) -> None:
        """Drop a broker's estimate once its real report shows every move (or is late)."""
        entry = self._estimates.get(broker)
        report = self.view.reports.get(broker)
        if entry is None or report is None:
            return
        _, expected, since = entry
        reported = {t.topic for t in report.topics}
        shown = all((topic in reported) == present for topic, present in expected.items())
        interval = self.config.load_manager.load_report_interval_seconds
        if shown or self.clock.now() - since > 5 * interval:
            del self._estimates[broker]

    def _rejected(self, bad: BadRecord) -> None:
        self.metrics.reject(bad.kind)
        log.warning("%s: rejected %s", self.manager.name, bad)

    def _sink(self, broker: BrokerId) -> None:
        sink = self.manager.sink
        report = self.view.reports.get(broker)
        if sink is None or report is None:
            return
        try:
            sink.append(report, self.view.state(broker).mode)
        except OSError as exc:
            self.metrics.reject("history_sink")
            log.warning("%s: load-history sink failed: %s", self.manager.name, exc)

    # -- writing -------------------------------------------------------------------------

    async def _write(
        self, compares: Sequence[Compare], ops: Sequence[Put | Delete], what: str
    ) -> TxnResult | None:
        """A fenced transaction; on success the view is updated at once.

        Returns None when a compare failed (the keys in `ops` are read again). Raises
        `FenceLost` when the failure is the fence: this term is over.
        """
        try:
            result = await self.store.txn([self.term.fence, *compares], ops)
        except OutcomeUnknownError as exc:
            log.warning("%s: %s: outcome unknown (%s); re-reading", self.manager.name, what, exc)
            await self._refresh(op.key for op in ops)
            return None
        if result.succeeded:
            for op in ops:
                value = op.value if isinstance(op, Put) else None
                try:
                    self.view.apply(
                        "put" if isinstance(op, Put) else "delete", op.key, value, result.revision
                    )
                except BadRecord as bad:  # our own value: a bug, but never fatal
                    self._rejected(bad)
            return result
        self.metrics.fence_failures.inc()
        if not await self.manager.election.verify(self.term):
            raise FenceLost(self.term)
        log.info("%s: %s: state changed underneath; deciding again", self.manager.name, what)
        await self._refresh([*(op.key for op in ops), *(c.key for c in compares)])
        return None

    async def _refresh(self, keys_: Iterable[str]) -> None:
        """Read keys again after a failed write, so the next decision sees them as they are."""
        for key in dict.fromkeys(keys_):
            if key == keys.LEADER:
                continue
            try:
                kv = await self.store.get(key)
            except ValueDecodeError as exc:
                self._repairs[key] = 0
                log.warning("%s: %s", self.manager.name, exc)
                continue
            try:
                if kv is None:
                    # Unknown delete revision: just past what we knew, so later events apply.
                    self.view.apply("delete", key, None, self.view.revision_of(key) + 1)
                else:
                    self.view.apply("put", key, kv.value, kv.mod_revision)
            except BadRecord as bad:
                self._rejected(bad)
        self._wake.set()

    async def _repair(self, key: str, revision: int | None) -> None:
        """Replace an undecodable value under ``/cluster/`` so the leader can go on.

        A marker becomes a plain "new" marker (the topic still gets placed), an assignment
        a fresh assignment, a state "active"; anything else (load report, history record,
        unknown key) is deleted (load reports are republished within one interval).
        """
        kind, _, _ = _classify_quietly(key)
        guard = (
            Compare.present(key) if revision is None else Compare.mod_revision_equals(key, revision)
        )
        now = self.clock.now()
        op: Put | Delete
        if kind is RecordKind.MARKER:
            op = Put(key, UnassignedMarker(timestamp=now).to_dict())
        elif kind is RecordKind.ASSIGNMENT:
            op = Put(key, Assignment(now).to_dict())
        elif kind is RecordKind.STATE:
            op = Put(
                key, BrokerState(BrokerMode.ACTIVE, "repaired: the value was not JSON").to_dict()
            )
        elif kind is RecordKind.REGISTRATION or key == keys.LEADER:
            return  # owned by a broker's lease / the election; never rewritten here
        else:
            op = Delete(key)
        if await self._write([guard], [op], f"repair {key}") is not None:
            self.manager.note(f"repaired undecodable {kind} at {key}")

    # -- reconciling ---------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            async with self._lock:
                await self.reconcile(self.clock.now())
            # Let the watches deliver what our writes caused before the next round.
            await asyncio.sleep(0)

    async def reconcile(self, now: float) -> None:
        """One round: repairs, failover, sealed-source release, drain, placement."""
        for key, revision in list(self._repairs.items()):
            del self._repairs[key]
            await self._repair(key, revision or None)
        for broker in sorted(b for b in self.view.by_broker if b not in self.view.registrations):
            await self.failover(broker, now)
        for broker in sorted(b for b in self.view.reports if b not in self.view.registrations):
            if broker not in self.view.by_broker:
                self.view.forget_report(broker)
        await self._release_orphaned_seals()
        for broker in self.view.brokers():
            if self.view.state(broker).mode is BrokerMode.DRAINING:
                await self.drain(broker, now)
        await self.assign(now)

    async def failover(self, dead: BrokerId, now: float) -> None:
        """Replace a dead broker's assignments by failover markers hinted by the core."""
        owned = dict(self.view.topics_of(dead))
        if not owned:
            return
        snap = self.view.snapshot(pending=False)
        report = self.view.reports.get(dead)
        snap = replace(
            snap,
            brokers=(*snap.brokers, dead),
            assignments={**snap.assignments, dead: tuple(sorted(owned))},
            reports={**snap.reports, **({dead: report} if report is not None else {})},
        )
        plan = plan_failover(snap, dead, self.strategy, self.last_chosen, now)
        hints = dict(plan.placements)
        written = 0
        topics = sorted(owned)
        for start in range(0, len(topics), TOPICS_PER_TXN):
            chunk = topics[start : start + TOPICS_PER_TXN]
            compares = [Compare.absent(keys.register(dead))]
            ops: list[Put | Delete] = []
            for topic in chunk:
                placement = hints.get(topic)
                marker = UnassignedMarker(
                    MarkerReason.FAILOVER,
                    from_broker=dead,
                    to_broker=placement.broker if placement is not None else None,
                    timestamp=now,
                    ready=True,
                )
                key = keys.broker_assignment(dead, topic)
                compares.append(Compare.mod_revision_equals(key, owned[topic]))
                ops += [Delete(key), Put(keys.unassigned(topic), marker.to_dict())]
            result = await self._write(compares, ops, f"failover of {dead}")
            await asyncio.sleep(0)  # a big failover must not starve the other loops
            if result is not None:
                written += len(chunk)
                self.metrics.assignments.labels(broker_id=dead, action="unassign").inc(len(chunk))
        if written:
            self.metrics.failovers.inc()
            self.manager.note(
                f"[failover] {dead} is gone: {written} topic(s) handed to "
                f"{len({p.broker for p in hints.values() if p.broker})} survivor(s)"
            )

    async def _release_orphaned_seals(self) -> None:
        """A marker waiting for a source that is gone will never be sealed: release it."""
        for topic, pending in sorted(self.view.markers.items()):
            marker = pending.marker
            if marker.ready or (
                marker.from_broker is not None and marker.from_broker in self.view.registrations
            ):
                continue
            compares = [Compare.mod_revision_equals(keys.unassigned(topic), pending.revision)]
            if marker.from_broker is not None:
                compares.append(Compare.absent(keys.register(marker.from_broker)))
            ready = replace(marker, ready=True)
            if await self._write(
                compares, [Put(keys.unassigned(topic), ready.to_dict())], "release"
            ):
                self.manager.note(
                    f"[release] {topic}: source {marker.from_broker} is gone; no seal to wait for"
                )

    async def drain(self, broker: BrokerId, now: float) -> None:
        """Unload a draining broker's topics; mark it drained once nothing is left."""
        owned = dict(self.view.topics_of(broker))
        if owned:
            markers = plan_drain(self.view.snapshot(pending=False), broker, now)
            for start in range(0, len(markers), TOPICS_PER_TXN):
                chunk = [(t, m) for t, m in markers[start : start + TOPICS_PER_TXN] if t in owned]
                compares = [
                    Compare.mod_revision_equals(keys.broker_assignment(broker, t), owned[t])
                    for t, _ in chunk
                ]
                ops: list[Put | Delete] = []
                for topic, marker in chunk:
                    ops += [
                        Delete(keys.broker_assignment(broker, topic)),
                        Put(keys.unassigned(topic), marker.to_dict()),
                    ]
                if chunk and await self._write(compares, ops, f"drain of {broker}"):
                    unassigned = self.metrics.assignments.labels(
                        broker_id=broker, action="unassign"
                    )
                    unassigned.inc(len(chunk))
                    self.manager.note(f"[drain] {broker}: unloading {len(chunk)} topic(s)")
            return
        sealing = [
            t
            for t, p in self.view.markers.items()
            if p.marker.from_broker == broker and not p.marker.ready
        ]
        if sealing:
            return  # still sealing: drained means nothing of it is left anywhere
        state_key = keys.broker_state(broker)
        revision = self.view.state_revisions.get(broker, 0)
        drained = BrokerState(BrokerMode.DRAINED, "drained: every topic moved away")
        if await self._write(
            [Compare.mod_revision_equals(state_key, revision)],
            [Put(state_key, drained.to_dict())],
            f"drained {broker}",
        ):
            self.manager.note(f"[drain] {broker} is drained")

    async def assign(self, now: float) -> None:
        """Place every ready marker; one transaction per marker (assignment + marker delete)."""
        batch: list[tuple[str, int, UnassignedMarker]] = []
        for topic, pending in sorted(
            self.view.markers.items(), key=lambda e: (e[1].revision, e[0])
        ):
            if not pending.marker.ready:
                continue
            owner = self.view.owner(topic)
            if owner is not None:
                await self._drop_marker(
                    topic,
                    pending.revision,
                    "marker_assigned_topic",
                    f"{topic} is already owned by {owner}",
                    [Compare.present(keys.broker_assignment(owner, topic))],
                )
                continue
            hint = pending.marker.to_broker
            if hint is not None and hint not in self.view.registrations:
                mark = (topic, pending.revision)
                if mark not in self._unknown_hints:
                    self._unknown_hints.add(mark)
                    self.metrics.reject("unknown_broker")
                    log.warning(
                        "%s: %s: hint to_broker %r is not a registered broker; placing elsewhere",
                        self.manager.name,
                        topic,
                        hint,
                    )
            batch.append((topic, pending.revision, pending.marker))
        if not batch:
            return
        snapshot = self.snapshot(exclude={t for t, _, _ in batch})
        plan = place_topics(
            snapshot, self.strategy, [(t, m) for t, _, m in batch], self.last_chosen
        )
        self.last_chosen = plan.last_chosen
        revisions = {t: (r, m) for t, r, m in batch}
        brokers = sorted(self.view.known_brokers())
        todo: list[tuple[str, BrokerId]] = []
        for topic, placement in plan.placements:
            if placement.broker is None:
                if topic not in self._stuck:
                    self._stuck.add(topic)
                    self.manager.note(f"[no-broker] {topic} waits: {placement.explain()}")
                continue
            self._stuck.discard(topic)
            todo.append((topic, placement.broker))
        # Independent writes, a bounded number in flight: etcd round trips overlap, and the
        # loop yields between groups so keep-alives and watches never starve on a burst.
        for start in range(0, len(todo), WRITES_IN_FLIGHT):
            async with asyncio.TaskGroup() as group:
                for topic, target in todo[start : start + WRITES_IN_FLIGHT]:
                    revision, marker = revisions[topic]
                    group.create_task(
                        self._assign_one(topic, revision, marker, target, brokers, now),
                        name=f"{self.manager.name}/assign:{topic}",
                    )
            await asyncio.sleep(0)

    async def _assign_one(
        self,
        topic: str,
        revision: int,
        marker: UnassignedMarker,
        target: BrokerId,
        brokers: Sequence[BrokerId],
        now: float,
    ) -> None:
        marker_key = keys.unassigned(topic)
        compares = [
            Compare.mod_revision_equals(marker_key, revision),
            Compare.present(keys.topic_meta(topic)),
            Compare.present(keys.register(target)),
            # Never two owners: no broker may hold the topic already.
            *(Compare.absent(keys.broker_assignment(b, topic)) for b in {*brokers, target}),
        ]
        value = assignment_value(Assignment(now, epoch=revision), marker)
        ops: list[Put | Delete] = [
            Put(keys.broker_assignment(target, topic), value),
            Delete(marker_key),
        ]
        if await self._write(compares, ops, f"assign {topic}") is not None:
            self.metrics.assignments.labels(broker_id=target, action="assign").inc()
            if marker.reason is not MarkerReason.NEW:
                self.manager.note(f"[{marker.reason.value}] {topic} → {target}")
            return
        # Why did it fail? A deleted topic's marker is dropped; anything else is retried
        # (`_write` has read the compared keys again, so the next round sees them).
        try:
            meta = await self.store.get(keys.topic_meta(topic))
        except ValueDecodeError:
            return  # the topic exists; its metadata is someone else's to fix
        if meta is None:
            await self._drop_marker(
                topic,
                revision,
                "marker_unknown_topic",
                f"{topic} has no metadata (deleted or never created)",
                [Compare.absent(keys.topic_meta(topic))],
            )

    async def _drop_marker(
        self, topic: str, revision: int, kind: str, why: str, compares: Sequence[Compare]
    ) -> None:
        self.metrics.reject(kind)
        key = keys.unassigned(topic)
        if await self._write(
            [Compare.mod_revision_equals(key, revision), *compares], [Delete(key)], f"drop {key}"
        ):
            self.manager.note(f"[bad-marker] dropped the marker of {topic}: {why}")

    # -- rebalancing ---------------------------------------------------------------------

    async def _rebalance_loop(self) -> None:
        interval = self.config.load_manager.rebalancing.check_interval_seconds
        while True:
            await self.clock.sleep(interval)
            async with self._lock:
                started = time.perf_counter()
                await self.rebalance(self.clock.now())
                self.metrics.cycle_duration.observe(time.perf_counter() - started)

    async def rebalance(self, now: float) -> Decision | None:
        """One rebalancing cycle: ask the core, apply its move (if any). None: in flight."""
        self.metrics.checks.inc()
        in_flight = sorted(
            t for t, p in self.view.markers.items() if p.marker.reason is MarkerReason.REBALANCE
        )
        if in_flight:
            # One move at a time: the next decision waits for this one's real effect.
            return None
        decision = decide_rebalance(
            self.snapshot(),
            self.history,
            now,
            self.config.load_manager.rebalancing,
            self.strategy,
            self.episode,
        )
        self.episode = decision.episode
        self.last_decision = decision
        if decision.move is None:
            if decision.rule != self._last_rule:
                self.manager.note(decision.explanation)
            self._last_rule = decision.rule
            return decision
        self._last_rule = decision.rule
        move = decision.move
        revision = self.view.topics_of(move.from_broker).get(move.topic)
        if revision is None:
            self.metrics.failures.inc()
            return decision
        marker = UnassignedMarker(
            MarkerReason.REBALANCE,
            from_broker=move.from_broker,
            to_broker=move.to_broker,
            timestamp=now,
            ready=False,
        )
        source_key = keys.broker_assignment(move.from_broker, move.topic)
        history_key = keys.rebalancing_history(now, next(self._seq) % 1_000_000)
        result = await self._write(
            [Compare.mod_revision_equals(source_key, revision)],
            [
                Delete(source_key),
                Put(keys.unassigned(move.topic), marker.to_dict()),
                Put(history_key, move.to_dict()),
            ],
            f"move {move.topic}",
        )
        if result is None:
            self.metrics.failures.inc()
            return decision
        self.history = self.history.add(move)
        if decision.after is not None:
            self._estimate(decision.after, move, now)
        self.metrics.moves.inc()
        self.metrics.assignments.labels(broker_id=move.from_broker, action="unassign").inc()
        self.manager.note(decision.explanation)
        return decision

    # -- rankings ------------------------------------------------------------------------

    async def _rankings_loop(self) -> None:
        while True:
            await self._reports_dirty.wait()
            self._reports_dirty.clear()
            await self.post_rankings(self.clock.now())
            await self.clock.sleep(self.manager.rankings_interval)

    def balance(self) -> dict[str, Any]:
        """Rankings and balance statistics of the current view."""
        snapshot = self.snapshot()
        rankings = rank(snapshot, self.strategy)
        active = set(snapshot.active_brokers())
        stats = measure({b: s for b, s in rankings.entries if b in active})
        self.metrics.observe_balance(stats, len(active))
        return {
            "leader": self.manager.broker_id,
            "term": self.term.revision,
            "strategy": self.strategy.value,
            "rankings": rankings.to_dict(),
            "balance": stats.to_dict(),
            "decision": self.last_decision.explanation if self.last_decision else None,
        }

    async def post_rankings(self, now: float) -> None:
        """Post rankings + balance statistics to ``/cluster/load_balance`` (fenced)."""
        payload = {"timestamp": now, **self.balance()}
        await self._write([], [Put(keys.LOAD_BALANCE, payload)], "post rankings")


def _classify_quietly(key: str) -> tuple[RecordKind, BrokerId | None, str | None]:
    try:
        return classify(key)
    except BadRecord:
        return RecordKind.OTHER, None, None
