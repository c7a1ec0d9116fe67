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
8. placement (only when steps 1 and 3-7 wrote nothing; a failover's rounds do not hold
   it back): every ready marker is placed (`place_topics`) by transactions that write the
   assignment and the ownership record and delete the marker; markers of deleted topics
   and of owned topics are dropped;
9. rebalancing, when a check is due and nothing else was written: with
   `placement_unit: bundle`, Pulsar's automatic bundle split first (a split writes the new
   layout to ``/cluster/bundles/{ns}`` and the check ends there); then `decide_rebalance`
   (Danube's CV rule or the configured Pulsar shedder, whose smoothed usage the machine
   keeps between checks); every move of the decision is written, within the rate limits.

With `placement_unit: bundle`, every snapshot carries the namespaces' bundle layouts (the
stored ``/cluster/bundles/`` records, Pulsar's default layout for the others), so
placement, failover and the shedders keep a bundle's topics on one broker.

The steps live in `leader.rounds`, the state they read in `leader.state`; this module
holds the entry point, the learning and the booking of outcomes. Each step of a round
returns typed intents (`leader.intents`); `leader.transactions` turns
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

import logging

from ballast.balance import (
    MoveHistory,
)
from ballast.balance.smoothing import smooth_report
from ballast.leader.effects import (
    Bootstrap,
    Collector,
    Event,
    HistoryRecord,
    Ready,
    Refreshed,
    Tick,
    Watched,
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
    RecordOwner,
    Release,
    RemoveOwner,
    Repair,
    SplitBundles,
    UnloadSplit,
)
from ballast.leader.rounds import Rounds
from ballast.leader.state import META_GRACE_SECONDS, classify_quietly
from ballast.leader.view import BadRecord
from ballast.metadata import Put, WatchEvent, keys
from ballast.metadata.records import RecordKind
from ballast.model import (
    BrokerId,
    MarkerReason,
)


class LeaderMachine(Rounds):
    """One term of leadership as a pure state machine (see the module docstring)."""

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
            kind, _, topic = classify_quietly(error.key)
            if kind is RecordKind.TOPIC and topic is not None:
                # Not ours to repair; the topic exists (its age is unknown: old enough).
                self._opaque_topics.add(topic)
                out.reject(kind)
                out.log(str(error), logging.WARNING)
        for error in event.cluster.undecodable:
            kind, _, _ = classify_quietly(error.key)
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
        kind, broker, topic = classify_quietly(event.key)
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
        kind, _, topic = classify_quietly(fresh.key)
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
