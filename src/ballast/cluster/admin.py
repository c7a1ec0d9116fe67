"""`AdminClient`: what an operator does to the cluster, over the metadata store.

Reads build a `ClusterView` from one listing of ``/cluster/`` and one of ``/topics/``.
Writes are guarded transactions (never blind puts): creating a topic writes its metadata
and its ``new`` marker together if the topic does not exist; unloading or moving a topic
writes the marker (``ready: false``) and deletes the owner's assignment together if the
owner still holds it. The leader does the rest (the owner seals, the leader assigns).
The CLI (`ballast admin …`) is a thin wrapper over this class.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ballast.balance import (
    Imbalance,
    MoveHistory,
    Placement,
    RebalancePlan,
    measure,
    plan_rebalance,
    rank,
    select_broker,
)
from ballast.balance.pulsar.domains import DomainError, FailureDomains
from ballast.balance.pulsar.policy import prepare_snapshot
from ballast.clock import Clock, SystemClock
from ballast.config import BallastConfig, Strategy
from ballast.leader.intents import Relocation
from ballast.leader.transactions import move_write
from ballast.leader.view import ClusterView
from ballast.metadata import (
    Compare,
    MetadataStore,
    Put,
    keys,
)
from ballast.metadata.records import TopicMeta, release_ops
from ballast.model import (
    BrokerId,
    BrokerMode,
    BrokerState,
    ClusterSnapshot,
    InvalidTopicName,
    MarkerReason,
    ModelError,
    Move,
    TopicName,
    UnassignedMarker,
    moves_from_dicts,
    topic_str,
    validate_broker_id,
)
from ballast.storage.catalog import StoredSize, stored_size


class AdminError(Exception):
    """An operation that cannot be done; the message says why and what to do."""


@dataclass(frozen=True)
class BrokerInfo:
    broker_id: BrokerId
    state: str
    reason: str
    topics: int
    score: float | None
    leader: bool
    registered: bool
    broker_url: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "broker_id": self.broker_id,
            "state": self.state,
            "reason": self.reason,
            "topics": self.topics,
            "score": self.score,
            "leader": self.leader,
            "registered": self.registered,
            "broker_url": self.broker_url,
        }


@dataclass(frozen=True)
class TopicInfo:
    topic: str
    owner: BrokerId | None
    state: str  # assigned | unassigned | moving | sealing
    age_seconds: float | None
    marker: UnassignedMarker | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "owner": self.owner,
            "state": self.state,
            "age_seconds": self.age_seconds,
            "marker": self.marker.to_dict() if self.marker is not None else None,
        }


@dataclass(frozen=True)
class TopicDetail:
    info: TopicInfo
    meta: Mapping[str, Any]
    placement: Placement  # where the topic would go if it were placed now, and why
    storage: StoredSize | None = None  # a reliable topic's objects in the object store
    # Its owner's backpressure figures (`broker.pressure`), if it ever felt a limit.
    pressure: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.info.to_dict(),
            "meta": dict(self.meta),
            "storage": self.storage.to_dict() if self.storage is not None else None,
            "pressure": dict(self.pressure) if self.pressure is not None else None,
            "placement": {
                "broker": self.placement.broker,
                "reason": self.placement.reason,
                "candidates": list(self.placement.candidates),
                "rejected": dict(self.placement.rejected),
                "scores": dict(self.placement.scores),
            },
        }


@dataclass(frozen=True)
class BalanceReport:
    strategy: Strategy
    stats: Imbalance
    leader_decision: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy.value,
            **self.stats.to_dict(),
            "leader_decision": self.leader_decision,
        }


@dataclass(frozen=True)
class MoveOutcome:
    move: Move
    applied: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.move.to_dict(), "applied": self.applied, "reason": self.reason}


@dataclass(frozen=True)
class RebalanceResult:
    plan: RebalancePlan
    dry_run: bool
    outcomes: tuple[MoveOutcome, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.plan.to_dict(),
            "dry_run": self.dry_run,
            "outcomes": [o.to_dict() for o in self.outcomes],
        }


def _validated_broker(broker_id: str) -> None:
    try:
        validate_broker_id(broker_id)
    except ModelError as exc:
        raise AdminError(str(exc)) from None


def _topic(value: str) -> str:
    try:
        return topic_str(value)
    except InvalidTopicName as exc:
        raise AdminError(str(exc)) from None


class AdminClient:
    """Operator commands over `store`. `config` supplies the rebalancing rules for plans.

    `views`, when given, supplies the `ClusterView` that reads and checks use instead of
    listing the store each time (the console passes the view its watch keeps current;
    writes stay guarded by their compares either way).
    """

    def __init__(
        self,
        store: MetadataStore,
        clock: Clock | None = None,
        config: BallastConfig | None = None,
        *,
        views: Callable[[], Awaitable[ClusterView]] | None = None,
    ) -> None:
        self.store = store
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.config = config if config is not None else BallastConfig()
        self._views = views

    # -- reading -------------------------------------------------------------------------

    async def view(self) -> ClusterView:
        """The cluster as stored right now (or as the `views` source last saw it)."""
        if self._views is not None:
            return await self._views()
        return await self.listed_view()

    async def listed_view(self) -> ClusterView:
        """The cluster as listed from the store right now."""
        cluster = await self.store.get_prefix(keys.CLUSTER_PREFIX)
        topics = await self.store.get_prefix(keys.TOPICS_PREFIX)
        view, _ = ClusterView.from_listings(cluster, topics)
        return view

    def strategy(self, view: ClusterView) -> Strategy:
        """The strategy the leader posted, else the configured one."""
        posted = (view.load_balance or {}).get("strategy")
        try:
            return Strategy(posted) if posted else self.config.load_manager.assignment_strategy
        except ValueError:
            return self.config.load_manager.assignment_strategy

    async def leader(self) -> dict[str, Any] | None:
        """The leader key's value (`broker_id`, `since`), or None during an election."""
        kv = await self.store.get(keys.LEADER)
        return kv.value if kv is not None and isinstance(kv.value, dict) else None

    async def brokers(self) -> list[BrokerInfo]:
        """Every registered broker (and any unregistered broker still holding topics)."""
        view = await self.view()
        scores = dict(rank(view.snapshot(), self.strategy(view)).entries)
        leader = (view.leader or {}).get("broker_id")
        out = []
        for broker in sorted(view.known_brokers()):
            registered = broker in view.registrations
            state = view.state(broker)
            out.append(
                BrokerInfo(
                    broker_id=broker,
                    state=state.mode.value if registered else "gone",
                    reason=state.reason,
                    topics=len(view.topics_of(broker)),
                    score=scores.get(broker),
                    leader=broker == leader,
                    registered=registered,
                    broker_url=view.registrations[broker].broker_url if registered else "",
                )
            )
        return out

    async def topics(self) -> list[TopicInfo]:
        """Every topic: owner, state and age."""
        view = await self.view()
        now = self.clock.now()
        names = set(view.topics) | set(view.owners) | set(view.markers)
        return [self.topic_info(view, t, now) for t in sorted(names)]

    def topic_info(self, view: ClusterView, topic: str, now: float) -> TopicInfo:
        """One topic of `view`: owner, state (assigned, sealing, moving, unassigned), age."""
        owner = view.owner(topic)
        pending = view.markers.get(topic)
        marker = pending.marker if pending is not None else None
        if owner is not None:
            state = "assigned"
        elif marker is not None and not marker.ready:
            state = "sealing"
        elif marker is not None and marker.reason is not MarkerReason.NEW:
            state = "moving"
        else:
            state = "unassigned"
        meta = view.topics.get(topic)
        age = now - meta.created_at if meta is not None and meta.created_at > 0 else None
        return TopicInfo(topic, owner, state, age, marker)

    async def describe(self, topic: str) -> TopicDetail:
        """A topic's owner, state, age, metadata, and where it would be placed now (why)."""
        name = _topic(topic)
        view = await self.view()
        if name not in view.topics and name not in view.owners and name not in view.markers:
            raise AdminError(f"topic {name} does not exist (create it with `topics create`)")
        info = self.topic_info(view, name, self.clock.now())
        # Served and not moving: where an unload would put it (the owner ruled out).
        marker = info.marker or UnassignedMarker(
            MarkerReason.UNLOAD, from_broker=info.owner, ready=True
        )
        snapshot = view.snapshot(exclude={name})
        placement = select_broker(
            snapshot,
            self.strategy(view),
            marker,
            topic=name,
            pulsar=self.config.load_manager.pulsar,
        )
        if info.marker is None and info.owner is not None:
            rejected = dict(placement.rejected)
            rejected[info.owner] = "[owner] serves it now (an unload moves it elsewhere)"
            placement = replace(placement, rejected=rejected)
        meta = view.topics.get(name)
        stored = await stored_size(self.store, TopicName.parse(name))
        kv = await self.store.get(keys.topic_pressure(name))
        pressure = kv.value if kv is not None and isinstance(kv.value, dict) else None
        if pressure is not None and pressure.get("broker") != info.owner:
            pressure = None  # a previous owner's figures: the topic moved since
        return TopicDetail(
            info,
            meta.to_dict() if meta is not None else {},
            placement,
            stored if stored.objects or stored.descriptor_keys else None,
            pressure,
        )

    async def balance(self) -> BalanceReport:
        """CV, mean, std, min, max and each active broker's classification."""
        view = await self.view()
        strategy = self.strategy(view)
        snapshot = view.snapshot()
        active = set(snapshot.active_brokers())
        scores = {b: s for b, s in rank(snapshot, strategy).entries if b in active}
        decision = (view.load_balance or {}).get("decision")
        return BalanceReport(
            strategy, measure(scores), decision if isinstance(decision, str) else None
        )

    async def history(self, limit: int | None = None) -> list[Move]:
        """Persisted moves, oldest first (the last `limit` if given)."""
        listing = await self.store.get_prefix(keys.HISTORY_PREFIX)
        moves = []
        for kv in listing.items:
            try:
                moves.append(Move.from_dict(kv.value))
            except ModelError:
                continue
        moves.sort(key=lambda m: m.timestamp)
        return moves[-limit:] if limit else moves

    # -- brokers -------------------------------------------------------------------------

    async def _require_broker(self, broker_id: str) -> ClusterView:
        _validated_broker(broker_id)
        view = await self.view()
        if broker_id not in view.registrations:
            raise await self._not_registered(broker_id)
        return view

    async def _not_registered(self, broker_id: str) -> AdminError:
        listing = await self.store.get_prefix(keys.REGISTER_PREFIX)
        known: list[str] = []
        for kv in listing.items:
            with contextlib.suppress(ValueError):  # a foreign key there names no broker
                known.append(keys.parse_register_key(kv.key))
        names = ", ".join(sorted(known)) or "none"
        return AdminError(f"broker {broker_id!r} is not registered (registered: {names})")

    async def drain(self, broker_id: str, reason: str = "drained by admin") -> None:
        """Set a broker draining: the leader unloads its topics, then marks it drained."""
        await self._set_state(broker_id, BrokerState(BrokerMode.DRAINING, reason))

    async def activate(self, broker_id: str, reason: str = "activated by admin") -> None:
        """Set a broker active again: it receives topics."""
        await self._set_state(broker_id, BrokerState(BrokerMode.ACTIVE, reason))

    async def _set_state(self, broker_id: str, state: BrokerState) -> None:
        # One transaction, no listing of the cluster: on a cluster of thousands of topics a
        # listing is seconds of etcd's and this process's time, only to check one key.
        _validated_broker(broker_id)
        result = await self.store.txn(
            [Compare.present(keys.register(broker_id))],
            [Put(keys.broker_state(broker_id), state.to_dict())],
        )
        if not result.succeeded:
            raise await self._not_registered(broker_id)

    # -- topics --------------------------------------------------------------------------

    async def create_topic(
        self, topic: str, *, hint: BrokerId | None = None, meta: Mapping[str, Any] | None = None
    ) -> str:
        """Create a topic: its metadata and its ``new`` marker, in one transaction."""
        name = _topic(topic)
        if hint is not None:
            try:
                validate_broker_id(hint, "hint")
            except ModelError as exc:
                raise AdminError(str(exc)) from None
        if not await self.create_topic_if_absent(name, hint=hint, meta=meta):
            raise AdminError(f"topic {name} already exists")
        return name

    async def create_topic_if_absent(
        self, topic: str, *, hint: BrokerId | None = None, meta: Mapping[str, Any] | None = None
    ) -> bool:
        """Like `create_topic`; False (no error) if it already exists."""
        now = self.clock.now()
        marker = UnassignedMarker(MarkerReason.NEW, to_broker=hint, timestamp=now, ready=True)
        result = await self.store.txn(
            [Compare.absent(keys.topic_meta(topic))],
            [
                Put(keys.topic_meta(topic), TopicMeta(now, dict(meta or {})).to_dict()),
                Put(keys.unassigned(topic), marker.to_dict()),
            ],
        )
        return result.succeeded

    async def create_topics(self, topics: Iterable[str]) -> int:
        """Create many topics (existing ones are skipped); returns how many were created."""
        created = 0
        for topic in topics:
            created += await self.create_topic_if_absent(_topic(topic))
        return created

    async def unload_topic(self, topic: str, to_broker: str | None = None) -> BrokerId:
        """Unload a topic from its owner; the leader places it on another broker, or, with
        `to_broker` (Pulsar's ``--destinationBroker``), the owner's seal hands it to that
        broker directly (the leader places it if that broker is gone by then)."""
        name = _topic(topic)
        view = await (self.view() if to_broker is None else self._require_broker(to_broker))
        owner = view.owner(name)
        if owner is None:
            raise AdminError(f"topic {name} is not assigned to any broker (nothing to unload)")
        if to_broker is not None:
            if to_broker == owner:
                raise AdminError(f"topic {name} is owned by {owner} already")
            mode = view.state(to_broker).mode
            if mode is not BrokerMode.ACTIVE:
                raise AdminError(f"broker {to_broker} is {mode.value}: it takes no topics")
        marker = UnassignedMarker(
            MarkerReason.UNLOAD,
            from_broker=owner,
            to_broker=to_broker,
            timestamp=self.clock.now(),
            ready=False,
        )
        key = keys.broker_assignment(owner, name)
        result = await self.store.txn(
            [Compare.mod_revision_equals(key, view.owners[name][owner])],
            [*release_ops(owner, name), Put(keys.unassigned(name), marker.to_dict())],
        )
        if not result.succeeded:
            raise AdminError(f"topic {name} changed owner meanwhile; look again and retry")
        return owner

    # -- rebalancing ---------------------------------------------------------------------

    def enrich(self, view: ClusterView, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """The snapshot with Pulsar's inputs as the view decoded them (issue 12): failure
        domains (a broker in two is an `AdminError` naming it, where the leader lets the
        admin's domain win), anti-affinity groups and, placed by bundle, the layouts."""
        registered = {b: r.domain for b, r in view.registrations.items()}
        try:
            domains = FailureDomains.merge(registered, view.failure_domains).broker_to_domain()
        except DomainError as exc:
            raise AdminError(str(exc)) from None
        snap = replace(
            snapshot,
            broker_domains=domains,
            anti_affinity_groups=dict(view.anti_affinity_groups),
        )
        return prepare_snapshot(snap, self.config.load_manager, view.bundles)

    async def plan(self, max_moves: int | None = None) -> tuple[RebalancePlan, ClusterView]:
        """A rebalance plan for the cluster as it is now (nothing is written)."""
        view = await self.view()
        history = MoveHistory.of(view.moves.values())
        snapshot = self.enrich(view, view.snapshot())
        plan = plan_rebalance(
            snapshot,
            self.config.load_manager.rebalancing,
            self.strategy(view),
            self.clock.now(),
            max_moves,
            history,
            pulsar=self.config.load_manager.pulsar,
        )
        return plan, view

    async def rebalance(
        self, *, dry_run: bool = True, max_moves: int | None = None
    ) -> RebalanceResult:
        """Plan moves toward `target_cv`; unless `dry_run`, start them (two-phase markers)."""
        plan, view = await self.plan(max_moves)
        if dry_run:
            return RebalanceResult(plan, True)
        outcomes = await self._apply(plan.moves, view)
        return RebalanceResult(plan, False, tuple(outcomes))

    async def apply_plan(self, plan: Mapping[str, Any] | str | Path) -> list[MoveOutcome]:
        """Start the moves of a saved plan (``rebalance --dry-run --json`` output)."""
        data: Any = plan
        if isinstance(plan, str | Path):
            try:
                data = json.loads(Path(plan).read_text())
            except (OSError, ValueError) as exc:
                raise AdminError(f"{plan}: cannot read the plan ({exc})") from None
        if not isinstance(data, Mapping) or not isinstance(data.get("moves"), list):
            raise AdminError("plan: expected a JSON object with a 'moves' list")
        try:
            moves = moves_from_dicts(data["moves"])
        except ModelError as exc:
            raise AdminError(f"plan: {exc}") from None
        return await self._apply(moves, await self.view())

    async def _apply(self, moves: Sequence[Move], view: ClusterView) -> list[MoveOutcome]:
        outcomes = []
        now = self.clock.now()
        for move in moves:
            owners = view.owners.get(move.topic, {})
            if move.from_broker not in owners:
                owner = view.owner(move.topic)
                outcomes.append(
                    MoveOutcome(move, False, f"skipped: {move.topic} is owned by {owner}")
                )
                continue
            if move.to_broker not in view.registrations:
                outcomes.append(
                    MoveOutcome(move, False, f"skipped: {move.to_broker} is not registered")
                )
                continue
            recorded = Move(
                move.topic, move.from_broker, move.to_broker, "Admin", move.estimated_load, now
            )
            guard, ops = move_write(Relocation(recorded, owners[move.from_broker]), now)
            result = await self.store.txn([guard], ops)
            outcomes.append(
                MoveOutcome(
                    move,
                    result.succeeded,
                    "started" if result.succeeded else "skipped: the owner changed meanwhile",
                )
            )
        return outcomes
