"""The control plane end to end, in one process, on MemoryStore and on a real etcd.

Real brokers, election and load manager over a real store; hosts are synthetic and record
what the brokers asked of them.
"""

from __future__ import annotations

from collections import Counter

import pytest

from ballast.balance import measure
from ballast.clock import SystemClock
from ballast.cluster import AdminClient, LocalCluster
from ballast.metadata import MetadataStore, keys
from ballast.model import MarkerReason
from tests.cluster.helpers import (
    FAST_REBALANCING,
    counts,
    fast_config,
    host_mismatch,
    hosts_match,
    is_drained,
    replay,
    wait_settled,
    wait_until,
)

pytestmark = pytest.mark.timeout(90)


async def start(cluster: LocalCluster, *brokers: str) -> None:
    for broker in brokers:
        await cluster.start_broker(broker)
    await cluster.wait_leader()


async def test_topic_burst_spreads_evenly_with_fair(store: MetadataStore) -> None:
    clock = SystemClock()
    config = fast_config()
    admin = AdminClient(store, clock, config)
    async with LocalCluster(store, clock, config) as cluster:
        await start(cluster, "b1", "b2", "b3")
        created = await admin.create_topics(f"/burst/t{i:04d}" for i in range(1000))
        assert created == 1000
        view = await wait_settled(admin, 1000, timeout=30)
        placed = counts(view)
        assert sum(placed.values()) == 1000
        assert max(placed.values()) <= 1.1 * min(placed.values()), placed
        await wait_until(
            lambda: hosts_match(cluster, admin),
            15,
            "hosts serve their topics",
            explain=lambda: host_mismatch(cluster, admin),
        )


async def test_hint_is_honoured_and_unknown_hint_is_counted(store: MetadataStore) -> None:
    clock = SystemClock()
    config = fast_config()
    admin = AdminClient(store, clock, config)
    async with LocalCluster(store, clock, config) as cluster:
        await start(cluster, "b1", "b2", "b3")
        await admin.create_topics(f"/load/t{i}" for i in range(9))
        await wait_settled(admin, 9, timeout=20)
        # b2 is not the least loaded after this burst of hints, yet gets every hinted topic.
        for i in range(5):
            await admin.create_topic(f"/hinted/h{i}", hint="b2")
        view = await wait_settled(admin, 14, timeout=20)
        assert all(view.owner(f"/hinted/h{i}") == "b2" for i in range(5))
        await admin.create_topic("/hinted/ghost", hint="no-such-broker")
        view = await wait_settled(admin, 15, timeout=20)
        assert view.owner("/hinted/ghost") in {"b1", "b3"}  # the least loaded, not b2
        leader = cluster.leader()
        assert leader is not None
        assert leader.metrics.rejected_count("unknown_broker") == 1


async def test_unload_excludes_the_source_and_seals_first(store: MetadataStore) -> None:
    clock = SystemClock()
    config = fast_config()
    admin = AdminClient(store, clock, config)
    async with LocalCluster(store, clock, config) as cluster:
        await start(cluster, "b1", "b2", "b3")
        await admin.create_topics(f"/u/t{i}" for i in range(12))
        view = await wait_settled(admin, 12, timeout=20)
        before = {t: view.owner(t) for t in view.owners}
        for topic, owner in sorted(before.items()):
            assert await admin.unload_topic(topic) == owner
        view = await wait_settled(admin, 12, timeout=20)
        for topic, owner in before.items():
            assert view.owner(topic) not in (None, owner), topic
            # The source unloaded (sealed) the topic before the target loaded it.
            assert ("unload", topic) in cluster.host(owner).events
        await wait_until(lambda: hosts_match(cluster, admin), 10, "hosts serve their topics")


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


async def test_scale_out_converges_like_the_simulator(store: MetadataStore) -> None:
    clock = SystemClock()
    config = fast_config(rebalancing=FAST_REBALANCING)
    admin = AdminClient(store, clock, config)
    async with LocalCluster(store, clock, config) as cluster:
        await start(cluster, "b1", "b2", "b3")
        await admin.create_topics(f"/s/t{i:03d}" for i in range(60))
        view = await wait_settled(admin, 60, timeout=20)
        initial = counts(view)
        await cluster.start_broker("b4")
        await cluster.start_broker("b5")
        initial_cv = measure({**{b: float(n) for b, n in initial.items()}, "b4": 0, "b5": 0}).cv
        assert initial_cv > 0.8

        async def balanced() -> bool:
            leader = cluster.leader()
            session = leader.manager.session if leader is not None else None
            if session is None or session.last_decision is None:
                return False
            view = await admin.view()
            cv = measure({b: float(n) for b, n in counts(view).items()}).cv
            return (
                len(view.registrations) == 5
                and cv < 0.10
                and session.last_decision.rule == "balanced"
                and not session.episode
                and not view.markers
                and len(view.owners) == 60
            )

        await wait_until(balanced, 45, "rebalancing to finish")
        view = await admin.view()
        final = counts(view)
        assert measure({b: float(n) for b, n in final.items()}).cv < 0.10
        moves = await admin.history()
        moved = Counter(m.topic for m in moves)
        assert max(moved.values()) == 1  # no topic moved twice
        minimum = sum(max(0, initial.get(b, 0) - n) for b, n in final.items())
        assert len(moves) == minimum
        assert {m.to_broker for m in moves} <= {"b4", "b5"}
        await wait_until(lambda: hosts_match(cluster, admin), 10, "hosts serve their topics")


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


async def test_killed_leader_is_replaced_and_nothing_is_lost(store: MetadataStore) -> None:
    clock = SystemClock()
    ttl = 2.0
    config = fast_config(ttl=ttl)
    admin = AdminClient(store, clock, config)
    async with LocalCluster(store, clock, config) as cluster:
        await start(cluster, "b1", "b2", "b3")
        await admin.create_topics(f"/l/t{i}" for i in range(30))
        await wait_settled(admin, 30, timeout=20)
        old = cluster.leader()
        assert old is not None
        await cluster.kill_broker(old.broker_id)

        async def new_leader() -> bool:
            current = await admin.leader()
            return current is not None and current["broker_id"] != old.broker_id

        took = await wait_until(new_leader, ttl + 2, "a new leader")
        assert took <= ttl + 2
        # Topics created while there was no leader, and the dead leader's own topics,
        # all end up assigned.
        await admin.create_topics(f"/l/late{i}" for i in range(10))
        view = await wait_settled(admin, 40, timeout=ttl + 5)
        assert old.broker_id not in view.by_broker


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
        marker = cluster.host(target).topics["/m/t"]
        assert marker is not None
        assert (marker.reason, marker.from_broker, marker.ready) == (
            MarkerReason.UNLOAD,
            owner,
            True,
        )
