"""Operator commands for Pulsar's load-balancing data: namespace bundles, splits and
unloads, anti-affinity groups and failure domains (the shell around `balance.bundles` and
`balance.domains`). Every bad input is an `AdminError` naming the value.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ballast.balance.pulsar.bundles import (
    BundleError,
    BundleRange,
    NamespaceBundles,
    SplitResult,
    TopicTraffic,
    parse_algorithm,
    split_positions,
    topic_hash,
)
from ballast.balance.pulsar.domains import DomainError, FailureDomains
from ballast.cluster.admin import AdminClient, AdminError
from ballast.config import SplitAlgorithm
from ballast.leader.view import decode_bundles
from ballast.metadata import Compare, Delete, Put, keys
from ballast.metadata.records import (
    RecordKind,
    anti_affinity_value,
    classify,
    failure_domain_value,
)
from ballast.model import BrokerId, ModelError, TopicName, topic_namespace, validate_broker_id
from ballast.storage.retention import (
    RetentionError,
    RetentionPolicy,
    parse_retention_size,
    parse_retention_time,
)


@dataclass(frozen=True)
class BundleRow:
    """One bundle with its topics' owners and traffic."""

    name: str
    topics: int
    owners: tuple[BrokerId, ...]
    msg_rate: float
    throughput: float  # bytes/s

    def to_dict(self) -> dict[str, Any]:
        return {
            "bundle": self.name,
            "topics": self.topics,
            "owners": list(self.owners),
            "msg_rate": self.msg_rate,
            "throughput_bytes": self.throughput,
        }


@dataclass(frozen=True)
class BundlesReport:
    namespace: str
    layout: NamespaceBundles
    stored: bool  # False: the namespace was never created with bundles; defaults shown
    rows: tuple[BundleRow, ...]
    anti_affinity_group: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "stored": self.stored,
            "anti_affinity_group": self.anti_affinity_group,
            "boundaries": self.layout.to_dict()["boundaries"],
            "bundles": [r.to_dict() for r in self.rows],
        }


@dataclass(frozen=True)
class SplitOutcome:
    result: SplitResult
    layout: NamespaceBundles
    unloaded: tuple[tuple[str, BrokerId], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "bundle": self.result.bundle,
            "algorithm": self.result.algorithm.value,
            "positions": [f"0x{p:08x}" for p in self.result.positions],
            "reason": self.result.reason,
            "bundles": list(self.layout.names()),
            "unloaded": [{"topic": t, "from_broker": b} for t, b in self.unloaded],
        }


@dataclass(frozen=True)
class DomainInfo:
    name: str
    brokers: tuple[BrokerId, ...]
    source: str  # "admin" or "broker.domain"
    registered: tuple[BrokerId, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"domain": self.name, "brokers": list(self.brokers), "source": self.source}


def _namespace(ns: str) -> str:
    try:
        keys.namespace_bundles(ns)
    except ValueError as exc:
        raise AdminError(str(exc)) from None
    return ns


class NamespaceAdmin:
    """Bundles, anti-affinity and failure domains over the admin client's store."""

    def __init__(self, admin: AdminClient) -> None:
        self.admin = admin
        self.store = admin.store
        self.pulsar = admin.config.load_manager.pulsar

    # -- reading -------------------------------------------------------------------------

    async def layout(self, ns: str) -> tuple[NamespaceBundles, int]:
        """The stored layout and its mod revision, or the default one with revision 0."""
        kv = await self.store.get(keys.namespace_bundles(_namespace(ns)))
        if kv is None:
            return NamespaceBundles.create(ns, self.pulsar.default_number_of_namespace_bundles), 0
        try:
            return decode_bundles(ns, kv.value), kv.mod_revision
        except ModelError as exc:
            raise AdminError(f"{kv.key}: unreadable bundles record ({exc})") from None

    async def bundles(self, ns: str) -> BundlesReport:
        layout, revision = await self.layout(ns)
        view = await self.admin.view()
        groups: dict[BundleRange, list[str]] = {r: [] for r in layout.ranges}
        for t in sorted({*view.owners, *view.topics}):
            if topic_namespace(t) == ns:
                groups[layout.bundle_for_topic(t)].append(t)
        loads = {t.topic: t for r in view.reports.values() for t in r.topics}
        rows = []
        for r, ts in groups.items():
            owners = sorted({b for t in ts for b in view.owners.get(t, {})})
            rows.append(
                BundleRow(
                    layout.full_name(r),
                    len(ts),
                    tuple(owners),
                    sum(loads[t].msg_rate for t in ts if t in loads),
                    sum(loads[t].byte_rate for t in ts if t in loads),
                )
            )
        return BundlesReport(
            ns, layout, revision > 0, tuple(rows), view.anti_affinity_groups.get(ns)
        )

    # -- writing -------------------------------------------------------------------------

    async def create(self, ns: str, bundles: int | None = None) -> NamespaceBundles:
        """Create a namespace with its bundles (`bundles`, else
        `default_number_of_namespace_bundles`), in one transaction."""
        n = bundles if bundles is not None else self.pulsar.default_number_of_namespace_bundles
        try:
            layout = NamespaceBundles.create(_namespace(ns), n)
        except BundleError as exc:
            raise AdminError(f"--bundles {n}: {exc}") from None
        ns_key, bundles_key = keys.namespace(ns), keys.namespace_bundles(ns)
        result = await self.store.txn(
            [Compare.absent(ns_key), Compare.absent(bundles_key)],
            [
                Put(ns_key, {"created_at": self.admin.clock.now()}),
                Put(bundles_key, layout.to_dict()),
            ],
        )
        if not result.succeeded:
            raise AdminError(
                f"namespace {ns!r} already exists (see `namespaces bundles {ns}`); "
                "split its bundles instead"
            )
        return layout

    async def list_namespaces(self) -> list[dict[str, Any]]:
        """Every namespace with its creation time and topic count."""
        listing = await self.store.get_prefix(keys.NAMESPACES_PREFIX)
        topics = await self.store.get_prefix(keys.TOPICS_PREFIX)
        counts: dict[str, int] = {}
        for kv in topics.items:
            try:
                kind, _, topic = classify(kv.key)
            except ValueError:
                continue  # a foreign key is skipped, never fatal
            if kind is RecordKind.TOPIC and topic is not None:
                counts[topic_namespace(topic)] = counts.get(topic_namespace(topic), 0) + 1
        out: list[dict[str, Any]] = []
        for kv in listing.items:
            try:
                name = keys.parse_namespace_key(kv.key)
            except ValueError:
                continue  # a foreign key is skipped, never fatal
            created = kv.value.get("created_at") if isinstance(kv.value, dict) else None
            out.append({"namespace": name, "created_at": created, "topics": counts.get(name, 0)})
        return out

    async def delete_namespace(self, ns: str) -> str:
        """Delete an empty namespace with its bundles and anti-affinity group."""
        key = keys.namespace(_namespace(ns))
        if await self.store.get(key) is None:
            raise AdminError(f"namespace {ns!r} does not exist")
        topics = await self.store.get_prefix(keys.namespace_topics_prefix(ns))
        if topics.items:
            raise AdminError(f"namespace {ns!r} still has topics; delete or move them first")
        result = await self.store.txn(
            [Compare.present(key)],
            [Delete(key), Delete(keys.namespace_bundles(ns)), Delete(keys.anti_affinity_group(ns))],
        )
        if not result.succeeded:
            raise AdminError(f"namespace {ns!r} was deleted meanwhile")
        return ns

    async def split(
        self,
        ns: str,
        bundle: str,
        algorithm: str | None = None,
        positions: Sequence[int] = (),
        unload: bool | None = None,
    ) -> SplitOutcome:
        """Split one bundle (compare-and-swap on the stored layout)."""
        try:
            algo = (
                parse_algorithm(algorithm)
                if algorithm is not None
                else self.pulsar.default_namespace_bundle_split_algorithm
            )
            if positions and algo is not SplitAlgorithm.SPECIFIED_POSITIONS_DIVIDE:
                raise BundleError(
                    f"--positions needs --algorithm specified_positions_divide (got {algo.value})"
                )
            layout, revision = await self.layout(ns)
            target = layout.find(bundle)
            view = await self.admin.view()
            loads = {t.topic: t for r in view.reports.values() for t in r.topics}
            topics = [
                TopicTraffic(
                    t,
                    loads[t].msg_rate if t in loads else 0.0,
                    loads[t].byte_rate if t in loads else 0.0,
                )
                for t in sorted({*view.owners, *view.topics})
                if topic_namespace(t) == ns and target.contains(_hash(t))
            ]
            result = split_positions(layout, target, algo, topics, positions, self.pulsar)
            if not result.positions:
                raise BundleError(f"nothing to split: {result.reason}")
            if len(layout) + len(result.positions) > self.pulsar.namespace_maximum_bundles:
                raise BundleError(
                    f"namespace {ns!r} would have {len(layout) + len(result.positions)} bundles, "
                    f"above namespace_maximum_bundles {self.pulsar.namespace_maximum_bundles}"
                )
            after = layout.split(target, result.positions)
        except BundleError as exc:
            raise AdminError(str(exc)) from None
        key = keys.namespace_bundles(ns)
        done = await self.store.txn(
            [Compare.mod_revision_equals(key, revision)], [Put(key, after.to_dict())]
        )
        if not done.succeeded:
            raise AdminError(f"the bundles of {ns!r} changed meanwhile; look again and retry")
        unloaded: list[tuple[str, BrokerId]] = []
        if unload if unload is not None else self.pulsar.auto_unload_split_bundles_enabled:
            for t in topics:
                if view.owner(t.topic) is not None:
                    unloaded.append((t.topic, await self.admin.unload_topic(t.topic)))
        return SplitOutcome(result, after, tuple(unloaded))

    async def unload_bundle(self, ns: str, bundle: str) -> list[tuple[str, BrokerId]]:
        """Unload every assigned topic of a bundle (each one a graceful move)."""
        try:
            layout, _ = await self.layout(ns)
            target = layout.find(bundle)
        except BundleError as exc:
            raise AdminError(str(exc)) from None
        view = await self.admin.view()
        topics = sorted(
            t for t in view.owners if topic_namespace(t) == ns and target.contains(_hash(t))
        )
        if not topics:
            raise AdminError(f"bundle {layout.full_name(target)} has no assigned topic to unload")
        return [(t, await self.admin.unload_topic(t)) for t in topics]

    async def set_anti_affinity_group(self, ns: str, group: str) -> None:
        if not group or not isinstance(group, str) or "/" in group:
            raise AdminError(f"invalid anti-affinity group {group!r}: give a non-empty name")
        await self.store.put(keys.anti_affinity_group(_namespace(ns)), anti_affinity_value(group))

    async def set_retention(self, ns: str, time: str | None, size: str | None) -> RetentionPolicy:
        """Set (or, with neither limit, clear) a namespace's storage retention; the owner
        of each reliable topic applies it (`storage.retention`)."""
        try:
            policy = RetentionPolicy(
                parse_retention_time(time) if time is not None else None,
                parse_retention_size(size) if size is not None else None,
            )
        except RetentionError as exc:
            raise AdminError(str(exc)) from None
        key = keys.retention_policy(_namespace(ns))
        if policy.keeps_everything:
            await self.store.delete(key)
        else:
            await self.store.put(key, policy.to_dict())
        return policy

    async def create_failure_domain(self, name: str, brokers: Iterable[str]) -> DomainInfo:
        try:
            key = keys.failure_domain(name)
            members = sorted({validate_broker_id(b.strip(), "--broker-list") for b in brokers})
        except (ValueError, ModelError) as exc:
            raise AdminError(str(exc)) from None
        if not members:
            raise AdminError(f"failure domain {name!r}: --broker-list is empty")
        view = await self.admin.view()
        existing = dict(view.failure_domains)
        existing.pop(name, None)
        try:
            FailureDomains.merge(
                {b: r.domain for b, r in view.registrations.items()},
                {**existing, name: tuple(members)},
            )
        except DomainError as exc:
            raise AdminError(str(exc)) from None
        await self.store.put(key, failure_domain_value(members))
        return DomainInfo(name, tuple(members), "admin")

    async def list_failure_domains(self) -> list[DomainInfo]:
        # The view's failure domains: a record that does not decode is left out, as the
        # leader leaves it out.
        view = await self.admin.view()
        admin = view.failure_domains
        out = [DomainInfo(n, bs, "admin") for n, bs in sorted(admin.items())]
        from_brokers: dict[str, list[BrokerId]] = {}
        for b, r in sorted(view.registrations.items()):
            if r.domain is not None and not any(b in bs for bs in admin.values()):
                from_brokers.setdefault(r.domain, []).append(b)
        out += [DomainInfo(n, tuple(bs), "broker.domain") for n, bs in sorted(from_brokers.items())]
        return out

    async def delete_failure_domain(self, name: str) -> None:
        try:
            key = keys.failure_domain(name)
        except ValueError as exc:
            raise AdminError(str(exc)) from None
        if not await self.store.delete(key):
            known = ", ".join(sorted((await self.admin.view()).failure_domains)) or "none"
            raise AdminError(f"failure domain {name!r} does not exist (domains: {known})")


def _hash(topic: str) -> int:
    return topic_hash(str(TopicName.parse(topic)))
