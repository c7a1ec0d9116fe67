"""The control plane end to end, in one process, on the wall clock.

Real brokers, election and load manager over a real store; hosts are synthetic and record
what the brokers asked of them. The leader's policy itself is tested without a clock or a
store by the scripted scenarios of `tests/leader/testdata` (hints, unload, drain, moves,
failover, failed writes, seal timeout, leader change, resync) and by the simulator's
replay test; what stays here is what only a running cluster shows: the brokers, the
election and the store working together, each test on one store (the invariant and
failover tests on a real etcd).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from ballast.clock import FakeClock, SystemClock
from ballast.cluster import AdminClient, LocalCluster
from ballast.cluster.admin import AdminError
from ballast.metadata import MetadataStore, keys
from ballast.metadata.memory import MemoryStore
from ballast.metadata.store import Compare, Delete, Put, TxnResult
from ballast.model import MarkerReason, UnassignedMarker
from tests.cluster.helpers import (
    FAST_REBALANCING,
    all_settled,
    counts,
    fast_config,
    host_mismatch,
    hosts_match,
    is_drained,
    leading,
    replay,
    settled,
    wait_settled,
    wait_until,
    wait_virtual,
)

pytestmark = pytest.mark.timeout(90)


async def start(cluster: LocalCluster, *brokers: str) -> None:
    for broker in brokers:
        await cluster.start_broker(broker)
    await cluster.wait_leader()


@pytest.mark.parametrize("store", ["etcd"], indirect=True)
async def test_topic_burst_spreads_evenly_with_fair(store: MetadataStore) -> None:
    clock = SystemClock()
    config = fast_config()
    admin = AdminClient(store, clock, config)
    async with LocalCluster(store, clock, config) as cluster:
        await start(cluster, "b1", "b2", "b3")
        created = await admin.create_topics(f"/burst/t{i:04d}" for i in range(400))
        assert created == 400
        view = await wait_settled(admin, 400, timeout=30)
        placed = counts(view)
        assert sum(placed.values()) == 400
        assert max(placed.values()) <= 1.1 * min(placed.values()), placed
        await wait_until(
            lambda: hosts_match(cluster, admin),
            15,
            "hosts serve their topics",
            explain=lambda: host_mismatch(cluster, admin),
        )


@pytest.mark.parametrize("store", ["memory"], indirect=True)
async def test_drain_moves_everything_then_marks_drained(store: MetadataStore) -> None:
    clock = SystemClock()
    config = fast_config()
    admin = AdminClient(store, clock, config)
    async with LocalCluster(store, clock, config) as cluster:
        await start(cluster, "b1", "b2", "b3")
        await admin.create_topics(f"/d/t{i}" for i in range(30))
        await wait_settled(admin, 30, timeout=20)
        await admin.drain("b2")

        async def drained() -> bool:
            view = await admin.view()
            return is_drained(view, "b2") and not view.markers

        await wait_until(drained, 20, "b2 drained")
        view = await wait_settled(admin, 30, timeout=10)
        assert counts(view)["b2"] == 0 and not cluster.host("b2").topics
        # New topics avoid a drained broker; activating it makes it eligible again.
        await admin.create_topics(f"/d/new{i}" for i in range(6))
        view = await wait_settled(admin, 36, timeout=20)
        assert counts(view)["b2"] == 0
        await admin.activate("b2")
        await admin.create_topic("/d/after-activate")
        view = await wait_settled(admin, 37, timeout=20)
        assert view.owner("/d/after-activate") == "b2"


@pytest.mark.parametrize("store", ["etcd"], indirect=True)
async def test_killed_broker_topics_are_owned_elsewhere_within_ttl(store: MetadataStore) -> None:
    clock = SystemClock()
    ttl = 2.0
    config = fast_config(ttl=ttl)
    admin = AdminClient(store, clock, config)
    async with LocalCluster(store, clock, config) as cluster:
        await start(cluster, "b1", "b2", "b3")
        leader = cluster.leader()
        assert leader is not None
        victim = next(b for b in ("b1", "b2", "b3") if b != leader.broker_id)
        await admin.create_topics(f"/f/t{i}" for i in range(60))
        view = await wait_settled(admin, 60, timeout=20)
        orphans = set(view.topics_of(victim))
        assert orphans
        await cluster.kill_broker(victim)

        async def reassigned() -> bool:
            view = await admin.view()
            return all(view.owner(t) not in (None, victim) for t in orphans)

        took = await wait_until(reassigned, ttl + 2, f"{victim}'s topics owned elsewhere")
        assert took <= ttl + 2
        view = await wait_settled(admin, 60, timeout=5)
        assert victim not in view.by_broker
        await wait_until(lambda: hosts_match(cluster, admin), 5, "hosts serve their topics")


async def test_killed_leader_is_replaced_and_nothing_is_lost() -> None:
    # On a fake clock: the TTL is the point, and virtual time bounds it exactly.
    clock = FakeClock()
    ttl = 2.0
    config = fast_config(ttl=ttl)
    async with MemoryStore(clock) as store:
        admin = AdminClient(store, clock, config)
        async with LocalCluster(store, clock, config) as cluster:
            for broker in ("b1", "b2", "b3"):
                await cluster.start_broker(broker)
            await wait_virtual(clock, leading(cluster), 5, "a leader")
            await admin.create_topics(f"/l/t{i}" for i in range(30))
            await wait_virtual(clock, all_settled(admin, 30), 20, "30 topics assigned")
            old = cluster.leader()
            assert old is not None
            await cluster.kill_broker(old.broker_id)

            async def new_leader() -> bool:
                current = await admin.leader()
                return current is not None and current["broker_id"] != old.broker_id

            took = await wait_virtual(clock, new_leader, ttl + 2, "a new leader")
            assert took <= ttl + 2
            # Topics created while there was no leader, and the dead leader's own topics,
            # all end up assigned.
            await admin.create_topics(f"/l/late{i}" for i in range(10))

            async def on_live_brokers() -> bool:
                # (A late topic may land on the dead leader while its registration lives
                # on; its failover follows the expiry.)
                view = await settled(admin, 40)
                return (
                    view is not None
                    and old.broker_id not in view.registrations
                    and old.broker_id not in view.by_broker
                )

            await wait_virtual(clock, on_live_brokers, ttl + 5, "every topic on a live broker")


@pytest.mark.parametrize("store", ["etcd"], indirect=True)
async def test_every_marker_is_consumed_and_no_topic_has_two_owners(
    store: MetadataStore,
) -> None:
    """Replay the store's whole history of a busy run and check the invariants."""
    clock = SystemClock()
    config = fast_config(rebalancing=FAST_REBALANCING, ttl=1.5)
    admin = AdminClient(store, clock, config)
    start_revision = (await store.get_prefix(keys.LEADER)).revision + 1
    async with LocalCluster(store, clock, config) as cluster:
        await start(cluster, "b1", "b2", "b3")
        await admin.create_topics(f"/i/t{i:03d}" for i in range(45))
        await wait_settled(admin, 45, timeout=20)
        await cluster.start_broker("b4")  # rebalancing moves topics to b4 ...

        async def some_moves() -> bool:
            return len(await admin.history()) >= 3

        await wait_until(some_moves, 10, "rebalancing to start")
        for topic in ("/i/t001", "/i/t002", "/i/t003"):  # ... while the admin unloads
            view = await admin.view()
            if view.owner(topic) is not None:
                await admin.unload_topic(topic)
        await cluster.kill_broker("b1")  # ... a broker dies
        await admin.drain("b2")  # ... and another drains
        await admin.create_topics(f"/i/late{i}" for i in range(5))

        async def quiet() -> bool:
            view = await admin.view()
            leader = cluster.leader()
            session = leader.manager.session if leader is not None else None
            return (
                is_drained(view, "b2")
                and "b1" not in view.by_broker
                and len(view.owners) == 50
                and not view.markers
                and session is not None
                and session.last_decision is not None
                and session.last_decision.rule in ("balanced", "too-few-brokers")
                and not session.episode
            )

        await wait_until(quiet, 40, "the cluster to settle")
        end = await store.put(keys.CLUSTER_PREFIX + "zz-test-end", {})
        history = await replay(store, start_revision, end)
        assert history.violations == []
        assert history.markers_dropped == []
        assert history.pending == set()
        assert history.markers_put == history.markers_consumed
        reasons = Counter(m.reason for m in await admin.history())
        assert reasons["LoadImbalance"] > 0
        await store.delete(keys.CLUSTER_PREFIX + "zz-test-end")


def consumed_marker(cluster: LocalCluster, broker: str, topic: str) -> UnassignedMarker:
    """The marker `broker`'s host was given `topic` with (it serves the topic)."""
    marker = cluster.host(broker).topics[topic]
    assert marker is not None
    return marker


@pytest.mark.parametrize("store", ["memory"], indirect=True)
async def test_marker_reasons_reach_the_new_owner(store: MetadataStore) -> None:
    """The new owner's host learns why it got the topic (the consumed marker)."""
    clock = SystemClock()
    config = fast_config()
    admin = AdminClient(store, clock, config)
    async with LocalCluster(store, clock, config) as cluster:
        await start(cluster, "b1", "b2")
        await admin.create_topic("/m/t")
        view = await wait_settled(admin, 1, timeout=10)
        owner = view.owner("/m/t")
        assert owner is not None
        marker = cluster.host(owner).topics["/m/t"]
        assert marker is not None and marker.reason is MarkerReason.NEW
        await admin.unload_topic("/m/t")
        view = await wait_settled(admin, 1, timeout=10)
        target = view.owner("/m/t")
        assert target not in (None, owner)
        assert target is not None
        await wait_until(lambda: hosts_match(cluster, admin), 5, "hosts serve their topics")
        marker = consumed_marker(cluster, target, "/m/t")
        assert (marker.reason, marker.from_broker, marker.ready) == (
            MarkerReason.UNLOAD,
            owner,
            True,
        )


@pytest.mark.parametrize("store", ["memory"], indirect=True)
async def test_unload_to_a_named_broker_and_what_it_refuses(store: MetadataStore) -> None:
    """``unload --to``: the topic lands on the named broker (the marker it consumed names
    it); a broker that is not registered, not active, or the owner itself is refused with
    a message naming it, and nothing is written."""
    clock = SystemClock()
    config = fast_config()
    admin = AdminClient(store, clock, config)
    async with LocalCluster(store, clock, config) as cluster:
        await start(cluster, "b1", "b2", "b3")
        await admin.create_topic("/m/t")
        view = await wait_settled(admin, 1, timeout=10)
        owner = view.owner("/m/t")
        assert owner is not None
        target = next(b for b in ("b1", "b2", "b3") if b != owner)
        other = next(b for b in ("b1", "b2", "b3") if b not in (owner, target))
        await admin.drain(other)
        for to, said in [
            ("b9", "broker 'b9' is not registered"),
            (owner, f"owned by {owner} already"),
            (other, f"broker {other} is draining"),
        ]:
            with pytest.raises(AdminError, match=said):
                await admin.unload_topic("/m/t", to)
        assert await store.get(keys.unassigned("/m/t")) is None
        assert await admin.unload_topic("/m/t", target) == owner

        async def served_there() -> bool:
            return "/m/t" in cluster.host(target).topics

        await wait_until(served_there, 10, f"/m/t served by {target}")
        marker = consumed_marker(cluster, target, "/m/t")
        assert (marker.reason, marker.from_broker, marker.to_broker) == (
            MarkerReason.UNLOAD,
            owner,
            target,
        )


class _RankingsHeld(MemoryStore):
    """A store whose rankings writes wait while `release` is clear (a slow or stuck etcd
    request); `held` counts those that waited."""

    def __init__(self) -> None:
        super().__init__(SystemClock())
        self.release = asyncio.Event()
        self.release.set()
        self.held = 0

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult:
        if any(op.key == keys.LOAD_BALANCE for op in success) and not self.release.is_set():
            self.held += 1
            await self.release.wait()
        return await super().txn(compare, success, failure)


async def test_the_leader_places_topics_while_its_rankings_write_waits() -> None:
    """Rankings are posted by a task of their own: a rankings write that hangs does not
    hold the leader's step loop, so an unloaded topic is placed meanwhile."""
    store = _RankingsHeld()
    async with store:
        clock = SystemClock()
        config = fast_config()
        admin = AdminClient(store, clock, config)
        async with LocalCluster(store, clock, config) as cluster:
            await start(cluster, "b1", "b2")
            await admin.create_topic("/r/t")
            await wait_settled(admin, 1, timeout=10)
            store.release.clear()

            async def held() -> bool:
                return store.held > 0

            await wait_until(held, 10, "a rankings write (after a load report) waiting")
            posted = await store.get(keys.LOAD_BALANCE)
            source = await admin.unload_topic("/r/t")

            async def moved() -> bool:
                return (await admin.view()).owner("/r/t") not in (None, source)

            await wait_until(moved, 10, "/r/t placed on the other broker")
            assert store.held == 1  # still the one write, waiting all along
            assert await store.get(keys.LOAD_BALANCE) == posted
            store.release.set()

            async def posted_again() -> bool:
                kv = await store.get(keys.LOAD_BALANCE)
                return kv is not None and kv != posted

            await wait_until(posted_again, 10, "the latest rankings posted at last")


async def test_drain_and_activate_write_one_key_without_listing_the_cluster() -> None:
    """On a cluster of thousands of topics a listing is seconds of etcd's time (and a
    pause of every commit meanwhile): setting a broker's state reads nothing of it."""

    listed: list[str] = []

    class Listings(MemoryStore):
        async def get_prefix(self, prefix: str) -> Any:
            listed.append(prefix)
            return await super().get_prefix(prefix)

    store = Listings()
    await store.put(keys.register("b1"), {"broker_url": "b1:6650"})
    admin = AdminClient(store)
    await admin.drain("b1")
    await admin.activate("b1")
    assert listed == []
    assert (await store.get(keys.broker_state("b1"))).value["mode"] == "active"  # type: ignore[union-attr]
    with pytest.raises(AdminError, match=r"'b9' is not registered \(registered: b1\)"):
        await admin.drain("b9")
