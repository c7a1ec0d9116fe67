"""No broker-count ceiling: placement and failover with 300 registered brokers on etcd.

etcd refuses a transaction of more than 128 operations (compares, or operations in a
branch); "never two owners" costs one compare per topic (its ownership record), so the
number of brokers does not matter. Two real brokers run the leader and serve; 298 more
are registered on leases (they never serve: the leader only needs their registrations).
"""

from __future__ import annotations

import pytest

from ballast.clock import SystemClock
from ballast.cluster import AdminClient, LocalCluster
from ballast.metadata import keys
from ballast.metadata.etcd import EtcdStore
from ballast.metadata.records import Registration
from tests.cluster.helpers import fast_config, replay, store_revision, wait_settled, wait_until

pytestmark = pytest.mark.timeout(120)

REGISTERED = 298
TOPICS = 300


async def test_300_brokers_place_and_fail_over_on_etcd(etcd_store: EtcdStore) -> None:
    store = etcd_store
    clock = SystemClock()
    config = fast_config(ttl=2.0)
    admin = AdminClient(store, clock, config)
    leases = {}
    for i in range(REGISTERED):
        broker = f"idle-{i:03d}"
        lease = await store.grant_lease(120)
        leases[broker] = lease
        registration = Registration(broker_url=f"{broker}:6650")
        await store.put(keys.register(broker), registration.to_dict(), lease.id)
    async with LocalCluster(store, clock, config) as cluster:
        for broker in ("real-1", "real-2"):
            await cluster.start_broker(broker)
        await cluster.wait_leader()
        start = await store_revision(store)
        await admin.create_topics(f"/scale/t{i:04d}" for i in range(TOPICS))
        view = await wait_settled(admin, TOPICS, timeout=60)
        assert len(view.registrations) == REGISTERED + 2
        owners = {b for b in view.brokers() if view.topics_of(b)}
        assert len(owners) >= 250  # Fair spreads the burst over (nearly) all 300
        assert max(len(view.topics_of(b)) for b in owners) <= 2

        # 30 brokers die at once: their topics go to the survivors.
        victims = sorted(leases)[:30]
        orphans = {t for b in victims for t in view.topics_of(b)}
        assert len(orphans) >= 20
        for broker in victims:
            await store.revoke_lease(leases[broker].id)

        async def failed_over() -> bool:
            view = await admin.view()
            return all(view.owner(t) not in (None, *victims) for t in orphans)

        await wait_until(failed_over, 20, "the dead brokers' topics owned elsewhere")
        view = await wait_settled(admin, TOPICS, timeout=20)
        assert not set(victims) & set(view.by_broker)
        end = await store_revision(store)
        history = await replay(store, start, end)
        assert history.violations == []
        assert set(view.owner_records) == set(view.owners)
        leader = cluster.leader()
        assert leader is not None
        assert leader.metrics.sample("ballast_leader_session_failures_total") == 0
    for broker in sorted(leases)[30:]:
        await store.revoke_lease(leases[broker].id)
