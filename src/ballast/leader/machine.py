"""`LeaderMachine`: the leader's policy as a synchronous state machine.

Fed `Bootstrap`, `Watched`, `Tick` and `WriteDone` events, `step()` returns a `Ready`:
the writes to perform (each outcome is fed back), rankings to post, load-history records,
metric deltas and log lines. It holds the view, the move history, the episode flag, the
round-robin position and the estimates of its own moves; it never awaits, reads a clock
or touches the store, so the live leader, the simulator and scripted tests drive the very
same decisions.

One round at a time: while writes are in flight the machine only records what it learns;
once every outcome is back it decides again. A round is, in this order:

1. repairs of undecodable values under ``/cluster/``;
2. failover: a broker without registration that still owns topics is dead; its topics are
   reassigned directly (`plan_failover`, levelled), several per transaction;
3. release: a marker waiting for a seal from a source that is gone becomes ready;
4. seal timeout: a marker whose (living) source has not sealed within
   `seal_timeout_seconds` — counted on this leader's clock from when it first saw the
   marker waiting — is made ready and recorded as forced, with the reason. That is safe:
   a source acknowledges a send only once it is committed under its claim on the topic,
   and the new owner's claim makes every later commit of the source fail (a live source
   answers well within the timeout: sealed, or handed over with ``unsealed``);
5. drain: a draining broker's topics get ``unload`` markers (`plan_drain`), those with
   clients first and the rest once those are placed; once it owns nothing and nothing
   waits for its seal, it is ``drained``;
6. ownership records: an assignment without its record gets one; a record without its
   assignment is removed (both come only from tools that predate the record);
7. unloads of split bundles (Pulsar, `auto_unload_split_bundles_enabled`): the topics of
   a bundle this leader has split get ``unload`` markers, so placement spreads the halves;
8. placement (only when steps 2-7 wrote nothing): every ready marker is placed
   (`place_topics`) by transactions that write the assignment and the ownership record
   and delete the marker; markers of deleted topics and of owned topics are dropped;
9. rebalancing, when a check is due and nothing else was written: with
   `placement_unit: bundle`, Pulsar's automatic bundle split first (a split writes the new
   layout to ``/cluster/bundles/{ns}`` and the check ends there); then `decide_rebalance`
   (Danube's CV rule or the configured Pulsar shedder, whose smoothed usage the machine
   keeps between checks); every move of the decision is written, within the rate limits.

With `placement_unit: bundle`, every snapshot carries the namespaces' bundle layouts (the
stored ``/cluster/bundles/`` records, Pulsar's default layout for the others), so
placement, failover and the shedders keep a bundle's topics on one broker.

Each step of a round returns typed intents (`leader.intents`); `leader.transactions` turns
them into transactions (one chunker keeps each within etcd's limits), and every write in
flight is keyed by its id to the part of the intent it carries, which is what its outcome
books. The `Ready` tells the shell the decision of a check and the moves made, so nobody
reads the machine's state from outside.

Every write carries compares on what the decision read; "never two owners" costs ONE
compare per topic (its ownership record is absent), whatever the number of brokers. A
failed write is dropped: its keys come back read again, and the next round decides from
that fresh state.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Collection
from dataclasses import dataclass, replace
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
from ballast.balance.estimate import apply_move
from ballast.balance.pulsar.bundles import NamespaceBundles
from ballast.balance.pulsar.policy import auto_split, prepare_snapshot
from ballast.balance.smoothing import smooth_report
from ballast.config import BallastConfig, PlacementUnit, RebalancingPolicy
from ballast.leader.effects import (
    Bootstrap,
    Collector,
    Event,
    HistoryRecord,
    MetricDelta,
    PostRankings,
    Ready,
    Refreshed,
    Tick,
    Watched,
    Write,
    WriteDone,
)
from ballast.leader.intents import (
    Drain,
    Drained,
    DropMarker,
    Failover,
    Force,
    Intent,
    MoveTopics,
    Place,
    Placement,
    Reassign,
    RecordOwner,
    Release,
    Relocation,
    RemoveOwner,
    Repair,
    SplitBundles,
    Unload,
    UnloadSplit,
)
from ballast.leader.transactions import transactions
from ballast.leader.view import BadRecord, ClusterView, classify
from ballast.metadata import Compare, Delete, Put, WatchEvent, keys
from ballast.metadata.records import RecordKind
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
    topic_namespace,
)

# A round fails over at most this many topics of one dead broker (the rest next round, so
# one step never blocks the shell's event loop for long; each round levels the survivors
# as they are then, so the result is levelled all the same).
FAILOVER_TOPICS_PER_ROUND = 400
# A marker whose topic metadata has not been seen waits this long for the ``/topics/``
# watch to catch up before the leader tries to drop it (the drop is guarded anyway).
META_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class _InFlight:
    """A write asked for, and the part of the intent it carries (booked on success)."""

    write: Write
    intent: Intent


def _classify_quietly(key: str) -> tuple[RecordKind, BrokerId | None, str | None]:
    try:
        return classify(key)
    except BadRecord:
        return RecordKind.OTHER, None, None


class LeaderMachine:
    """One term of leadership as a pure state machine (see the module docstring)."""

    def __init__(
        self,
        leader: BrokerId,
        term: int,
        config: BallastConfig,
        *,
        rankings_interval: float = 0.1,
    ) -> None:
        self.leader = leader
        self.term = term
        self.config = config
        self.rebalancing = config.load_manager.rebalancing
        self.strategy = config.load_manager.assignment_strategy
        self.pulsar = config.load_manager.pulsar
        self.by_bundle = config.load_manager.placement_unit is PlacementUnit.BUNDLE
        self.shedding = self.rebalancing.policy is not RebalancingPolicy.DANUBE
        # A Pulsar shedder's smoothed usage per broker (ThresholdShedder's EWMA), passed
        # back to the next check like `episode`.
        self.shedder_state: dict[BrokerId, float] | None = None
        # Topics of bundles this leader split, to unload so that placement spreads them.
        self._split_unloads: list[tuple[str, BrokerId]] = []
        self.rankings_interval = rankings_interval
        self.view = ClusterView()
        self.history = MoveHistory()
        self.episode = False
        self.last_chosen: BrokerId | None = None
        self.last_decision: Decision | None = None
        self.bootstrapped = False
        self._ids = itertools.count(1)
        self._inflight: dict[int, _InFlight] = {}
        self._dirty = False
        self._reports_dirty = False
        self._next_check = 0.0
        self._next_rankings = 0.0
        self._repairs: dict[str, int] = {}
        self._unknown_hints: set[tuple[str, int]] = set()
        self._stuck: set[str] = set()
        self._last_rule = ""
        self._opaque_topics: set[str] = set()  # metadata present but undecodable
        self._topics_revision = 0  # how far the ``/topics/`` stream has been seen
        self._meta_wait: dict[str, float] = {}  # topic -> since when its marker waits
        # topic -> (marker revision, when this leader first saw it waiting for a seal): the
        # seal timeout runs on this leader's own clock, never on a timestamp another
        # leader (or broker) wrote with its clock.
        self._seal_wait: dict[str, tuple[int, float]] = {}
        self._ownership_check: set[str] = set()  # topics whose records changed
        self._smoothed: dict[BrokerId, LoadReport] = {}
        # Estimated reports after our own moves (the core's `apply_move`), kept until a
        # broker's real report shows the move: {broker: (report, {topic: present}, since)}.
        self._estimates: dict[BrokerId, tuple[LoadReport, dict[str, bool], float]] = {}

    # -- the one entry point -------------------------------------------------------------

    def step(self, event: Event) -> Ready:
        """Apply one event; return the effects to perform, in order."""
        out = Collector()
        if isinstance(event, Bootstrap):
            self._bootstrap(event, out)
        elif isinstance(event, Watched):
            for watched in event.events:
                self._on_event(watched, event.now, out)
        elif isinstance(event, WriteDone):
            self._on_write_done(event, out)
        elif isinstance(event, Tick):
            self._on_tick(event.now)
        self._act(event.now, out)
        return out.ready()

    @property
    def in_flight(self) -> int:
        """Writes asked for whose outcome has not been fed back yet."""
        return len(self._inflight)

    # -- learning ------------------------------------------------------------------------

    def _bootstrap(self, event: Bootstrap, out: Collector) -> None:
        for bad in self.view.load(event.cluster, event.topics):
            self._rejected(bad, out)
        for error in event.topics.undecodable:
            kind, _, topic = _classify_quietly(error.key)
            if kind is RecordKind.TOPIC and topic is not None:
                # Not ours to repair; the topic exists (its age is unknown: old enough).
                self._opaque_topics.add(topic)
                out.reject(kind)
                out.log(str(error), logging.WARNING)
        for error in event.cluster.undecodable:
            kind, _, _ = _classify_quietly(error.key)
            out.reject(kind)
            out.log(str(error), logging.WARNING)
            self._repairs[error.key] = 0
        self._topics_revision = event.topics.revision
        self.history = MoveHistory.of(self.view.moves.values())
        for broker, report in self.view.reports.items():
            self._smoothed[broker] = report
        for broker in list(self.view.reports):
            if broker not in self.view.registrations:
                self._forget_report(broker)
        out.note(
            f"bootstrapped: {len(self.view.registrations)} brokers, "
            f"{len(self.view.owners)} assigned topics, {len(self.view.markers)} markers, "
            f"{len(self.history.moves)} moves in history"
        )
        self._ownership_check = set(self.view.owners) | set(self.view.owner_records)
        self.bootstrapped = True
        self._dirty = True
        self._reports_dirty = True
        self._next_check = event.now + self.rebalancing.check_interval_seconds

    def _on_event(self, event: WatchEvent, now: float, out: Collector) -> None:
        kind, broker, topic = _classify_quietly(event.key)
        if kind is RecordKind.TOPIC or event.key.startswith(keys.TOPICS_PREFIX):
            self._topics_revision = max(self._topics_revision, event.revision)
        if event.kind == "error":
            out.reject(kind)
            out.log(str(event.error), logging.WARNING)
            if kind in (RecordKind.MARKER, RecordKind.ASSIGNMENT, RecordKind.STATE):
                self._repairs[event.key] = event.revision
                self._dirty = True
            if kind is RecordKind.TOPIC and topic is not None:
                self._opaque_topics.add(topic)
            return
        if event.kind not in ("put", "delete"):
            return
        unknown = broker is not None and broker not in self.view.registrations
        if kind is RecordKind.LOAD and event.kind == "put" and unknown:
            out.reject("unknown_broker")
            out.log(f"load report from unknown broker {broker!r} ignored", logging.WARNING)
            return
        try:
            change = self.view.apply(event.kind, event.key, event.value, event.revision)
        except BadRecord as bad:
            self._rejected(bad, out)
            return
        if change is None:
            return
        if change.kind is RecordKind.LOAD:
            if not change.deleted and change.broker is not None:
                self._on_report(change.broker, now, out)
            self._reports_dirty = True
        elif change.kind in (
            RecordKind.REGISTRATION,
            RecordKind.STATE,
            RecordKind.ASSIGNMENT,
            RecordKind.MARKER,
            RecordKind.OWNER,
        ):
            self._dirty = True
            if change.kind in (RecordKind.ASSIGNMENT, RecordKind.OWNER) and change.topic:
                self._ownership_check.add(change.topic)
            if change.kind in (RecordKind.REGISTRATION, RecordKind.STATE):
                self._reports_dirty = True
        elif change.kind is RecordKind.HISTORY:
            self.history = MoveHistory.of(self.view.moves.values())
        elif change.kind is RecordKind.TOPIC:
            if change.topic is not None:
                self._opaque_topics.discard(change.topic)
            self._dirty = True
        elif change.kind is RecordKind.BUNDLES:
            self._dirty = True  # markers waiting are placed by the new layout

    def _on_report(self, broker: BrokerId, now: float, out: Collector) -> None:
        report = self.view.reports[broker]
        self._smoothed[broker] = smooth_report(
            self._smoothed.get(broker), report, self.rebalancing.smoothing_weight
        )
        out.history.append(HistoryRecord(report, self.view.state(broker).mode))
        self._retire_estimate(broker, now)

    def _waiting_since(self, topic: str, revision: int, now: float) -> float:
        """When this leader first saw the marker of `topic` (at `revision`) waiting."""
        seen = self._seal_wait.get(topic)
        if seen is None or seen[0] != revision:
            self._seal_wait[topic] = (revision, now)
            return now
        return seen[1]

    def _on_tick(self, now: float) -> None:
        timeout = self.rebalancing.seal_timeout_seconds
        for topic, pending in self.view.markers.items():
            if pending.marker.ready:
                continue
            if now - self._waiting_since(topic, pending.revision, now) >= timeout:
                self._dirty = True
                return
        if self._meta_wait and any(
            now - since >= META_GRACE_SECONDS for since in self._meta_wait.values()
        ):
            self._dirty = True

    def _on_write_done(self, done: WriteDone, out: Collector) -> None:
        pending = self._inflight.pop(done.id, None)
        if pending is None:
            out.log(f"outcome of unknown write {done.id} ignored", logging.WARNING)
            return
        write = pending.write
        if done.succeeded:
            for op in write.ops:
                value = op.value if isinstance(op, Put) else None
                try:
                    self.view.apply(
                        "put" if isinstance(op, Put) else "delete", op.key, value, done.revision
                    )
                except BadRecord as bad:  # our own value: a bug, but never fatal
                    self._rejected(bad, out)
            self._succeeded(pending.intent, done.now, out)
        else:
            out.metric("fence_failures")
            out.log(f"{write.what}: state changed underneath; deciding again")
            for fresh in done.refreshed:
                self._refresh(fresh, out)
            if isinstance(pending.intent, MoveTopics):
                out.metric("failures")
        self._dirty = True

    def _refresh(self, fresh: Refreshed, out: Collector) -> None:
        if fresh.key == keys.LEADER:
            return
        kind, _, topic = _classify_quietly(fresh.key)
        if fresh.undecodable:
            if kind is RecordKind.TOPIC and topic is not None:
                self._opaque_topics.add(topic)
            elif fresh.key.startswith(keys.CLUSTER_PREFIX):
                self._repairs[fresh.key] = 0
            return
        try:
            if not fresh.present:
                # Unknown delete revision: just past what we knew, so later events apply.
                self.view.apply("delete", fresh.key, None, self.view.revision_of(fresh.key) + 1)
            else:
                self.view.apply("put", fresh.key, fresh.value, fresh.mod_revision)
                if kind is RecordKind.TOPIC and topic is not None:
                    self._opaque_topics.discard(topic)
            if kind in (RecordKind.ASSIGNMENT, RecordKind.OWNER) and topic is not None:
                self._ownership_check.add(topic)
        except BadRecord as bad:
            self._rejected(bad, out)

    def _rejected(self, bad: BadRecord, out: Collector) -> None:
        out.reject(bad.kind)
        out.log(f"rejected {bad}", logging.WARNING)

    # -- estimates and snapshots ---------------------------------------------------------

    def snapshot(
        self, *, pending: bool = True, exclude: Collection[str] = (), raw: bool = False
    ) -> ClusterSnapshot:
        """The view's snapshot with smoothed reports (`raw`: the latest ones), estimates
        where a move of ours is not reported yet, and, with `placement_unit: bundle`, the
        namespaces' bundle layouts."""
        snap = self.view.snapshot(pending=pending, exclude=exclude)
        if raw:
            reports = dict(snap.reports)
        else:
            reports = {b: self._smoothed.get(b, r) for b, r in snap.reports.items()}
        for broker, (estimate, _, _) in self._estimates.items():
            if broker in reports or broker in snap.brokers:
                reports[broker] = estimate
        snap = replace(snap, reports=reports)
        if self.by_bundle:
            snap = prepare_snapshot(snap, self.config.load_manager, self._layouts())
        return snap

    def _layouts(self) -> dict[str, NamespaceBundles]:
        """The stored layouts, and Pulsar's default one for every other namespace the
        leader knows a topic of (topics being placed included: they own nothing yet)."""
        layouts = dict(self.view.bundles)
        n = self.pulsar.default_number_of_namespace_bundles
        for topic in itertools.chain(self.view.topics, self.view.markers, self.view.owners):
            ns = topic_namespace(topic)
            if ns not in layouts:
                layouts[ns] = NamespaceBundles.create(ns, n)
        return layouts

    def _estimate(self, after: ClusterSnapshot, move: Move, now: float) -> None:
        for broker, present in ((move.from_broker, False), (move.to_broker, True)):
            report = after.reports.get(broker)
            if report is None:
                continue
            expected = dict(self._estimates[broker][1]) if broker in self._estimates else {}
            expected[move.topic] = present
            self._estimates[broker] = (report, expected, now)

    def _retire_estimate(self, broker: BrokerId, now: float) -> None:
        """Drop a broker's estimate once its real report shows every move (or is late)."""
        entry = self._estimates.get(broker)
        report = self.view.reports.get(broker)
        if entry is None or report is None:
            return
        _, expected, since = entry
        reported = {t.topic for t in report.topics}
        shown = all((topic in reported) == present for topic, present in expected.items())
        interval = self.config.load_manager.load_report_interval_seconds
        if shown or now - since > 5 * interval:
            del self._estimates[broker]
            # The move changed the broker's load for real: readings from before it are
            # history of another load, so smoothing starts again from this report.
            self._smoothed[broker] = report

    def _forget_report(self, broker: BrokerId) -> None:
        self.view.forget_report(broker)
        if broker not in self.view.registrations:
            self._smoothed.pop(broker, None)
            self._estimates.pop(broker, None)

    # -- acting --------------------------------------------------------------------------

    def _emit(self, intents: list[Intent], out: Collector) -> None:
        """Ask for the writes of `intents`, each keyed by its id to the part it carries."""
        for intent in intents:
            for txn in transactions(intent):
                write = Write(next(self._ids), txn.compares, txn.ops, txn.what)
                self._inflight[write.id] = _InFlight(write, txn.part)
                out.writes.append(write)

    def _act(self, now: float, out: Collector) -> None:
        if not self.bootstrapped:
            return
        if not self._inflight:
            if self._dirty:
                self._dirty = False
                self._emit(self._reconcile(now, out), out)
            if not out.writes and now >= self._next_check:
                self._next_check = now + self.rebalancing.check_interval_seconds
                self._emit(self._rebalance(now, out), out)
        if self._reports_dirty and now >= self._next_rankings:
            self._reports_dirty = False
            self._next_rankings = now + self.rankings_interval
            out.rankings = PostRankings({"timestamp": now, **self.balance(out)})

    def _reconcile(self, now: float, out: Collector) -> list[Intent]:
        """Steps 1-8 of a round (the module docstring): what to write, in order."""
        intents: list[Intent] = []
        for key, revision in sorted(self._repairs.items()):
            intents += self._repair(key, revision or None, now)
        self._repairs.clear()
        for broker in sorted(b for b in self.view.by_broker if b not in self.view.registrations):
            intents += self._failover(broker, now, out)
        for broker in sorted(b for b in self.view.reports if b not in self.view.registrations):
            if broker not in self.view.by_broker:
                self._forget_report(broker)
        intents += self._release_seals(now)
        for broker in self.view.brokers():
            if self.view.state(broker).mode is BrokerMode.DRAINING:
                intents += self._drain(broker, now)
        intents += self._repair_ownership()
        intents += self._unload_split(now)
        if not intents:
            intents += self._assign(now, out)
        return intents

    def _repair(self, key: str, revision: int | None, now: float) -> list[Intent]:
        """Replace an undecodable value under ``/cluster/`` so the leader can go on."""
        kind, _, _ = _classify_quietly(key)
        guard = (
            Compare.present(key) if revision is None else Compare.mod_revision_equals(key, revision)
        )
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
            return []  # owned by a broker's lease / the election; never rewritten here
        else:
            op = Delete(key)
        return [Repair(key, str(kind), guard, op)]

    def _failover(self, dead: BrokerId, now: float, out: Collector) -> list[Intent]:
        """Reassign a dead broker's topics to the survivors, levelled by the core."""
        everything = self.view.topics_of(dead)
        if not everything:
            return []
        owned = {t: everything[t] for t in sorted(everything)[:FAILOVER_TOPICS_PER_ROUND]}
        snap = self.snapshot(pending=True)
        report = self.view.reports.get(dead)
        snap = replace(
            snap,
            brokers=(*snap.brokers, dead),
            assignments={**snap.assignments, dead: tuple(sorted(owned))},
            reports={**snap.reports, **({dead: report} if report is not None else {})},
        )
        plan = plan_failover(snap, dead, self.strategy, self.last_chosen, now, self.pulsar)
        self.last_chosen = plan.last_chosen
        hints = dict(plan.placements)
        targets = {p.broker for p in hints.values() if p.broker is not None}
        topics = tuple(
            Reassign(t, owned[t], hints[t].broker if t in hints else None) for t in sorted(owned)
        )
        left = len(everything) - len(owned)
        out.note(
            f"[failover] {dead} is gone: reassigning {len(topics)} topic(s) to "
            f"{len(targets)} survivor(s)" + (f", {left} more next round" if left else "")
        )
        if not left:
            out.metric("failovers")
        return [Failover(dead, topics, now)]

    def _release_seals(self, now: float) -> list[Intent]:
        """Markers waiting for a seal: released when the source is gone, forced when it has
        not sealed within `seal_timeout_seconds`."""
        timeout = self.rebalancing.seal_timeout_seconds
        for gone in self._seal_wait.keys() - self.view.markers.keys():
            del self._seal_wait[gone]
        intents: list[Intent] = []
        for topic, pending in sorted(self.view.markers.items()):
            marker = pending.marker
            if marker.ready:
                continue
            source = marker.from_broker
            if source is None or source not in self.view.registrations:
                intents.append(Release(topic, pending.revision, marker))
            elif now - self._waiting_since(topic, pending.revision, now) >= timeout:
                why = (
                    f"[seal-timeout] {source} did not seal {topic} within {timeout:.0f}s "
                    f"({marker.reason.value} to {marker.to_broker or 'any broker'})"
                )
                intents.append(Force(topic, pending.revision, marker, why))
        return intents

    def _drain(self, broker: BrokerId, now: float) -> list[Intent]:
        """Unload a draining broker's topics; mark it drained once nothing is left.

        Topics with clients (per the broker's last report) go first, on their own; the
        others once those are placed: a live topic then opens on its new owner without
        hundreds of idle topics opening beside it (its clients' pause is one move's)."""
        owned = dict(self.view.topics_of(broker))
        if owned:
            live = {t for t in self._busy(broker) if t in owned}
            if not live and self._unloading(broker):
                return []  # the live topics are still moving: the rest after them
            markers = plan_drain(self.view.snapshot(pending=False), broker, now)
            first = live if live and len(live) < len(owned) else owned.keys()
            unloads = tuple(Unload(t, broker, owned[t], m) for t, m in markers if t in first)
            return [Drain(broker, unloads)] if unloads else []
        sealing = any(
            p.marker.from_broker == broker and not p.marker.ready
            for p in self.view.markers.values()
        )
        if sealing:
            return []  # still sealing: drained means nothing of it is left anywhere
        return [Drained(broker, self.view.state_revisions.get(broker, 0))]

    def _busy(self, broker: BrokerId) -> set[str]:
        """The broker's topics with clients or traffic in its last report."""
        report = self.view.reports.get(broker)
        if report is None:
            return set()
        return {
            t.topic
            for t in report.topics
            if t.producers or t.consumers or t.msg_rate > 0 or t.byte_rate > 0
        }

    def _unloading(self, broker: BrokerId) -> bool:
        """Whether topics unloaded from `broker` still wait for a new owner."""
        return any(p.marker.from_broker == broker for p in self.view.markers.values())

    def _repair_ownership(self) -> list[Intent]:
        """Ownership records out of step with assignments (written by older tools).

        Only topics whose assignment or record changed since the last round are checked.
        """
        view = self.view
        check, self._ownership_check = self._ownership_check, set()
        intents: list[Intent] = []
        for topic in sorted(check):
            owners = view.owners.get(topic, {})
            record = view.owner_records.get(topic)
            if record is None and len(owners) == 1:
                ((broker, revision),) = owners.items()
                intents.append(RecordOwner(topic, broker, revision))
            elif record is not None and record[0] not in owners:
                intents.append(RemoveOwner(topic, record[0], record[1]))
        return intents

    def _unload_split(self, now: float) -> list[Intent]:
        """Unload the topics of bundles this leader split (each still on the broker it was
        on at the split), so that placement spreads the new bundles."""
        todo, self._split_unloads = self._split_unloads, []
        unloads = tuple(
            Unload(
                t,
                b,
                r,
                UnassignedMarker(MarkerReason.UNLOAD, from_broker=b, timestamp=now, ready=False),
            )
            for t, b in todo
            if (r := self.view.topics_of(b).get(t)) is not None
        )
        return [UnloadSplit(unloads)] if unloads else []

    def _split(self) -> list[Intent]:
        """Pulsar's automatic bundle split (`auto_split`): every namespace's new layout
        (compared on the stored one); nothing if nothing was split."""
        if not self.by_bundle or not self.pulsar.auto_bundle_split_enabled:
            return []
        snap = self.snapshot(pending=False)
        split = auto_split(snap, self.pulsar)
        if not split.results:
            return []
        unload: dict[str, list[tuple[str, BrokerId]]] = {}
        for topic, broker in split.unload:
            unload.setdefault(topic_namespace(topic), []).append((topic, broker))
        intents: list[Intent] = []
        for ns, layout in sorted(split.layouts.items()):
            if tuple(snap.bundle_boundaries.get(ns, ())) == layout.boundaries:
                continue
            revision = (
                self.view.revision_of(keys.namespace_bundles(ns)) if ns in self.view.bundles else 0
            )
            why = tuple(
                f"{s.name}: {', '.join(s.exceeded)}" for s in split.plan.splits if s.namespace == ns
            )
            added = len(layout) - (len(snap.bundle_boundaries[ns]) - 1)
            intents.append(
                SplitBundles(ns, revision, layout, added, tuple(unload.get(ns, ())), why)
            )
        return intents

    def _assign(self, now: float, out: Collector) -> list[Intent]:
        """Place every ready marker: a few topics per transaction (assignment, ownership
        record and marker delete), guarded by one ownership compare per topic."""
        intents: list[Intent] = []
        batch: list[tuple[str, int, UnassignedMarker]] = []
        view = self.view
        for topic in [t for t in self._meta_wait if t not in view.markers]:
            del self._meta_wait[topic]  # the marker went away by other hands
        for topic, pending in sorted(view.markers.items(), key=lambda e: (e[1].revision, e[0])):
            if not pending.marker.ready:
                continue
            owner = view.owner(topic)
            if owner is not None:
                intents.append(
                    DropMarker(
                        topic,
                        pending.revision,
                        "marker_assigned_topic",
                        f"{topic} is already owned by {owner}",
                        (Compare.present(keys.broker_assignment(owner, topic)),),
                    )
                )
                continue
            if topic not in view.topics and topic not in self._opaque_topics:
                since = self._meta_wait.setdefault(topic, now)
                if pending.revision <= self._topics_revision or now - since >= META_GRACE_SECONDS:
                    intents.append(
                        DropMarker(
                            topic,
                            pending.revision,
                            "marker_unknown_topic",
                            f"{topic} has no metadata (deleted or never created)",
                            (Compare.absent(keys.topic_meta(topic)),),
                        )
                    )
                continue  # the ``/topics/`` watch has not caught up yet: wait for it
            self._meta_wait.pop(topic, None)
            hint = pending.marker.to_broker
            if hint is not None and hint not in view.registrations:
                mark = (topic, pending.revision)
                if mark not in self._unknown_hints:
                    self._unknown_hints.add(mark)
                    out.reject("unknown_broker")
                    out.log(
                        f"{topic}: hint to_broker {hint!r} is not a registered broker; "
                        "placing elsewhere",
                        logging.WARNING,
                    )
            batch.append((topic, pending.revision, pending.marker))
        if not batch:
            return intents
        snapshot = self.snapshot(exclude={t for t, _, _ in batch})
        plan = place_topics(
            snapshot, self.strategy, [(t, m) for t, _, m in batch], self.last_chosen, self.pulsar
        )
        self.last_chosen = plan.last_chosen
        revisions = {t: (r, m) for t, r, m in batch}
        placed: list[Placement] = []
        for topic, placement in plan.placements:
            if placement.broker is None:
                if topic not in self._stuck:
                    self._stuck.add(topic)
                    out.note(f"[no-broker] {topic} waits: {placement.explain()}")
                continue
            self._stuck.discard(topic)
            revision, marker = revisions[topic]
            placed.append(Placement(topic, placement.broker, revision, marker))
        if placed:
            intents.append(Place(tuple(placed), now))
        return intents

    # -- rebalancing ---------------------------------------------------------------------

    def _rebalance(self, now: float, out: Collector) -> list[Intent]:
        """Step 9, one rebalancing check: split hot bundles, or ask the core for a decision
        and write every move of it."""
        out.metric("checks")
        in_flight = any(
            p.marker.reason is MarkerReason.REBALANCE for p in self.view.markers.values()
        )
        if in_flight:
            return []  # one decision at a time: the next one waits for this one's effect
        split = self._split()
        if split:
            return split  # the next check sees the new bundles
        # A shedder smooths the usage itself (ThresholdShedder's history_resource_percentage);
        # it reads the latest reports, as Pulsar's do, rather than smoothing twice.
        snapshot = self.snapshot(raw=self.shedding)
        decision = decide_rebalance(
            snapshot,
            self.history,
            now,
            self.rebalancing,
            self.strategy,
            self.episode,
            pulsar=self.pulsar,
            shedder_state=self.shedder_state,
        )
        self.episode = decision.episode
        if self.shedding:
            self.shedder_state = (
                dict(decision.shedder_state) if decision.shedder_state is not None else None
            )
        self.last_decision = decision
        out.decision = decision
        moves = decision.moves or ((decision.move,) if decision.move is not None else ())
        if not moves:
            if decision.rule != self._last_rule:
                out.note(decision.explain())
            self._last_rule = decision.rule
            return []
        self._last_rule = decision.rule
        after = decision.after if len(moves) == 1 else None
        if after is None:
            after = snapshot
            for move in moves:
                after = apply_move(after, move.topic, move.from_broker, move.to_broker)
        relocations: list[Relocation] = []
        for move in moves:
            revision = self.view.topics_of(move.from_broker).get(move.topic)
            if revision is None:
                out.metric("failures")
                continue
            relocations.append(Relocation(move, revision))
        if not relocations:
            return []
        return [MoveTopics(tuple(relocations), after, decision.explain(), now)]

    # -- success bookkeeping -------------------------------------------------------------

    def _succeeded(self, intent: Intent, now: float, out: Collector) -> None:
        match intent:
            case Place(placements=placements):
                for p in placements:
                    out.metric("assignments", broker_id=p.target, action="assign")
                    if p.marker.reason is not MarkerReason.NEW:
                        out.note(f"[{p.marker.reason.value}] {p.topic} → {p.target}")
            case Failover(dead=dead, topics=topics):
                out.metric("assignments", len(topics), broker_id=dead, action="unassign")
                for target in (t.target for t in topics):
                    if target is not None:
                        out.metric("assignments", broker_id=target, action="assign")
            case Drain(broker=broker, unloads=unloads):
                out.metric("assignments", len(unloads), broker_id=broker, action="unassign")
                out.note(f"[drain] {broker}: unloading {len(unloads)} topic(s)")
            case Drained(broker=broker):
                out.note(f"[drain] {broker} is drained")
            case Release(topic=topic, marker=marker):
                out.note(
                    f"[release] {topic}: source {marker.from_broker} is gone; no seal to wait for"
                )
            case Force(why=why):
                out.metric("forced_moves")
                out.note(f"{why}; proceeding (forced)")
            case DropMarker(topic=topic, reason=reason, why=why):
                self._meta_wait.pop(topic, None)
                out.reject(reason)
                out.note(f"[bad-marker] dropped the marker of {topic}: {why}")
            case Repair(key=key, record=record):
                out.note(f"repaired undecodable {record} at {key}")
            case MoveTopics(relocations=relocations, after=after, explanation=explanation):
                for move in (r.move for r in relocations):
                    self.history = self.history.add(move)
                    self._estimate(after, move, now)
                    out.metric("moves")
                    out.metric("assignments", broker_id=move.from_broker, action="unassign")
                    out.moved.append(move)
                if explanation is not None:
                    out.note(explanation)
            case SplitBundles(namespace=ns, added=added, unload=unload, why=why):
                out.metric("bundle_splits", added)
                out.note(f"[bundle-split] {ns}: {added} new bundle(s) ({'; '.join(why)})")
                self._split_unloads += unload
            case UnloadSplit(unloads=unloads):
                for u in unloads:
                    out.metric("assignments", broker_id=u.broker, action="unassign")
                out.note(f"[bundle-split] unloading {len(unloads)} topic(s) of split bundles")
            case RecordOwner() | RemoveOwner():
                pass  # nothing to count: the view has applied the write

    # -- rankings ------------------------------------------------------------------------

    def balance(self, out: Collector | None = None) -> dict[str, Any]:
        """Rankings and balance statistics of the current view."""
        snapshot = self.snapshot()
        rankings = rank(snapshot, self.strategy, self.pulsar)
        active = set(snapshot.active_brokers())
        stats = measure({b: s for b, s in rankings.entries if b in active})
        if out is not None:
            out.metrics.append(MetricDelta("balance", len(active), kind="balance", extra=stats))
        return {
            "leader": self.leader,
            "term": self.term,
            "strategy": self.strategy.value,
            "rankings": rankings.to_dict(),
            "balance": stats.to_dict(),
            "decision": self.last_decision.explanation if self.last_decision else None,
        }


def effects_text(ready: Ready) -> list[str]:
    """A stable one-line-per-effect rendering (scripted tests, replay comparisons)."""
    lines: list[str] = []
    for w in ready.writes:
        lines.append(f"write {w.id}: {w.what}")
        lines += [f"  if {_compare_text(c)}" for c in w.compares]
        lines += [f"  {_op_text(op)}" for op in w.ops]
    if ready.rankings is not None:
        order = [e["broker_id"] for e in ready.rankings.payload["rankings"]]
        lines.append(f"rankings: {' '.join(order)}")
    lines += [f"history: {h.report.broker_id}" for h in ready.history]
    for m in ready.metrics:
        if m.kind == "inc":
            labels = ",".join(f"{k}={v}" for k, v in m.labels)
            lines.append(f"metric {m.name}{{{labels}}} +{m.value:g}")
    lines += [f"{'note' if line.note else 'log'}: {line.message}" for line in ready.logs]
    return lines


def _compare_text(c: Compare) -> str:
    if c.target == "version" and c.op == "==" and c.operand == 0:
        return f"absent {c.key}"
    if c.target == "version" and c.op == ">" and c.operand == 0:
        return f"present {c.key}"
    return f"{c.key} {c.target} {c.op} {c.operand}"


def _op_text(op: Put | Delete) -> str:
    if isinstance(op, Delete):
        return f"delete {op.key}"
    return f"put {op.key} {json.dumps(_compact(op.value), sort_keys=True, separators=(',', ':'))}"


def _compact(value: Any) -> Any:
    """A value without its times and nulls (stable across runs, short to read)."""
    if isinstance(value, dict):
        return {
            k: _compact(v)
            for k, v in value.items()
            if v is not None and k not in ("timestamp", "assigned_at", "since")
        }
    return value
