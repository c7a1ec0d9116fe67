"""Moves through the gateway are a pause, not an error: the real client keeps its producer
and consumer while the topic moves between brokers, nothing acknowledged is lost, and what
the client acknowledged is not delivered again."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path

import pytest

from ballast.cluster import AdminClient
from ballast.gateway.gateway import Gateway
from ballast.gateway.sessions import ACKED_REMEMBERED, HeldBudget, SessionTable
from ballast.metadata.etcd import EtcdStore
from tests.etcd_fixtures import TcpProxy
from tests.server.helpers import (
    DataCluster,
    SubType,
    data_config,
    new_client,
    relays,
    wait_until,
)
from tests.server.test_gateway import Traffic
from tests.server.test_moves import reliable_producer

pytestmark = pytest.mark.timeout(120)

TOPIC = "/default/carried"


def longest_gap(times: list[float]) -> float:
    return max((b - a for a, b in pairwise(times)), default=0.0)


async def _more(traffic: Traffic, count: int) -> bool:
    return len(traffic.received) >= count


@pytest.fixture
async def gateway_cluster(
    etcd_store: EtcdStore, tmp_path: Path
) -> AsyncIterator[tuple[DataCluster, Gateway]]:
    config = data_config(tmp_path)
    async with DataCluster(etcd_store, config) as cluster:
        await cluster.start_broker("b1")
        await cluster.start_broker("b2")
        async with Gateway(etcd_store, config, "127.0.0.1:0") as gateway:
            yield cluster, gateway


async def test_moves_through_the_gateway_are_a_pause_not_an_error(
    gateway_cluster: tuple[DataCluster, Gateway], etcd_store: EtcdStore
) -> None:
    cluster, gateway = gateway_cluster
    client = await new_client(gateway.advertise)
    # A subscription created before the traffic and read only afterwards: nothing lost.
    creator = await reliable_producer(client, TOPIC, name="p0")
    witness = (
        client.new_consumer().with_topic(TOPIC).with_consumer_name("w")
        .with_subscription("witness").with_subscription_type(SubType.EXCLUSIVE).build()
    )  # fmt: skip
    await witness.subscribe()
    await witness.close()
    await creator.close()
    traffic = Traffic(client, TOPIC)
    await traffic.start()
    admin = AdminClient(etcd_store)
    try:
        for _ in range(4):
            source = await cluster.wait_served(TOPIC)
            before = len(traffic.received)

            async def flowing(before: int = before) -> bool:
                return len(traffic.received) > before + 30

            await wait_until(flowing, 20, "messages to flow")
            await admin.unload_topic(TOPIC)

            async def moved(source: object = source) -> bool:
                owner = cluster.owner(TOPIC)
                return owner is not None and owner is not source

            await wait_until(moved, 20, "the topic to move")
        after = len(traffic.received)

        async def resumed() -> bool:
            return len(traffic.received) > after + 30

        await wait_until(resumed, 20, "messages to flow after the last move")
        traffic.stop.set()
        await asyncio.sleep(0.3)

        async def drained() -> bool:
            return not traffic.missing()

        await wait_until(drained, 20, f"every acknowledged message ({traffic.missing()})")
    finally:
        await traffic.close()
    assert traffic.errors == [], traffic.errors[:3]
    assert gateway.counts.get("CreateProducer:carried", 0) >= 4, gateway.counts
    assert gateway.counts.get("Subscribe:carried", 0) >= 4, gateway.counts
    # The gateway carries its consumers itself: no old owner relays them (a relay would
    # subscribe under the same name and take the gateway's stream over, and back).
    assert [relays(broker) for broker in cluster.brokers.values()] == [0, 0]
    producer_pause = longest_gap(sorted(traffic.acked.values()))
    consumer_pause = longest_gap([when for _, _, when in traffic.received])
    # Goal 0.1 s; on a shared 2-core test machine allow more, far below the client's
    # own retry backoff (2.5 s and more) that a move cost before.
    assert producer_pause < 1.5, producer_pause
    assert consumer_pause < 1.5, consumer_pause
    # Each message was acknowledged as it arrived: only an ack still in flight when the
    # topic moved may be delivered again.
    repeated = sum(n - 1 for n in Counter(seq for seq, _, _ in traffic.received).values())
    assert repeated <= 4 * 2, repeated
    sent = set(traffic.acked)
    reader = await new_client(gateway.advertise)
    audit = (
        reader.new_consumer().with_topic(TOPIC).with_consumer_name("w")
        .with_subscription("witness").with_subscription_type(SubType.EXCLUSIVE).build()
    )  # fmt: skip
    await audit.subscribe()
    queue = await audit.receive()
    seen: set[int] = set()
    deadline = time.monotonic() + 30
    while not sent <= seen and time.monotonic() < deadline:
        message = await asyncio.wait_for(queue.get(), 10)
        seen.add(int(message.payload.decode()))
        await audit.ack(message)
    await audit.close()
    assert sent <= seen, sorted(sent - seen)[:10]


async def test_two_gateways_behind_one_address_survive_the_death_of_one(
    gateway_cluster: tuple[DataCluster, Gateway], etcd_store: EtcdStore, tmp_path: Path
) -> None:
    """A TCP balancer (here a proxy that a test re-points) in front of two gateways: when
    the gateway a client used dies, the balancer sends it to the other; the client's ids
    are unknown there, so it recreates its producer and re-subscribes (the broker answers
    UNAVAILABLE / CLOSE, as after a restart) and nothing acknowledged is lost."""
    cluster, first = gateway_cluster
    async with Gateway(etcd_store, data_config(tmp_path), "127.0.0.1:0") as second:
        balancer = TcpProxy(int(first.url.rsplit(":", 1)[1]))
        await balancer.start()
        address = f"127.0.0.1:{balancer.port}"
        second.advertise = first.advertise = address  # both answer lookups with the shared one
        traffic = Traffic(await new_client(address), TOPIC)
        await traffic.start()
        try:
            await wait_until(lambda: _more(traffic, 30), 20, "messages to flow")
            # The balancer has noticed: new connections go to the second gateway, and the
            # first dies with its connections.
            balancer.target_port = int(second.url.rsplit(":", 1)[1])
            await balancer.cut()
            await balancer.restore()
            await first.stop(grace=0)
            died_at = time.monotonic()

            async def resumed() -> bool:
                return any(w > died_at for w in traffic.acked.values()) and any(
                    w > died_at for _, _, w in traffic.received
                )

            await wait_until(resumed, 40, "producer and consumer to resume on the other gateway")
            traffic.stop.set()
            await asyncio.sleep(0.3)

            async def drained() -> bool:
                return not traffic.missing()

            await wait_until(drained, 20, f"every acknowledged message ({traffic.missing()})")
        finally:
            await traffic.close()
            await balancer.cut()
        # At most the calls in flight when the gateway died fail (a send, an ack).
        assert len(traffic.errors) <= 2, traffic.errors
        assert second.counts.get("lookup", 0) >= 1, second.counts
        assert cluster.owner(TOPIC) is not None


def test_held_sends_are_bounded_in_count_and_bytes() -> None:
    budget = HeldBudget(max_count=2, max_bytes=100)
    assert budget.take(60)
    assert not budget.take(41)  # bytes
    assert budget.take(40)
    assert not budget.take(0)  # count
    budget.give_back(60)
    assert budget.take(60)
    assert (budget.count, budget.bytes) == (2, 100)


def test_sessions_are_bounded_and_found_by_subscription() -> None:
    table = SessionTable(limit=2)
    first = table.add_consumer("/default/t", "s", b"", "b1:1", 11)
    second = table.add_consumer("/default/t", "s", b"", "b1:1", 12)
    assert {s.id for s in table.subscribed("/default/t", "s")} == {first, second}
    assert table.consumer(first) is not None  # used: the second is now the oldest
    third = table.add_consumer("/default/u", "s", b"", "b2:1", 13)
    assert table.consumer(second) is None
    assert [s.id for s in table.subscribed("/default/t", "s")] == [first]
    assert [s.id for s in table.subscribed("/default/u", "s")] == [third]
    assert len({first, second, third, table.add_producer("/default/t", b"", "b1:1", 11)}) == 4
    session = table.consumers[first]
    for offset in range(ACKED_REMEMBERED + 5):
        session.remember_ack(offset)
    assert len(session.acked) == ACKED_REMEMBERED and session.max_acked == ACKED_REMEMBERED + 4
    assert not session.already_acked(0) and session.already_acked(ACKED_REMEMBERED + 4)
