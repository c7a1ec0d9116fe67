"""Helpers for the control-plane tests: configurations, bounded waits, store replay."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ballast.clock import FakeClock
from ballast.cluster import AdminClient, LocalCluster
from ballast.config import BallastConfig, parse_config
from ballast.leader.view import ClusterView, classify
from ballast.metadata import MetadataStore, keys
from ballast.metadata.records import RecordKind
from ballast.model import BrokerMode


def fast_config(
    *,
    strategy: str = "fair",
    rebalancing: Mapping[str, Any] | None = None,
    ttl: float = 2.0,
    leader_ttl: float | None = None,
    report_interval: float = 0.2,
) -> BallastConfig:
    """Short TTLs and intervals so a test sees a failover in seconds."""
    return parse_config(
        {
            "load_manager": {
                "load_report_interval_seconds": report_interval,
                "assignment_strategy": strategy,
                "rebalancing": dict(rebalancing or {"enabled": False}),
            },
            "broker": {"registration_ttl_seconds": ttl, "leader_ttl_seconds": leader_ttl or ttl},
            "history": {"enabled": False},
            "metrics": {"enabled": False},
        }
    )


FAST_REBALANCING = {
    "enabled": True,
    "aggressiveness": "aggressive",
    "check_interval_seconds": 0.05,
    "cooldown_seconds": 0,
    "min_topic_age_seconds": 0,
    "max_moves_per_hour": 10_000,
}


async def wait_until(
    check: Callable[[], Awaitable[bool]],
    timeout: float,
    what: str,
    interval: float = 0.02,
    explain: Callable[[], Awaitable[str]] | None = None,
) -> float:
    """Poll `check` until true; return the seconds it took. Fails with `what` on timeout
    (and `explain()`'s account of the state, when given)."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        if await check():
            return time.monotonic() - start
        if time.monotonic() > deadline:
            detail = f": {await explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}{detail}")
        await asyncio.sleep(interval)


async def wait_virtual(
    clock: FakeClock,
    check: Callable[[], Awaitable[bool]],
    timeout: float,
    what: str,
    step: float = 0.05,
) -> float:
    """Advance `clock` in `step`s until `check` is true; return the virtual seconds it took.
    Fails with `what` once `timeout` virtual seconds have passed: where time is the point
    (a TTL, a timeout), the bound then holds however loaded the machine is."""
    start = clock.now()
    while not await check():
        if clock.now() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s (virtual) waiting for: {what}")
        await clock.advance(step)
    return clock.now() - start


async def settled(admin: AdminClient, topics: int) -> ClusterView | None:
    """The view if exactly `topics` topics are assigned and no marker is pending."""
    view = await admin.view()
    if len(view.owners) == topics and not view.markers:
        return view
    return None


def leading(cluster: LocalCluster) -> Callable[[], Awaitable[bool]]:
    """A check (for `wait_virtual`): some broker leads, its session bootstrapped."""

    async def check() -> bool:
        leader = cluster.leader()
        session = leader.manager.session if leader is not None else None
        return session is not None and session.ready.is_set()

    return check


def all_settled(admin: AdminClient, topics: int) -> Callable[[], Awaitable[bool]]:
    """A check (for `wait_virtual`): `topics` topics assigned, no marker pending."""

    async def check() -> bool:
        return await settled(admin, topics) is not None

    return check


async def wait_settled(admin: AdminClient, topics: int, timeout: float) -> ClusterView:
    """Wait until every topic is assigned and no marker is pending."""
    result: list[ClusterView] = []

    async def check() -> bool:
        view = await settled(admin, topics)
        if view is not None:
            result.append(view)
        return view is not None

    async def explain() -> str:
        view = await admin.view()
        markers = sorted(view.markers.items())[:5]
        return f"{len(view.owners)} assigned, {len(view.markers)} markers, e.g. {markers}"

    # A full listing per poll: not too often, or the poll itself slows a big burst down.
    interval = 0.1 if topics > 100 else 0.02
    await wait_until(
        check, timeout, f"{topics} topics assigned, no marker pending", interval, explain
    )
    return result[-1]


async def host_mismatch(cluster: LocalCluster, admin: AdminClient) -> str:
    """How the brokers' hosts differ from their assignments ("" when they match)."""
    view = await admin.view()
    out = []
    for b in sorted(cluster.brokers):
        served, assigned = set(cluster.host(b).topics), set(view.topics_of(b))
        if served != assigned:
            out.append(
                f"{b}: serves {len(served)}, assigned {len(assigned)}; "
                f"extra {sorted(served - assigned)[:3]}, missing {sorted(assigned - served)[:3]}"
            )
    return "; ".join(out)


async def hosts_match(cluster: LocalCluster, admin: AdminClient) -> bool:
    """Every running broker's host serves exactly the topics assigned to it."""
    return await host_mismatch(cluster, admin) == ""


def counts(view: ClusterView) -> dict[str, int]:
    return {b: len(view.topics_of(b)) for b in view.brokers()}


def is_drained(view: ClusterView, broker: str) -> bool:
    return view.state(broker).mode is BrokerMode.DRAINED


@dataclass
class Replay:
    """The store's history from a revision, checked for the placement invariants."""

    violations: list[str] = field(default_factory=list)
    markers_put: int = 0
    markers_consumed: int = 0
    markers_dropped: list[str] = field(default_factory=list)
    pending: set[str] = field(default_factory=set)
    owners: dict[str, set[str]] = field(default_factory=dict)
    assignments_put: int = 0


async def replay(store: MetadataStore, start_revision: int, end_revision: int) -> Replay:
    """Watch ``/cluster/`` from `start_revision` to `end_revision` and check, at every
    revision: no topic has two owners; every marker delete is a consumption (an
    assignment of that topic written at the same revision) unless the leader dropped it.
    """
    result = Replay()
    by_revision: dict[int, list[tuple[str, str, Any]]] = {}
    watch = store.watch_prefix(keys.CLUSTER_PREFIX, start_revision)
    try:
        async with asyncio.timeout(30):
            async for event in watch:
                if event.kind in ("put", "delete"):
                    by_revision.setdefault(event.revision, []).append(
                        (event.kind, event.key, event.value)
                    )
                if event.revision >= end_revision:
                    break
    finally:
        await watch.aclose()  # type: ignore[attr-defined]
    for revision in sorted(by_revision):
        events = by_revision[revision]
        assigned_here: set[str] = set()
        for kind, key, _ in events:
            record, broker, topic = classify(key)
            if record is RecordKind.ASSIGNMENT and topic is not None and broker is not None:
                owners = result.owners.setdefault(topic, set())
                if kind == "put":
                    owners.add(broker)
                    assigned_here.add(topic)
                    result.assignments_put += 1
                else:
                    owners.discard(broker)
        for kind, key, _ in events:
            record, _, topic = classify(key)
            if record is not RecordKind.MARKER or topic is None:
                continue
            if kind == "put":
                if topic not in result.pending:  # a rewrite (e.g. ready: true) is not new
                    result.markers_put += 1
                result.pending.add(topic)
            else:
                result.pending.discard(topic)
                if topic in assigned_here:
                    result.markers_consumed += 1
                else:
                    result.markers_dropped.append(f"{topic}@{revision}")
        for topic, owners in result.owners.items():
            if len(owners) > 1:
                result.violations.append(f"rev {revision}: {topic} owned by {sorted(owners)}")
    return result


async def store_revision(store: MetadataStore) -> int:
    """The store's current revision."""
    return (await store.get_prefix(keys.LEADER)).revision
