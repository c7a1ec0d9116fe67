"""Heavy and hostile clients against a real broker on a real etcd: each attack gets a clear
error, the others lose nothing, the broker keeps serving and the refusal is counted.

The real `danube-client` plays the victims; raw gRPC plays the attacker where the client
cannot express the attack (another principal's ids, hand-made requests).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from typer.testing import CliRunner

from ballast.broker import host as host_module
from ballast.cli.main import app
from ballast.clock import FakeClock
from ballast.config import AuthSettings
from ballast.metadata import keys
from ballast.metadata.etcd import EtcdStore
from ballast.model import TopicName
from ballast.storage import StorageConfig, WriteAheadLog
from ballast.storage.log import BrokerLog
from ballast.wire.auth import Permission, TokenAuthority
from ballast.wire.cluster_calls import ClusterDialer
from ballast.wire.protocol import CLIENT_CONSUMER, CLIENT_PRODUCER, pb, pb_grpc
from tests.etcd_fixtures import EtcdServer
from tests.server.certs import Pki, make_pki
from tests.server.helpers import (
    DataBroker,
    DataCluster,
    DispatchStrategy,
    GatedObjects,
    SubType,
    data_config,
    new_client,
    wait_until,
)
from tests.server.test_security import SECRET, client, secured_config

pytestmark = pytest.mark.timeout(90)

BOTH = [Permission.PRODUCE, Permission.CONSUME]


def token(subject: str, perms: dict[str, list[Permission]]) -> str:
    authority = TokenAuthority(AuthSettings(mode="jwt", secret=SECRET))
    return authority.issue(subject, perms, ttl_seconds=600)


@pytest.fixture
async def secured_broker(
    etcd_store: EtcdStore, tmp_path: Path
) -> AsyncIterator[tuple[DataBroker, Pki]]:
    pki = make_pki(tmp_path / "pki")
    config = secured_config(tmp_path / "data", pki)
    async with DataCluster(etcd_store, config) as cluster:
        broker = await cluster.start_broker("h1")
        await broker.host.directory.ensure_namespace("other")
        yield broker, pki


def raw_channel(url: str, pki: Pki) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(url, grpc.ssl_channel_credentials(pki.ca.read_bytes()))


def bearer(jwt: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {jwt}"),)


async def test_ids_are_bound_to_their_principal_across_namespaces(
    secured_broker: tuple[DataBroker, Pki],
) -> None:
    broker, pki = secured_broker
    victim = await client(broker.url, pki, token("alice", {"default": BOTH}))
    producer = (
        victim.new_producer().with_topic("/default/secret").with_name("p")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
    )  # fmt: skip
    await producer.create()
    consumer = (
        victim.new_consumer().with_topic("/default/secret").with_consumer_name("c")
        .with_subscription("s").with_subscription_type(SubType.EXCLUSIVE).build()
    )  # fmt: skip
    await consumer.subscribe()
    queue = await consumer.receive()
    host = broker.host
    consumer_id = next(iter(host.consumers))
    producer_id = next(iter(host.producers))

    # Mallory holds a valid token, for another namespace only.
    mallory = bearer(token("mallory", {"other": BOTH}))
    counters = host.counters
    async with raw_channel(broker.url, pki) as channel:
        consumers = pb_grpc.ConsumerServiceStub(channel)
        stream = consumers.ReceiveMessages(
            pb.ReceiveRequest(request_id=1, consumer_id=consumer_id), metadata=mallory
        )
        with pytest.raises(grpc.aio.AioRpcError) as taken:
            async for _ in stream:
                pass
        assert taken.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "another principal" in (taken.value.details() or "")
        health = pb_grpc.HealthCheckStub(channel)
        for kind, ident in ((CLIENT_CONSUMER, consumer_id), (CLIENT_PRODUCER, producer_id)):
            with pytest.raises(grpc.aio.AioRpcError) as probed:
                await health.HealthCheck(
                    pb.HealthCheckRequest(request_id=2, client=kind, id=ident), metadata=mallory
                )
            assert probed.value.code() is grpc.StatusCode.PERMISSION_DENIED
        # Same namespace, another principal: a producer id is no bearer credential either.
        eve = bearer(token("eve", {"default": BOTH}))
        producers = pb_grpc.ProducerServiceStub(channel)
        forged = pb.StreamMessage(
            request_id=3,
            msg_id=pb.MsgID(producer_id=producer_id, topic_name="/default/secret"),
            payload=b"forged",
        )
        with pytest.raises(grpc.aio.AioRpcError) as sent:
            await producers.SendMessage(forged, metadata=eve)
        assert sent.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert counters.rejected_count("ReceiveMessages", "not_owner") == 1
    assert counters.rejected_count("HealthCheck", "not_owner") == 2
    assert counters.rejected_count("SendMessage", "not_owner") == 1

    # The victim's stream was never taken over and nothing forged was stored.
    await producer.send(b"real")
    message = await asyncio.wait_for(queue.get(), 15)
    assert bytes(message.payload) == b"real"
    await consumer.ack(message)
    assert host.topics["/default/secret"].msgs_in == 1


async def test_brokers_call_each_other_with_the_clusters_tls_and_token(
    secured_broker: tuple[DataBroker, Pki],
) -> None:
    """What the relay and the dead-letter producer use: TLS and a cluster token."""
    broker, _ = secured_broker
    dialer = ClusterDialer(broker.host.config)
    async with dialer.channel(broker.url) as channel:
        stub = pb_grpc.ProducerServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await stub.CreateProducer(_producer_request("/other/relay"), timeout=5)
        assert anonymous.value.code() is grpc.StatusCode.UNAUTHENTICATED
        reply: Any = None
        for _ in range(100):  # the topic is created on first use, then placed
            try:
                reply = await stub.CreateProducer(
                    _producer_request("/other/relay"), timeout=5, metadata=dialer.metadata()
                )
                break
            except grpc.aio.AioRpcError as exc:
                assert exc.code() is grpc.StatusCode.UNAVAILABLE, exc.details()
                await asyncio.sleep(0.1)
        assert reply is not None and reply.producer_id


def ignored_acks(broker: DataBroker) -> float:
    registry = broker.host.counters.registry
    return registry.get_sample_value("ballast_dataplane_acks_ignored_total") or 0.0


def _producer_request(topic: str) -> Any:
    return pb.ProducerRequest(
        request_id=1, producer_name="cluster", topic_name=topic, dispatch_strategy=pb.Reliable
    )


@pytest.fixture
async def small_broker(etcd_store: EtcdStore, tmp_path: Path) -> AsyncIterator[DataBroker]:
    """An open broker with small limits (a 64 KiB message, 4 MiB requests)."""
    limits = {"max_message_bytes": 64 * 1024, "max_request_bytes": 4 * 1024 * 1024}
    async with DataCluster(etcd_store, data_config(tmp_path, data_plane=limits)) as cluster:
        yield await cluster.start_broker("h2")


async def test_oversized_messages_are_refused_whole_and_nothing_is_stored(
    small_broker: DataBroker,
) -> None:
    broker = small_broker
    c = await new_client(broker.url)
    producer = (
        c.new_producer().with_topic("/default/big").with_name("p")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
    )  # fmt: skip
    await producer.create()
    consumer = (
        c.new_consumer().with_topic("/default/big").with_consumer_name("c")
        .with_subscription("s").with_subscription_type(SubType.EXCLUSIVE).build()
    )  # fmt: skip
    await consumer.subscribe()
    queue = await consumer.receive()
    limit = broker.host.settings.max_message_bytes
    # A small payload with attributes that fill the rest: the whole message counts.
    with pytest.raises(grpc.aio.AioRpcError) as attrs:
        await producer.send(b"tiny", attributes={"a": "x" * limit})
    assert attrs.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = attrs.value.details() or ""
    assert f"message of {limit + 5} bytes" in details and f"limit of {limit} bytes" in details
    await producer.send(b"ok", attributes={"a": "b"})
    message = await asyncio.wait_for(queue.get(), 15)
    assert bytes(message.payload) == b"ok"  # the refused one was never stored
    await consumer.ack(message)
    assert broker.host.topics["/default/big"].msgs_in == 1
    assert broker.host.counters.rejected_count("SendMessage", "message_too_large") == 1

    async with grpc.aio.insecure_channel(broker.url) as channel:
        # Over the request limit: gRPC refuses it before anything parses it.
        send = channel.unary_unary("/danube.ProducerService/SendMessage")
        with pytest.raises(grpc.aio.AioRpcError) as huge:
            await send(b"\x0a" + b"\xff" * (5 * 1024 * 1024), timeout=10)
        assert huge.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        # Malformed protobuf: refused, nothing stored.
        with pytest.raises(grpc.aio.AioRpcError) as garbage:
            await send(b"\xff\xff\xff\xff", timeout=10)
        assert garbage.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed request" in (garbage.value.details() or "")
        # A name far over the limit.
        stub = pb_grpc.ProducerServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as named:
            await stub.CreateProducer(
                pb.ProducerRequest(
                    producer_name="n" * 10_000,
                    topic_name="/default/big",
                    dispatch_strategy=pb.Reliable,
                )
            )
        assert named.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "producer_name" in (named.value.details() or "")
    # The broker keeps serving.
    await producer.send(b"after")
    message = await asyncio.wait_for(queue.get(), 15)
    assert bytes(message.payload) == b"after"
    assert broker.host.topics["/default/big"].msgs_in == 2
    assert broker.host.counters.rejected_count("SendMessage", "malformed_request") == 1


async def test_acks_for_offsets_never_delivered_are_ignored_and_counted(
    small_broker: DataBroker,
) -> None:
    # Right after the subscription opened: inside the window for a previous owner's acks,
    # which covers no offset here (this owner wrote the topic from offset 0).
    broker = small_broker
    c = await new_client(broker.url)
    producer = (
        c.new_producer().with_topic("/default/acks").with_name("p")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
    )  # fmt: skip
    await producer.create()
    consumer = (
        c.new_consumer().with_topic("/default/acks").with_consumer_name("c")
        .with_subscription("s").with_subscription_type(SubType.EXCLUSIVE).build()
    )  # fmt: skip
    await consumer.subscribe()
    queue = await consumer.receive()
    async with grpc.aio.insecure_channel(broker.url) as channel:
        acks = pb_grpc.ConsumerServiceStub(channel)
        for offset in (2, 3, 1000):  # an attacker acks what nobody has received yet
            await acks.Ack(
                pb.AckRequest(
                    msg_id=pb.MsgID(topic_name="/default/acks", topic_offset=offset),
                    subscription_name="s",
                )
            )
    assert ignored_acks(broker) == 3
    for i in range(6):
        await producer.send(f"m{i}".encode())
    got = []
    for _ in range(6):
        message = await asyncio.wait_for(queue.get(), 15)
        got.append(bytes(message.payload))
        await consumer.ack(message)
    assert got == [f"m{i}".encode() for i in range(6)]  # nothing skipped
    assert ignored_acks(broker) == 3  # real acks count as real


async def raw_producer(channel: grpc.aio.Channel, topic: str, strategy: Any) -> int:
    """A producer id from raw CreateProducer (retried while the topic gets placed)."""
    stub = pb_grpc.ProducerServiceStub(channel)
    request = pb.ProducerRequest(
        request_id=1, producer_name="raw", topic_name=topic, dispatch_strategy=strategy
    )
    for _ in range(100):
        try:
            reply = await stub.CreateProducer(request, timeout=5)
            return int(reply.producer_id)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() is grpc.StatusCode.UNAVAILABLE, exc.details()
            await asyncio.sleep(0.1)
    raise AssertionError(f"{topic} was never placed")


@pytest.fixture
async def budget_broker(etcd_store: EtcdStore, tmp_path: Path) -> AsyncIterator[DataBroker]:
    """Tiny budgets: 8 KiB held per topic, 64 KiB read ahead per subscription."""
    limits = {"topic_budget_bytes": 8 * 1024, "subscription_buffer_bytes": 64 * 1024}
    config = data_config(tmp_path, data_plane=limits)
    objects = GatedObjects.of(config)
    async with DataCluster(etcd_store, config, objects) as cluster:
        yield await cluster.start_broker("h3")


async def test_a_subscription_that_never_reads_costs_bounded_memory(
    budget_broker: DataBroker, etcd_server: EtcdServer
) -> None:
    broker = budget_broker
    topic = "/default/firehose"
    c = await new_client(broker.url)
    producer = c.new_producer().with_topic(topic).with_name("p").build()
    await producer.create()
    reader = (
        c.new_consumer().with_topic(topic).with_consumer_name("r")
        .with_subscription("reads").with_subscription_type(SubType.EXCLUSIVE).build()
    )  # fmt: skip
    await reader.subscribe()
    queue = await reader.receive()
    async with grpc.aio.insecure_channel(broker.url) as channel:
        # Subscribes and never opens its stream.
        await pb_grpc.ConsumerServiceStub(channel).Subscribe(
            pb.ConsumerRequest(
                topic_name=topic,
                consumer_name="idle",
                subscription="never",
                subscription_type=0,
            )
        )
    served = broker.host.topics[topic]
    never = served.subscriptions["never"]
    count, payload = 2000, b"x" * 1024
    peak = 0
    for _ in range(count):
        await producer.send(payload)
        peak = max(peak, never.buffered_bytes)
    assert peak <= 64 * 1024
    assert never.dropped >= count - 64
    got = 0
    while got < count:  # the reading subscription lost nothing and was never held back
        await asyncio.wait_for(queue.get(), 15)
        got += 1
    registry = broker.host.counters.registry
    assert registry.get_sample_value("ballast_dataplane_subscription_dropped") == never.dropped
    # The operator sees it in `topics describe` (published now, unless the owner's sweep
    # has already published these very figures).
    await broker.host.publish_pressure()
    describe = ["admin", "topics", "describe", topic, "--etcd", etcd_server.client_url]
    shown = await asyncio.to_thread(CliRunner().invoke, app, describe)
    assert shown.exit_code == 0, shown.output
    assert f"subscription never: {never.buffered_bytes} bytes read ahead" in shown.output
    assert f"{never.dropped} dropped" in shown.output
    # A previous owner's figures (the topic moved since) are not shown as the topic's.
    stale = {"broker": "gone", "held_bytes": 7, "topic_budget_bytes": 9, "refused_sends": 0}
    await broker.host.store.put(keys.topic_pressure(topic), stale)
    shown = await asyncio.to_thread(CliRunner().invoke, app, describe)
    assert shown.exit_code == 0 and "backpressure" not in shown.output, shown.output


async def test_a_producer_flood_against_a_full_budget_gets_resource_exhausted(
    budget_broker: DataBroker,
) -> None:
    broker = budget_broker
    topic = "/default/flood"
    async with grpc.aio.insecure_channel(broker.url) as channel:
        producer_id = await raw_producer(channel, topic, pb.Reliable)
        stub = pb_grpc.ProducerServiceStub(channel)

        async def send(i: int) -> grpc.StatusCode:
            message = pb.StreamMessage(
                request_id=i,
                msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic),
                payload=b"f" * 1024,
            )
            try:
                await stub.SendMessage(message, timeout=30)
            except grpc.aio.AioRpcError as exc:
                assert "topic_budget_bytes" in (exc.details() or "")
                return exc.code()
            return grpc.StatusCode.OK

        # Uploads stall: what is accepted stays held, so the budget fills whatever the
        # timing of the 64 concurrent sends.
        objects = broker.host.objects()
        assert isinstance(objects, GatedObjects)
        objects.gate.clear()
        flood = asyncio.gather(*(send(i) for i in range(64)))
        counters = broker.host.counters

        async def full() -> bool:
            return counters.rejected_count("SendMessage", "topic_budget_full") >= 64 - 8

        await wait_until(full, 15, "the budget to refuse the sends it cannot hold")
        objects.gate.set()
        codes = await flood
    refused = codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
    # 8 KiB holds eight 1 KiB messages; the other 56 are refused, nothing else fails.
    assert refused == 64 - 8 and codes.count(grpc.StatusCode.OK) == 8
    assert counters.rejected_count("SendMessage", "topic_budget_full") == refused
    await broker.host.publish_pressure()
    record = await broker.host.store.get(keys.topic_pressure(topic))
    assert record is not None and record.value["refused_sends"] == refused
    # What was accepted is stored; a well-behaved client still gets through.
    c = await new_client(broker.url)
    consumer = (
        c.new_consumer().with_topic(topic).with_consumer_name("c")
        .with_subscription("s").with_subscription_type(SubType.EXCLUSIVE).build()
    )  # fmt: skip
    await consumer.subscribe()
    queue = await consumer.receive()
    producer = (
        c.new_producer().with_topic(topic).with_name("p")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
    )  # fmt: skip
    await producer.create()
    await producer.send(b"polite")
    message = await asyncio.wait_for(queue.get(), 15)
    assert bytes(message.payload) == b"polite"
    assert broker.host.topics[topic].msgs_in == 64 - refused + 1


async def test_namespace_quotas_from_the_cli(
    small_broker: DataBroker, etcd_server: EtcdServer
) -> None:
    broker = small_broker
    await broker.host.directory.ensure_namespace("tight")
    policy = [
        "admin", "namespaces", "set-policy", "tight", "--max-topics", "1",
        "--max-producers-per-topic", "1", "--max-subscriptions-per-topic", "20",
        "--max-consumers-per-topic", "21", "--etcd", etcd_server.client_url, "--json",
    ]  # fmt: skip
    result = await asyncio.to_thread(CliRunner().invoke, app, policy)
    assert result.exit_code == 0, result.output
    assert '"max_topics": 1' in result.output
    c = await new_client(broker.url)
    first = c.new_producer().with_topic("/tight/one").with_name("p1").build()
    await first.create()
    counters = broker.host.counters
    second = c.new_producer().with_topic("/tight/one").with_name("p2").build()
    with pytest.raises(grpc.aio.AioRpcError) as producers:
        await second.create()
    assert producers.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "at most 1 producers per topic" in (producers.value.details() or "")
    other = c.new_producer().with_topic("/tight/two").with_name("p").build()
    with pytest.raises(grpc.aio.AioRpcError) as topics:
        await other.create()
    assert topics.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "max_topics" in (topics.value.details() or "")
    # A flood of subscription names: the first 20 are taken, the rest refused.
    async with grpc.aio.insecure_channel(broker.url) as channel:
        stub = pb_grpc.ConsumerServiceStub(channel)

        async def subscribe(i: int) -> grpc.StatusCode:
            request = pb.ConsumerRequest(
                topic_name="/tight/one", consumer_name=f"c{i}", subscription=f"s{i}",
                subscription_type=1,
            )  # fmt: skip
            try:
                await stub.Subscribe(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

        codes = [await subscribe(i) for i in range(200)]
    assert codes.count(grpc.StatusCode.OK) == 20
    assert codes.count(grpc.StatusCode.FAILED_PRECONDITION) == 180
    assert len(broker.host.topics["/tight/one"].subscriptions) == 20
    assert counters.rejected_count("Subscribe", "quota_subscriptions_per_topic") == 180
    assert counters.rejected_count("CreateProducer", "quota_producers_per_topic") >= 1
    # The first producer and an existing subscription keep working.
    await first.send(b"still")
    assert broker.host.topics["/tight/one"].msgs_in == 1


async def test_big_messages_keep_the_wal_cache_within_its_byte_budget(tmp_path: Path) -> None:
    budget = 64 * 1024
    config = StorageConfig(cache_messages=8192, cache_bytes=budget)
    clock = FakeClock()
    async with BrokerLog(tmp_path / "wal", clock=clock, config=config) as broker_log:
        wal = WriteAheadLog(broker_log, "/default/big", clock=clock, config=config)
        await wal.recover()
        await wal.open(0)
        async with wal:
            for i in range(100):
                await wal.append(bytes([i]) * 10_000)
                assert wal.cache_bytes <= budget  # far below 8192 records
            assert wal.cache_bytes > 0
            # Everything reads back, the old records from the files.
            first = await wal.read(0, 1)
            assert first[0].payload == b"\x00" * 10_000
            last = await wal.read(99, 1)
            assert last[0].payload == b"\x63" * 10_000


async def test_an_abandoned_subscription_expires_with_its_cursor(
    etcd_store: EtcdStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_module, "CONSUMER_IDLE_SECONDS", 0.0)
    limits = {"subscription_expiry_seconds": 0.3}
    async with DataCluster(etcd_store, data_config(tmp_path, data_plane=limits)) as cluster:
        broker = await cluster.start_broker("h4")
        host = broker.host
        topic = "/default/abandoned"
        async with grpc.aio.insecure_channel(broker.url) as channel:
            await raw_producer(channel, topic, pb.Reliable)
            stub = pb_grpc.ConsumerServiceStub(channel)
            for name in ("gone", "kept"):
                await stub.Subscribe(
                    pb.ConsumerRequest(
                        topic_name=topic,
                        consumer_name="c",
                        subscription=name,
                        subscription_type=0,
                    )
                )
        served = host.topics[topic]
        cursor = keys.subscription_cursor(TopicName.parse(topic), "gone")
        assert await etcd_store.get(cursor) is not None
        # "kept" has a consumer that keeps checking in; "gone" was abandoned.
        kept = next(iter(served.subscriptions["kept"].consumers.values()))
        host.sweep()  # forgets both idle consumers (the idle time is 0 here) ...
        handle = await served.subscribe("kept", "exclusive", "c", (), host.clock.now())
        assert handle is not kept and served.subscriptions["kept"].consumers
        assert await host.expire_subscriptions() == []  # ... the expiry clock starts
        await asyncio.sleep(0.4)
        assert await host.expire_subscriptions() == [(topic, "gone")]
        assert set(served.subscriptions) == {"kept"}
        assert await etcd_store.get(cursor) is None
        registry = host.counters.registry
        assert registry.get_sample_value("ballast_dataplane_subscriptions_expired_total") == 1
