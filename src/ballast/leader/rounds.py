"""A round of the leader's decisions (the steps 1-9 of `machine`'s docstring), each
returning the intents it decided; `_emit` asks for their writes."""

from __future__ import annotations

import logging
from dataclasses import replace

from ballast.balance import (
    decide_rebalance,
    place_topics,
    plan_drain,
    plan_failover,
)
from ballast.balance.estimate import apply_move
from ballast.balance.pulsar.policy import auto_split
from ballast.leader.effects import (
    Collector,
    PostRankings,
    Write,
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
from ballast.leader.state import (
    FAILOVER_TOPICS_PER_ROUND,
    META_GRACE_SECONDS,
    InFlight,
    LeaderState,
    classify_quietly,
)
from ballast.leader.transactions import transactions
from ballast.metadata import Compare, Delete, Put, keys
from ballast.metadata.records import RecordKind
from ballast.model import (
    Assignment,
    BrokerId,
    BrokerMode,
    BrokerState,
    MarkerReason,
    UnassignedMarker,
    topic_namespace,
)


class Rounds(LeaderState):
    """The round's steps, over the state of `LeaderState`."""

    # -- acting --------------------------------------------------------------------------

    def _emit(self, intents: list[Intent], out: Collector) -> None:
        """Ask for the writes of `intents`, each keyed by its id to the part it carries."""
        for intent in intents:
            for txn in transactions(intent):
                write = Write(next(self._ids), txn.compares, txn.ops, txn.what)
                self._inflight[write.id] = InFlight(write, txn.part)
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
        failovers: list[Intent] = []
        for broker in sorted(b for b in self.view.by_broker if b not in self.view.registrations):
            failovers += self._failover(broker, now, out)
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
            # Not held back by a failover's rounds (10 000 topics take 25): a topic the dead
            # broker was moving when it died, busy by nature (a rebalance moves load), is
            # released in the first round and placed in the next, not after the last one.
            intents += self._assign(now, out)
        return [*failovers, *intents]

    def _repair(self, key: str, revision: int | None, now: float) -> list[Intent]:
        """Replace an undecodable value under ``/cluster/`` so the leader can go on."""
        kind, _, _ = classify_quietly(key)
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
        # Topics with clients (per its last report) in the first rounds, as in a drain:
        # theirs are the clients waiting (10 000 topics take 25 rounds).
        busy = self._busy(dead)
        order = sorted(everything, key=lambda t: (t not in busy, t))
        owned = {t: everything[t] for t in order[:FAILOVER_TOPICS_PER_ROUND]}
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
        # Only the waiting ones sorted: a drain of thousands has them all in the view, and
        # this runs on every step.
        waiting = [(t, p) for t, p in self.view.markers.items() if not p.marker.ready]
        for topic, pending in sorted(waiting):
            marker = pending.marker
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
        ready = [(t, p) for t, p in view.markers.items() if p.marker.ready]  # as above
        for topic, pending in sorted(ready, key=lambda e: (e[1].revision, e[0])):
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
