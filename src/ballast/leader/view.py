"""An in-memory picture of the cluster, built from the metadata store.

The leader lists ``/cluster/`` once (one consistent read) and then applies every watch
event; the admin client builds one from a listing. Every key remembers the revision it was
last changed at, deletes included, so a stale event changes nothing: the echo of the
leader's own write (applied locally as soon as the write succeeded) or an event replayed
from before a listing. The view is a hint for decisions; correctness comes from the
compares in every write.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from ballast.balance.pulsar.bundles import BundleError, NamespaceBundles
from ballast.balance.pulsar.domains import broker_domains
from ballast.metadata import Listing, keys
from ballast.metadata.records import (
    RecordKind,
    Registration,
    TopicMeta,
    parse_anti_affinity_value,
    parse_assignment_value,
    parse_failure_domain_value,
    parse_owner_value,
)
from ballast.metadata.records import classify as classify_key
from ballast.model import (
    ACTIVE,
    BrokerId,
    BrokerState,
    ClusterSnapshot,
    LoadReport,
    ModelError,
    Move,
    UnassignedMarker,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Change:
    """What one applied event changed (None from `apply` means: stale, nothing changed)."""

    kind: RecordKind
    key: str
    deleted: bool
    broker: BrokerId | None = None
    topic: str | None = None


class BadRecord(Exception):
    """A key or value that does not fit the layout; `kind` labels the rejection metric."""

    def __init__(self, kind: RecordKind | str, key: str, reason: str) -> None:
        super().__init__(f"{kind} at {key!r}: {reason}")
        self.kind = str(kind)
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class Pending:
    """An unassigned marker and the revision it was written at (the compare operand)."""

    marker: UnassignedMarker
    revision: int


def classify(key: str) -> tuple[RecordKind, BrokerId | None, str | None]:
    """(kind, broker, topic) of a key; raises `BadRecord` for a key that fits no layout."""
    try:
        return classify_key(key)
    except ValueError as exc:  # KeyLayoutError and invalid names
        raise BadRecord("key", key, str(exc)) from None


class ClusterView:
    """Registrations, states, assignments, markers, reports, history and topics."""

    def __init__(self) -> None:
        self.registrations: dict[BrokerId, Registration] = {}
        self.states: dict[BrokerId, BrokerState] = {}
        self.state_revisions: dict[BrokerId, int] = {}
        # topic -> {broker: revision}; more than one owner would be a broken invariant.
        self.owners: dict[str, dict[BrokerId, int]] = {}
        self.by_broker: dict[BrokerId, dict[str, int]] = {}
        self.markers: dict[str, Pending] = {}
        # topic -> (broker, revision) of its ownership record (`keys.topic_owner`).
        self.owner_records: dict[str, tuple[BrokerId, int]] = {}
        self.reports: dict[BrokerId, LoadReport] = {}
        self.moves: dict[str, Move] = {}
        self.topics: dict[str, TopicMeta] = {}
        # Kept as the records change, so that a snapshot (one per placement round) copies
        # them instead of rebuilding them from every topic: each topic's creation time and
        # each broker's sorted topics (None: changed since the last snapshot).
        self._created: dict[str, float] = {}
        self._created_copy: dict[str, float] | None = None
        self._sorted: dict[BrokerId, tuple[str, ...]] = {}
        self.leader: dict[str, Any] | None = None
        self.load_balance: dict[str, Any] | None = None
        # Pulsar (issue 12): failure domains created by admin, namespace anti-affinity groups.
        self.failure_domains: dict[str, tuple[BrokerId, ...]] = {}
        self.anti_affinity_groups: dict[str, str] = {}
        # Namespaces whose bundles are stored (``/cluster/bundles/{ns}``): their layouts.
        self.bundles: dict[str, NamespaceBundles] = {}
        self._revisions: dict[str, int] = {}

    # -- building ------------------------------------------------------------------------

    @classmethod
    def from_listings(cls, *listings: Listing) -> tuple[ClusterView, list[BadRecord]]:
        """A view of the listed keys, and the records that had to be skipped."""
        view = cls()
        bad = view.load(*listings)
        return view, bad

    def load(self, *listings: Listing) -> list[BadRecord]:
        """Apply every listed key as a put at its mod revision; bad records are skipped."""
        bad: list[BadRecord] = []
        for listing in listings:
            for kv in listing.items:
                try:
                    self.apply("put", kv.key, kv.value, kv.mod_revision)
                except BadRecord as exc:
                    bad.append(exc)
        return bad

    def revision_of(self, key: str) -> int:
        """The revision the key was last seen changing at (0: never seen)."""
        return self._revisions.get(key, 0)

    # -- applying changes ----------------------------------------------------------------

    def apply(
        self, kind: Literal["put", "delete"], key: str, value: Any, revision: int
    ) -> Change | None:
        """Apply one change; None if it is stale. Raises `BadRecord` (view unchanged)."""
        if revision <= self._revisions.get(key, 0):
            return None
        record, broker, topic = classify(key)
        deleted = kind == "delete"
        try:
            self._apply(key, record, broker, topic, deleted, value, revision)
        except ModelError as exc:
            # A bad value: forget what the key held, so nothing acts on stale content.
            self._apply(key, record, broker, topic, True, None, revision)
            self._revisions[key] = revision
            raise BadRecord(record, key, str(exc)) from None
        self._revisions[key] = revision
        return Change(record, key, deleted, broker, topic)

    def _apply(
        self,
        key: str,
        record: RecordKind,
        broker: BrokerId | None,
        topic: str | None,
        deleted: bool,
        value: Any,
        revision: int,
    ) -> None:
        if record is RecordKind.REGISTRATION and broker is not None:
            if deleted:
                self.registrations.pop(broker, None)
            else:
                self.registrations[broker] = Registration.from_dict(value)
        elif record is RecordKind.STATE and broker is not None:
            if deleted:
                self.states.pop(broker, None)
                self.state_revisions.pop(broker, None)
            else:
                self.states[broker] = BrokerState.from_dict(value)
                self.state_revisions[broker] = revision
        elif record is RecordKind.ASSIGNMENT and broker is not None and topic is not None:
            if deleted:
                self._unassign(broker, topic)
            else:
                parse_assignment_value(value)  # validate
                self.owners.setdefault(topic, {})[broker] = revision
                self.by_broker.setdefault(broker, {})[topic] = revision
                self._sorted.pop(broker, None)
        elif record is RecordKind.MARKER and topic is not None:
            if deleted:
                self.markers.pop(topic, None)
            else:
                self.markers[topic] = Pending(UnassignedMarker.from_dict(value), revision)
        elif record is RecordKind.OWNER and topic is not None:
            if deleted:
                self.owner_records.pop(topic, None)
            else:
                self.owner_records[topic] = (parse_owner_value(value), revision)
        elif record is RecordKind.LOAD and broker is not None:
            # Kept after a delete: the last report of a dead broker guides its failover.
            if not deleted:
                report = LoadReport.from_dict(value)
                if report.broker_id != broker:
                    raise ModelError(
                        f"load_report.broker_id: {report.broker_id!r} does not match the "
                        f"key's broker {broker!r}"
                    )
                self.reports[broker] = report
        elif record is RecordKind.LEADER:
            self.leader = None if deleted else _object(value, "leader")
        elif record is RecordKind.LOAD_BALANCE:
            self.load_balance = None if deleted else _object(value, "load_balance")
        elif record is RecordKind.HISTORY:
            if deleted:
                self.moves.pop(key, None)
            else:
                self.moves[key] = Move.from_dict(value)
        elif record is RecordKind.TOPIC and topic is not None:
            self._created_copy = None
            if deleted:
                self.topics.pop(topic, None)
                self._created.pop(topic, None)
            else:
                meta = self.topics[topic] = TopicMeta.from_dict(value)
                if meta.created_at > 0:
                    self._created[topic] = meta.created_at
                else:
                    self._created.pop(topic, None)
        elif record in (RecordKind.BUNDLES, RecordKind.OTHER):
            self._apply_pulsar(key, deleted, value)

    def _apply_pulsar(self, key: str, deleted: bool, value: Any) -> None:
        """Failure domains, anti-affinity groups and bundle layouts (Pulsar); other keys
        are ignored."""
        try:
            if key.startswith(keys.BUNDLES_PREFIX):
                ns = keys.parse_bundles_key(key)
                if deleted:
                    self.bundles.pop(ns, None)
                else:
                    self.bundles[ns] = decode_bundles(ns, value)
            elif key.startswith(keys.FAILURE_DOMAINS_PREFIX):
                name = keys.parse_failure_domain_key(key)
                if deleted:
                    self.failure_domains.pop(name, None)
                else:
                    self.failure_domains[name] = parse_failure_domain_value(value)
            elif key.startswith(keys.ANTI_AFFINITY_PREFIX):
                ns = keys.parse_anti_affinity_key(key)
                group = None if deleted else parse_anti_affinity_value(value)
                if group is None:
                    self.anti_affinity_groups.pop(ns, None)
                else:
                    self.anti_affinity_groups[ns] = group
        except ValueError as exc:
            if isinstance(exc, ModelError):
                raise
            raise ModelError(str(exc)) from None

    def broker_domains(self) -> dict[BrokerId, str]:
        """Each broker's failure domain: from admin, else its registration's `domain`."""
        return broker_domains(
            {b: r.domain for b, r in self.registrations.items()}, self.failure_domains
        )

    def _unassign(self, broker: BrokerId, topic: str) -> None:
        owners = self.owners.get(topic)
        if owners is not None:
            owners.pop(broker, None)
            if not owners:
                del self.owners[topic]
        topics = self.by_broker.get(broker)
        self._sorted.pop(broker, None)
        if topics is not None:
            topics.pop(topic, None)
            if not topics:
                del self.by_broker[broker]

    def forget_report(self, broker: BrokerId) -> None:
        """Drop a dead broker's last report once its topics have been failed over."""
        if broker not in self.registrations:
            self.reports.pop(broker, None)

    # -- queries -------------------------------------------------------------------------

    def state(self, broker: BrokerId) -> BrokerState:
        return self.states.get(broker, ACTIVE)

    def owner(self, topic: str) -> BrokerId | None:
        """The topic's owner (the most recent one if the invariant were ever broken)."""
        owners = self.owners.get(topic)
        if not owners:
            return None
        return max(owners.items(), key=lambda e: e[1])[0]

    def topics_of(self, broker: BrokerId) -> dict[str, int]:
        """The broker's topics with their assignment revisions."""
        return self.by_broker.get(broker, {})

    def brokers(self) -> tuple[BrokerId, ...]:
        """Registered brokers, sorted."""
        return tuple(sorted(self.registrations))

    def known_brokers(self) -> set[BrokerId]:
        """Registered brokers and brokers that still hold assignments."""
        return set(self.registrations) | set(self.by_broker)

    def snapshot(
        self,
        *,
        pending: bool = True,
        exclude: Collection[str] = (),
    ) -> ClusterSnapshot:
        """The registered brokers as the decision core sees them.

        With `pending`, a topic in flight towards a hinted broker (a move or failover not yet
        assigned) is counted on that broker, so decisions do not pile onto it meanwhile;
        topics in `exclude` are not (they are the ones being placed now).
        """
        brokers = self.brokers()
        registered = set(brokers)
        incoming: dict[BrokerId, list[str]] = {}
        if pending:
            for topic, p in self.markers.items():
                hint = p.marker.to_broker
                if hint in registered and topic not in exclude and topic not in self.owners:
                    incoming.setdefault(hint, []).append(topic)
        assignments: dict[BrokerId, tuple[str, ...]] = {}
        for broker in brokers:
            owned = self._sorted.get(broker)
            if owned is None:
                owned = self._sorted[broker] = tuple(sorted(self.by_broker.get(broker, {})))
            extra = incoming.get(broker)
            assignments[broker] = tuple(sorted((*owned, *extra))) if extra else owned
        if self._created_copy is None:
            self._created_copy = dict(self._created)
        return ClusterSnapshot(
            brokers=brokers,
            reports={b: r for b, r in self.reports.items() if b in registered},
            states={b: s for b, s in self.states.items() if b in registered},
            assignments=assignments,
            topic_created=self._created_copy,
            broker_domains={b: d for b, d in self.broker_domains().items() if b in registered},
            anti_affinity_groups=dict(self.anti_affinity_groups),
        )


def decode_bundles(namespace: str, value: Any) -> NamespaceBundles:
    """The bundle layout stored at ``/cluster/bundles/{namespace}``; raises `ModelError`."""
    try:
        layout = NamespaceBundles.from_dict(_object(value, "bundles"))
    except BundleError as exc:
        raise ModelError(str(exc)) from None
    if layout.namespace != namespace:
        raise ModelError(
            f"bundles.namespace: {layout.namespace!r} does not match the key's "
            f"namespace {namespace!r}"
        )
    return layout


def _object(value: Any, ctx: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ModelError(f"{ctx}: expected a JSON object, got {type(value).__name__}")
    return value
