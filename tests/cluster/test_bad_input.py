"""Bad records never stop the leader: it logs, counts, and goes on."""

from __future__ import annotations

from typing import Any

import pytest

from ballast.clock import SystemClock
from ballast.cluster import AdminClient, LocalCluster
from ballast.metadata import MetadataStore, keys
from ballast.model import Assignment, LoadReport, UnassignedMarker
from tests.cluster.helpers import fast_config, wait_settled, wait_until

pytestmark = pytest.mark.timeout(60)


async def put_raw(store: MetadataStore, key: str, data: bytes) -> None:
    writer: Any = store
    await writer.put_raw(key, data)


async def test_leader_counts_bad_records_and_keeps_placing(store: MetadataStore) -> None:
    clock = SystemClock()
    config = fast_config()
    admin = AdminClient(store, clock, config)
    async with LocalCluster(store, clock, config) as cluster:
        for b in ("b1", "b2", "b3"):
            await cluster.start_broker(b)
        leader = await cluster.wait_leader()
        metrics = leader.metrics

        # Garbage JSON in a load report.
        await put_raw(store, keys.load("b2"), b"{this is not json")
        # A load report from a broker nobody registered.
        await store.put(keys.load("ghost"), LoadReport("ghost", clock.now()).to_dict())
        # A marker for a topic that does not exist (deleted, or never created).
        await store.put(keys.unassigned("/gone/topic"), UnassignedMarker().to_dict())
        # A marker that is not JSON, for a topic that does exist.
        await store.put(keys.topic_meta("/ok/garbled"), {"created_at": clock.now()})
        await put_raw(store, keys.unassigned("/ok/garbled"), b"\xff\xfe")
        # An assignment to a broker that is not registered.
        await store.put(keys.topic_meta("/ok/orphan"), {"created_at": clock.now()})
        await store.put(
            keys.broker_assignment("ghost", "/ok/orphan"), Assignment(clock.now()).to_dict()
        )

        async def counted() -> bool:
            return (
                metrics.rejected_count("load_report") >= 1
                and metrics.rejected_count("unknown_broker") >= 1
                and metrics.rejected_count("marker_unknown_topic") >= 1
                and metrics.rejected_count("marker") >= 1
            )

        await wait_until(counted, 10, "the bad records to be counted")
        assert await store.get(keys.unassigned("/gone/topic")) is None  # dropped

        # ... and the leader goes on: new topics, the repaired marker and the orphan land.
        await admin.create_topics(f"/ok/t{i}" for i in range(20))
        view = await wait_settled(admin, 22, timeout=20)
        assert view.owner("/ok/garbled") in {"b1", "b2", "b3"}
        assert view.owner("/ok/orphan") in {"b1", "b2", "b3"}
        assert "ghost" not in view.by_broker
        assert cluster.leader() is leader and leader.manager.terms == 1
        assert metrics.sample("ballast_leader_session_failures_total") == 0


async def test_leader_bootstraps_over_bad_records(store: MetadataStore) -> None:
    """Undecodable values already in the store when a leader starts are repaired."""
    clock = SystemClock()
    config = fast_config()
    admin = AdminClient(store, clock, config)
    await put_raw(store, keys.load("b9"), b"[1, 2")
    await store.put(keys.topic_meta("/boot/t"), {"created_at": clock.now()})
    await put_raw(store, keys.unassigned("/boot/t"), b"nope")
    async with LocalCluster(store, clock, config) as cluster:
        await cluster.start_broker("b1")
        await cluster.start_broker("b2")
        leader = await cluster.wait_leader()
        view = await wait_settled(admin, 1, timeout=10)
        assert view.owner("/boot/t") in {"b1", "b2"}
        assert leader.metrics.rejected_count("load_report") == 1
        assert leader.metrics.rejected_count("marker") == 1
        assert await store.get(keys.load("b9")) is None
