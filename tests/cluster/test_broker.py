"""`BrokerNode` on its own: the test plays the leader by writing keys; time is a FakeClock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from ballast.clock import FakeClock, SystemClock
from ballast.cluster import AdminClient, BrokerNode, ClusterMetrics, LocalCluster, SyntheticHost
from ballast.cluster.resources import FixedSampler, ResourceUsage
from ballast.load_history import HISTORY_GLOB
from ballast.metadata import Delete, KeyValue, MetadataStore, Put, keys
from ballast.metadata.memory import MemoryStore
from ballast.metadata.records import assignment_value
from ballast.model import (
    Assignment,
    BrokerMode,
    BrokerState,
    LoadReport,
    MarkerReason,
    TopicLoad,
    UnassignedMarker,
)
from ballast.storage import Handoff, SealedState
from tests.cluster.helpers import fast_config, host_mismatch, hosts_match, wait_settled, wait_until
from tests.storage.helpers import eventually

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def node() -> AsyncIterator[tuple[BrokerNode, SyntheticHost, MemoryStore, FakeClock]]:
    clock = FakeClock()
    async with MemoryStore(clock) as store:
        host = SyntheticHost("b1", clock)
        sampler = FixedSampler(ResourceUsage(cpu_percent=12.5, memory_percent=40.0))
        config = fast_config(ttl=10.0, report_interval=5.0)
        async with BrokerNode(store, clock, host, config, "b1", sampler=sampler) as broker:
            await clock.advance(0)
            yield broker, host, store, clock


async def test_registers_reports_and_follows_its_assignments(
    node: tuple[BrokerNode, SyntheticHost, MemoryStore, FakeClock],
) -> None:
    broker, host, store, clock = node
    registration = await store.get(keys.register("b1"))
    assert registration is not None and registration.lease == broker.lease.id  # type: ignore[union-attr]
    state = await store.get(keys.broker_state("b1"))
    assert state is not None and BrokerState.from_dict(state.value).mode is BrokerMode.ACTIVE
    report = await store.get(keys.load("b1"))
    assert report is not None
    assert LoadReport.from_dict(report.value).cpu_percent == 12.5

    marker = UnassignedMarker(MarkerReason.FAILOVER, from_broker="b9", timestamp=clock.now())
    await store.put(
        keys.broker_assignment("b1", "/ns/t"), assignment_value(Assignment(clock.now()), marker)
    )
    await clock.advance(0)
    assert host.topics == {"/ns/t": marker}  # the host learns why the topic came

    published = broker.reports_published
    await clock.advance(5.0)
    assert broker.reports_published == published + 1
    report = await store.get(keys.load("b1"))
    assert report is not None
    # Published sparse: an idle topic is its name alone (10 000 of them fit in etcd).
    assert report.value["topics"] == [{"topic": "/ns/t"}]


async def test_seals_before_marking_the_move_ready(
    node: tuple[BrokerNode, SyntheticHost, MemoryStore, FakeClock],
) -> None:
    _, host, store, clock = node
    key = keys.broker_assignment("b1", "/ns/t")
    await store.put(key, Assignment(clock.now()).to_dict())
    await clock.advance(0)
    assert "/ns/t" in host.topics
    move = UnassignedMarker(MarkerReason.REBALANCE, "b1", "b2", clock.now(), ready=False)
    from ballast.metadata import Delete, Put

    await store.txn([], [Delete(key), Put(keys.unassigned("/ns/t"), move.to_dict())])
    await clock.advance(0)
    assert host.events == [("load", "/ns/t"), ("unload", "/ns/t")]
    kv = await store.get(keys.unassigned("/ns/t"))
    assert kv is not None
    assert UnassignedMarker.from_dict(kv.value) == UnassignedMarker(
        MarkerReason.REBALANCE, "b1", "b2", move.timestamp, ready=True
    )


async def test_bounces_assignments_while_draining(
    node: tuple[BrokerNode, SyntheticHost, MemoryStore, FakeClock],
) -> None:
    _, host, store, clock = node
    await store.put(keys.broker_state("b1"), BrokerState(BrokerMode.DRAINING).to_dict())
    await clock.advance(0)
    key = keys.broker_assignment("b1", "/ns/late")
    await store.put(key, Assignment(clock.now()).to_dict())
    await clock.advance(0)
    assert await store.get(key) is None
    kv = await store.get(keys.unassigned("/ns/late"))
    assert kv is not None
    marker = UnassignedMarker.from_dict(kv.value)
    assert (marker.reason, marker.from_broker, marker.ready) == (
        MarkerReason.DRAIN_REDIRECT,
        "b1",
        True,
    )
    assert host.events == []


async def test_lease_expiry_on_the_clock_drops_topics_and_registers_again(
    node: tuple[BrokerNode, SyntheticHost, MemoryStore, FakeClock],
) -> None:
    broker, host, store, clock = node
    await store.put(keys.broker_assignment("b1", "/ns/t"), Assignment(clock.now()).to_dict())
    await clock.advance(0)
    old_lease = broker.lease
    assert old_lease is not None
    # The store loses the lease (as after a partition longer than the TTL).
    await store.revoke_lease(old_lease.id)
    await clock.advance(10.0)  # the next refresh finds the lease gone
    assert ("unload", "/ns/t") in host.events
    assert broker.lease is not None and broker.lease.id != old_lease.id
    registration = await store.get(keys.register("b1"))
    assert registration is not None and registration.lease == broker.lease.id
    # Still assigned (no leader reassigned it): it serves it again after re-registering.
    await clock.advance(0)
    assert "/ns/t" in host.topics


async def test_a_broker_that_loses_its_lease_rejoins_the_cluster(store: MetadataStore) -> None:
    """With a leader: the topics fail over, the broker stops serving, then comes back."""
    clock = SystemClock()
    config = fast_config(ttl=1.5)
    admin = AdminClient(store, clock, config)
    async with LocalCluster(store, clock, config) as cluster:
        for b in ("b1", "b2", "b3"):
            await cluster.start_broker(b)
        leader = await cluster.wait_leader()
        victim = next(b for b in ("b1", "b2", "b3") if b != leader.broker_id)
        await admin.create_topics(f"/r/t{i}" for i in range(30))
        await wait_settled(admin, 30, timeout=20)
        lease = cluster.brokers[victim].node.lease
        assert lease is not None
        await store.revoke_lease(lease.id)

        async def rejoined() -> bool:
            node = cluster.brokers[victim].node
            view = await admin.view()
            return (
                node.lease is not None
                and node.lease.id != lease.id
                and victim in view.registrations
                and len(view.owners) == 30
                and not view.markers
            )

        await wait_until(rejoined, 10, f"{victim} to rejoin")
        await wait_until(
            lambda: hosts_match(cluster, admin),
            5,
            "hosts serve their topics",
            explain=lambda: host_mismatch(cluster, admin),
        )
        # It is a full member again: new topics reach it.
        await admin.create_topics(f"/r/new{i}" for i in range(9))
        view = await wait_settled(admin, 39, timeout=10)
        assert any(view.owner(f"/r/new{i}") == victim for i in range(9))


async def test_metrics_cover_the_documented_series(store: MetadataStore) -> None:
    clock = SystemClock()
    config = fast_config()
    admin = AdminClient(store, clock, config)
    async with LocalCluster(store, clock, config) as cluster:
        for b in ("b1", "b2"):
            await cluster.start_broker(b)
        leader = await cluster.wait_leader()
        await admin.create_topics(f"/x/t{i}" for i in range(4))
        await wait_settled(admin, 4, timeout=10)

        def assigned() -> float:
            return sum(
                leader.metrics.sample(
                    "ballast_topic_assignments_total", {"broker_id": b, "action": "assign"}
                )
                for b in ("b1", "b2")
            )

        # The counters move once the leader has processed its writes' outcomes, which can
        # be after the store (and so `wait_settled`) shows them: wait on the metrics.
        await wait_until(
            lambda: _async(
                leader.metrics.sample("ballast_cluster_active_brokers") == 2 and assigned() >= 4
            ),
            5,
            "balance gauges and assignment counters",
        )
        text = leader.metrics.exposition().decode()
        for name in (
            "ballast_cluster_balance_cv",
            "ballast_cluster_balance_mean_load",
            "ballast_cluster_balance_max_load",
            "ballast_cluster_balance_min_load",
            "ballast_cluster_balance_std_dev",
            "ballast_cluster_active_brokers",
            "ballast_rebalancing_checks_total",
            "ballast_rebalancing_moves_total",
            "ballast_rebalancing_failures_total",
            "ballast_rebalancing_cycle_duration_seconds",
            "ballast_topic_assignments_total",
            "ballast_broker_topics_owned",
            "ballast_broker_cpu_usage",
            "ballast_broker_memory_usage",
            "ballast_broker_throughput_mbps",
            "ballast_leader",
            "ballast_rejected_records_total",
        ):
            assert name in text, name
        assert assigned() == 4
        assert leader.metrics.sample("ballast_leader") == 1
        follower = next(p for b, p in cluster.brokers.items() if b != leader.broker_id)
        assert follower.metrics.sample("ballast_leader") == 0
        assert isinstance(follower.metrics, ClusterMetrics)


async def _async(value: bool) -> bool:
    return value


async def test_leader_appends_every_load_report_to_the_history(tmp_path: Path) -> None:
    clock = SystemClock()
    config = fast_config(report_interval=0.1)
    async with MemoryStore(clock) as store:
        admin = AdminClient(store, clock, config)
        async with LocalCluster(store, clock, config, history_dir=tmp_path) as cluster:
            for b in ("b1", "b2"):
                await cluster.start_broker(b)
            leader = await cluster.wait_leader()
            await admin.create_topics(f"/h/t{i}" for i in range(4))
            await wait_settled(admin, 4, timeout=10)

            def lines() -> list[str]:
                return [
                    line
                    for path in tmp_path.glob(HISTORY_GLOB)
                    for line in path.read_text().splitlines()
                ]

            await wait_until(lambda: _async(len(lines()) >= 10), 10, "10 history lines")
        files = list(tmp_path.glob(HISTORY_GLOB))
        assert [f.name for f in files] == [f"leader-{leader.broker_id}.jsonl"]
        reports = [json.loads(line) for line in lines()]
        assert {r["broker_id"] for r in reports} == {"b1", "b2"}
        assert all(r["state"] == "active" for r in reports)
        assert all(LoadReport.from_dict(r).broker_id in ("b1", "b2") for r in reports)
        assert any(r["topic_count"] > 0 for r in reports)
        # The history keeps every figure of every topic, idle or not: its readers expect them.
        assert all(set(t) == set(TopicLoad("/h/t").to_dict()) for r in reports for t in r["topics"])


class _SlowSeal(SyntheticHost):
    """A host whose seal waits until the test lets it finish."""

    def __init__(self, broker_id: str, clock: FakeClock) -> None:
        super().__init__(broker_id, clock)
        self.sealing = asyncio.Event()
        self.finish = asyncio.Event()

    async def unload(self, topic: str, handoff: Handoff | None = None) -> SealedState | None:
        self.sealing.set()
        await self.finish.wait()
        return await super().unload(topic, handoff)


class _CountingStore(MemoryStore):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.reads: list[str] = []

    async def get(self, key: str) -> KeyValue | None:
        self.reads.append(key)
        return await super().get(key)

    async def peek(self, key: str) -> KeyValue | None:
        """The test's own read (not counted)."""
        return await super().get(key)


@pytest.mark.parametrize("changed_while_sealing", [False, True])
async def test_the_marker_is_read_while_the_topic_seals(changed_while_sealing: bool) -> None:
    """A move's marker is read during the seal, so making it ready after the seal costs
    one round trip; a marker that changed meanwhile is read again, its change kept."""
    clock = FakeClock()
    async with _CountingStore(clock) as store:
        host = _SlowSeal("b1", clock)
        config = fast_config(ttl=10.0, report_interval=5.0)
        async with BrokerNode(store, clock, host, config, "b1"):
            key, marker_key = keys.broker_assignment("b1", "/ns/t"), keys.unassigned("/ns/t")
            await store.put(key, Assignment(clock.now()).to_dict())
            await eventually(lambda: "/ns/t" in host.topics)
            move = UnassignedMarker(MarkerReason.REBALANCE, "b1", "b2", clock.now(), ready=False)
            await store.txn([], [Delete(key), Put(marker_key, move.to_dict())])
            await asyncio.wait_for(host.sealing.wait(), 5)
            await eventually(lambda: marker_key in store.reads)
            if changed_while_sealing:  # e.g. the leader re-targets the move
                await store.put(marker_key, replace(move, to_broker="b3").to_dict())
            read_before = store.reads.count(marker_key)
            host.finish.set()

            async def ready() -> bool:
                kv = await store.peek(marker_key)
                return kv is not None and UnassignedMarker.from_dict(kv.value).ready

            await wait_until(ready, 5, "the marker made ready")
            kv = await store.peek(marker_key)
            assert kv is not None
            assert UnassignedMarker.from_dict(kv.value).to_broker == (
                "b3" if changed_while_sealing else "b2"
            )
            # None after the seal when the marker read during it was current; one when
            # it had changed (the swap failed and the marker was read again).
            after = store.reads.count(marker_key) - read_before
            assert after == (1 if changed_while_sealing else 0)
