"""Produce then consume with the real `danube-client`: every subscription type, both
dispatch strategies, acks, nacks, partitions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from ballast.cluster import AdminClient
from ballast.wire.protocol import pb, pb_grpc
from tests.server.helpers import DataCluster, DispatchStrategy, SubType, new_client, wait_until

pytestmark = pytest.mark.timeout(60)

_open: list[Any] = []


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    """Close every consumer and producer a test opened (their loops would spin after)."""
    yield
    while _open:
        await _open.pop().close()


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
    _open.append(producer)
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
    _open.append(consumer)
    return consumer, await consumer.receive()


async def take(queue: asyncio.Queue[Any], n: int, timeout: float = 10) -> list[Any]:
    out = []
    async with asyncio.timeout(timeout):
        for _ in range(n):
            out.append(await queue.get())
    return out


async def streaming(cluster: DataCluster, topic: str, sub: str, n: int) -> Any:
    """Wait until `n` consumers of `sub` have their streams attached; its dispatcher.

    The client opens a consumer's stream in the background after `receive()`: until every
    stream is attached, sends go to those that are (a race, not the dispatch rule)."""
    dispatcher = cluster.brokers["b1"].host.topics[topic].subscriptions[sub]

    async def attached() -> bool:
        return sum(c.connected for c in dispatcher.consumers.values()) == n

    await wait_until(attached, 10, f"{n} consumer streams on {topic} {sub}")
    return dispatcher


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


async def test_non_reliable_fan_out_to_two_subscriptions(cluster: DataCluster) -> None:
    client = await new_client(cluster.brokers["b1"].url)
    producer = await make_producer(client, "/default/nr", reliable=False)
    _, q1 = await make_consumer(client, "/default/nr", "a", SubType.EXCLUSIVE)
    _, q2 = await make_consumer(client, "/default/nr", "b", SubType.SHARED, name="c2")
    for i in range(10):
        await producer.send(f"n{i}".encode())
    for queue in (q1, q2):
        msgs = await take(queue, 10)
        assert [m.payload for m in msgs] == [f"n{i}".encode() for i in range(10)]
        assert all(m.msg_id.topic_name == "/default/nr" for m in msgs)


async def test_shared_round_robin_and_redelivery_when_a_consumer_goes(
    cluster: DataCluster,
) -> None:
    client = await new_client(cluster.brokers["b1"].url)
    producer = await make_producer(client, "/default/sh")
    c1, q1 = await make_consumer(client, "/default/sh", "s", SubType.SHARED, name="c1")
    c2, q2 = await make_consumer(client, "/default/sh", "s", SubType.SHARED, name="c2")
    dispatcher = await streaming(cluster, "/default/sh", "s", 2)
    for i in range(10):
        await producer.send(f"{i}".encode())
    got1, got2 = await take(q1, 5), await take(q2, 5)
    offsets1 = {m.msg_id.topic_offset for m in got1}
    offsets2 = {m.msg_id.topic_offset for m in got2}
    assert offsets1 | offsets2 == set(range(10)) and not offsets1 & offsets2
    # c1 acks out of order except one; c2 acks everything.
    for m in reversed(got2):
        await c2.ack(m)
    unacked = sorted(offsets1)[0]
    for m in got1:
        if m.msg_id.topic_offset != unacked:
            await c1.ack(m)
    assert dispatcher.cursor == unacked - 1  # the lowest unacked offset holds the cursor
    # c1 goes away: its unacked message goes to c2.
    await c1.close()  # cancels its stream
    redelivered = await take(q2, 1)
    assert redelivered[0].msg_id.topic_offset == unacked
    await c2.ack(redelivered[0])
    assert dispatcher.cursor == 9


async def test_failover_one_active_then_the_next(cluster: DataCluster) -> None:
    client = await new_client(cluster.brokers["b1"].url)
    producer = await make_producer(client, "/default/fo")
    c1, q1 = await make_consumer(client, "/default/fo", "s", SubType.FAILOVER, name="c1")
    _, q2 = await make_consumer(client, "/default/fo", "s", SubType.FAILOVER, name="c2")
    await streaming(cluster, "/default/fo", "s", 2)
    for i in range(5):
        await producer.send(f"{i}".encode())
    got = await take(q1, 5)
    assert [m.msg_id.topic_offset for m in got] == list(range(5))
    assert q2.empty()
    for m in got[:3]:
        await c1.ack(m)
    await c1.close()  # its stream ends: c2 takes over
    await producer.send(b"5")
    got2 = await take(q2, 3)
    assert [m.msg_id.topic_offset for m in got2] == [3, 4, 5]


async def test_exclusive_refuses_a_second_consumer_but_not_a_reconnect(
    cluster: DataCluster,
) -> None:
    import grpc

    client = await new_client(cluster.brokers["b1"].url)
    await make_producer(client, "/default/ex")
    first, _ = await make_consumer(client, "/default/ex", "s", SubType.EXCLUSIVE, name="c1")
    # The same name again (a reconnect) gets the same id, never ALREADY_EXISTS.
    again, _ = await make_consumer(client, "/default/ex", "s", SubType.EXCLUSIVE, name="c1")
    ids = [c._consumers["/default/ex"].consumer_id for c in (first, again)]
    assert ids[0] == ids[1] != 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await make_consumer(client, "/default/ex", "s", SubType.EXCLUSIVE, name="c2")
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "exclusive" in (err.value.details() or "")


async def test_key_shared_by_key_with_filters(cluster: DataCluster) -> None:
    client = await new_client(cluster.brokers["b1"].url)
    producer = await make_producer(client, "/default/ks")
    _, qa = await make_consumer(
        client, "/default/ks", "s", SubType.KEY_SHARED, name="ca", key_filters=["eu-*"]
    )
    _, qb = await make_consumer(
        client, "/default/ks", "s", SubType.KEY_SHARED, name="cb", key_filters=["us-*"]
    )
    for i in range(6):
        await producer._producers[0].send(f"e{i}".encode(), None, "eu-west")
        await producer._producers[0].send(f"u{i}".encode(), None, "us-east")
    got_a, got_b = await take(qa, 6), await take(qb, 6)
    assert {m.routing_key for m in got_a} == {"eu-west"}
    assert {m.routing_key for m in got_b} == {"us-east"}
    assert [m.payload for m in got_a] == [f"e{i}".encode() for i in range(6)]


async def test_nack_redelivers_after_the_delay(cluster: DataCluster) -> None:
    client = await new_client(cluster.brokers["b1"].url)
    producer = await make_producer(client, "/default/nk")
    consumer, queue = await make_consumer(client, "/default/nk", "s", SubType.EXCLUSIVE)
    await producer.send(b"x")
    (first,) = await take(queue, 1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await consumer.nack(first, delay_ms=300, reason="later")
    (again,) = await take(queue, 1)
    assert loop.time() - start >= 0.25
    assert again.msg_id.topic_offset == first.msg_id.topic_offset
    await consumer.ack(again)


async def test_partitioned_topic_produce_and_consume(cluster: DataCluster) -> None:
    client = await new_client(cluster.brokers["b1"].url)
    producer = await make_producer(client, "/default/pt", partitions=3)
    _, queue = await make_consumer(client, "/default/pt", "s", SubType.SHARED)
    for i in range(9):
        await producer.send(f"{i}".encode())
    msgs = await take(queue, 9)
    assert {m.msg_id.topic_name for m in msgs} == {f"/default/pt-part-{i}" for i in range(3)}
    assert sorted(m.payload for m in msgs) == sorted(f"{i}".encode() for i in range(9))


async def test_load_report_carries_the_real_traffic(cluster: DataCluster) -> None:
    from ballast.metadata import keys
    from ballast.model import LoadReport

    client = await new_client(cluster.brokers["b1"].url)
    producer = await make_producer(client, "/default/load")
    _, queue = await make_consumer(client, "/default/load", "s", SubType.SHARED)
    for _ in range(30):
        await producer.send(b"x" * 100)
    await take(queue, 30)  # received, never acked: all 30 are backlog

    async def reported() -> LoadReport | None:
        kv = await cluster.store.get(keys.load("b1"))
        report = LoadReport.from_dict(kv.value) if kv is not None else None
        if report is None:
            return None
        loads = [t for t in report.topics if t.topic == "/default/load"]
        return report if loads and loads[0].backlog == 30 else None

    async def ready() -> bool:
        return await reported() is not None

    await wait_until(ready, 10, "a load report with the topic's traffic")
    report = await reported()
    assert report is not None
    (load,) = [t for t in report.topics if t.topic == "/default/load"]
    assert (load.producers, load.consumers, load.subscriptions) == (1, 1, 1)
    assert load.backlog == 30


async def test_a_topic_created_by_another_producer_meanwhile_is_no_partitioned_conflict(
    cluster: DataCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two producers create a new topic at once: one saw no topic, then, looking for
    partitions, finds the other one's plain topic — it is sent on (UNAVAILABLE: look up
    again) like any producer of a topic served elsewhere, not refused ALREADY_EXISTS as
    "a partitioned topic" (on which the client gives up)."""
    b2 = await cluster.start_broker("b2")
    topic = "/default/racing"
    await AdminClient(cluster.store).create_topic(topic, hint=b2.broker_id)
    assert await cluster.wait_served(topic) is b2
    b1 = cluster.brokers["b1"]
    directory = b1.host.directory
    real_meta = directory.meta_in_namespace
    missed: list[str] = []

    async def meta_missing_the_concurrent_create(name: Any) -> Any:
        meta, namespace = await real_meta(name)
        if str(name) == topic and not missed:
            missed.append(topic)
            return None, namespace  # read before the other producer's create landed
        return meta, namespace

    monkeypatch.setattr(directory, "meta_in_namespace", meta_missing_the_concurrent_create)
    request = pb.ProducerRequest(
        request_id=1, producer_name="p", topic_name=topic, dispatch_strategy=pb.NonReliable
    )
    async with grpc.aio.insecure_channel(b1.url) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as sent_on:
            await pb_grpc.ProducerServiceStub(channel).CreateProducer(request, timeout=10)
    assert missed == [topic]
    assert sent_on.value.code() is grpc.StatusCode.UNAVAILABLE, sent_on.value.details()
    assert "not served by this broker" in (sent_on.value.details() or "")


@pytest.mark.parametrize("client", ["producer", "consumer"])
async def test_a_client_of_a_topic_placed_here_but_not_yet_served_waits_for_it(
    cluster: DataCluster, monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    """A gateway carrying a producer or a consumer hears of a move from the ownership
    record, often before the new owner's own watch has the assignment: the new owner
    serves the client once the topic opens, rather than sending the gateway round again
    (UNAVAILABLE; a consumer was even answered INTERNAL, "unreachable", with a traceback
    in the broker's log)."""
    b1 = cluster.brokers["b1"]
    topic = f"/default/placed-here-{client}"
    await AdminClient(cluster.store).create_topic(topic, hint=b1.broker_id)
    assert await cluster.wait_served(topic) is b1
    real_serving = b1.host.serving
    missed: list[str] = []

    async def not_yet(name: str) -> Any:
        if name == topic and not missed:
            missed.append(name)
            return None  # asked before this broker saw its assignment
        return await real_serving(name)

    monkeypatch.setattr(b1.host, "serving", not_yet)
    async with grpc.aio.insecure_channel(b1.url) as channel:
        if client == "producer":
            answer = await pb_grpc.ProducerServiceStub(channel).CreateProducer(
                pb.ProducerRequest(
                    request_id=1, producer_name="c", topic_name=topic,
                    dispatch_strategy=pb.NonReliable,
                ),
                timeout=10,
            )  # fmt: skip
            assert answer.producer_name == "c" and "c" in b1.host.topics[topic].producers
        else:
            answer = await pb_grpc.ConsumerServiceStub(channel).Subscribe(
                pb.ConsumerRequest(
                    request_id=1, topic_name=topic, consumer_name="c", subscription="s"
                ),
                timeout=10,
            )
            assert answer.consumer_name == "c" and "s" in b1.host.topics[topic].subscriptions
    assert missed == [topic]
