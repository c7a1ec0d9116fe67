"""`LiveCluster` on a real etcd: it follows the store through an outage (one watch, kept
current), and the pure helpers behind the balance chart and the history filters."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from ballast.clock import SystemClock
from ballast.cluster import AdminClient
from ballast.console import BalanceSample, LiveCluster
from ballast.console.app import bucket_samples, filter_moves
from ballast.console.targets import prometheus_targets
from ballast.leader.view import ClusterView
from ballast.metadata import KeyValue, Listing, keys
from ballast.metadata.etcd import EtcdStore
from ballast.metadata.records import Registration
from ballast.model import Move
from tests.cluster.conftest import wipe
from tests.cluster.helpers import wait_until
from tests.etcd_fixtures import EtcdServer, tcp_proxy

pytestmark = pytest.mark.timeout(90)


async def test_live_view_catches_up_after_a_store_outage() -> None:
    with EtcdServer() as etcd_server:
        await _catches_up_after_an_outage(etcd_server)


async def _catches_up_after_an_outage(etcd_server: EtcdServer) -> None:
    port = urlsplit(etcd_server.client_url).port
    assert port is not None
    clock = SystemClock()
    async with EtcdStore(etcd_server.client_url) as direct, tcp_proxy(port) as proxy:
        await wipe(direct)
        await direct.put(keys.register("w1"), Registration("127.0.0.1:1").to_dict())
        async with (
            EtcdStore(proxy.url) as store,
            LiveCluster(store, clock, admin=AdminClient(store, clock), retry_seconds=0.2) as live,
        ):
            frame = await live.current_frame()
            assert [r.info.broker_id for r in frame.brokers] == ["w1"]
            await proxy.cut()
            # Meanwhile, through another connection: a broker joins, a topic is created.
            await direct.put(keys.register("w2"), Registration("127.0.0.1:2").to_dict())
            await AdminClient(direct, clock).create_topic("/default/during-outage")
            await proxy.restore()

            async def caught_up() -> bool:
                frame = await live.current_frame()
                brokers = [r.info.broker_id for r in frame.brokers]
                return brokers == ["w1", "w2"] and "/default/during-outage" in frame.topics

            # gRPC reconnects with backoff (1 s, ×1.6 per failed attempt): allow for it.
            async def seen() -> str:
                frame = await live.current_frame()
                brokers = [r.info.broker_id for r in frame.brokers]
                return f"brokers {brokers}, topics {sorted(frame.topics)[:5]}"

            await wait_until(caught_up, 45, "the console's view after the outage", explain=seen)
        await wipe(direct)


def test_balance_samples_are_bucketed_into_at_most_the_points_asked() -> None:
    samples = [
        BalanceSample(float(t), 0.1 * (t % 3), 10.0, 1.0, 5.0 + t, 20.0 + t) for t in range(9)
    ]
    assert bucket_samples(samples, 20) == [s.to_dict() for s in samples]
    three = bucket_samples(samples, 3)
    assert len(three) == 3
    assert three[0]["min"] == 5.0 and three[-1]["max"] == 28.0
    assert three[0]["cv"] == pytest.approx(0.1)  # mean of 0.0, 0.1, 0.2


def test_history_filters_combine() -> None:
    moves = [
        Move("/a/t1", "b1", "b2", "LoadImbalance", 1.0, 10.0),
        Move("/a/t2", "b2", "b3", "Admin", 1.0, 20.0),
        Move("/b/t1", "b3", "b1", "LoadImbalance", 1.0, 30.0),
    ]
    assert filter_moves(moves, broker="b2") == moves[:2]
    assert filter_moves(moves, topic="t1", reason="loadimb") == [moves[0], moves[2]]
    assert filter_moves(moves, since=15, until=25) == [moves[1]]


def test_prometheus_targets_skip_brokers_without_a_resolved_metrics_port() -> None:
    regs = {
        "m1": Registration("h:1", metrics_url="http://10.0.0.1:9040/metrics"),
        "m2": Registration("h:2", metrics_url=""),
        "m3": Registration("h:3", metrics_url="https://10.0.0.3:9443/custom"),
    }
    items = [
        KeyValue(keys.register(b), r.to_dict(), i + 1, i + 1, 1)
        for i, (b, r) in enumerate(regs.items())
    ]
    view, bad = ClusterView.from_listings(Listing(items, 3))
    assert not bad
    assert prometheus_targets(view) == [
        {"targets": ["10.0.0.1:9040"], "labels": {"broker": "m1", "__metrics_path__": "/metrics"}},
        {
            "targets": ["10.0.0.3:9443"],
            "labels": {"broker": "m3", "__metrics_path__": "/custom", "__scheme__": "https"},
        },
    ]
