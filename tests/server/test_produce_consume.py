"""Produce then consume with the real `danube-client`: every subscription type, both
dispatch strategies, acks, nacks, partitions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.server.helpers import DataCluster, DispatchStrategy, SubType, new_client

pytestmark = pytest.mark.timeout(60)


async def make_producer(
    client: Any, topic: str, name: str = "p1", *, reliable: bool = True, partitions: int = 0
) -> Any:
    builder = client.new_producer().with_topic(topic).with_name(name)
    if reliable:
        builder = builder.with_dispatch_strategy(DispatchStrategy.RELIABLE)
    if partitions:
        builder = builder.with_partitions(partitions)
    producer = builder.build()
    await producer.create()
    return producer


async def make_consumer(
    client: Any,
    topic: str,
    sub: str,
    sub_type: SubType,
    name: str = "c1",
    key_filters: list[str] | None = None,
) -> tuple[Any, asyncio.Queue[Any]]:
    builder = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name(name)
        .with_subscription(sub)
        .with_subscription_type(sub_type)
    )
    for f in key_filters or []:
        builder = builder.with_key_filter(f)
    consumer = builder.build()
    await consumer.subscribe()
    return consumer, await consumer.receive()


async def take(queue: asyncio.Queue[Any], n: int, timeout: float = 10) -> list[Any]:
    out = []
    async with asyncio.timeout(timeout):
        for _ in range(n):
            out.append(await queue.get())
    return out


async def test_reliable_produce_consume_ack(cluster: DataCluster) -> None:
    client = await new_client(cluster.brokers["b1"].url)
    producer = await make_producer(client, "/default/r1")
    consumer, queue = await make_consumer(client, "/default/r1", "s1", SubType.EXCLUSIVE)
    for i in range(20):
        assert await producer.send(f"m{i}".encode(), {"i": str(i)}) > 0
    msgs = await take(queue, 20)
    assert [m.msg_id.topic_offset for m in msgs] == list(range(20))
    assert [m.payload for m in msgs] == [f"m{i}".encode() for i in range(20)]
    assert all(m.msg_id.topic_name == "/default/r1" for m in msgs)
    assert msgs[3].attributes["i"] == "3"
    for m in msgs:
        await consumer.ack(m)
    served = cluster.brokers["b1"].host.topics["/default/r1"]
    assert served.subscriptions["s1"].cursor == 19
    await consumer.close()
    await producer.close()
