"""Topics that move keep every message: lookups redirect, producers and consumers of the
real client follow the topic to its new owner by themselves, offsets continue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from ballast.cluster import AdminClient
from ballast.metadata import Compare, Put, keys
from ballast.metadata.etcd import EtcdStore
from ballast.metadata.records import release_ops
from ballast.model import MarkerReason, UnassignedMarker
from tests.server.helpers import (
    DataCluster,
    DispatchStrategy,
    GatedObjects,
    SubType,
    data_config,
    handovers,
    new_client,
    relays,
    wait_until,
)

pytestmark = pytest.mark.timeout(90)


async def receive_and_ack(consumer: Any, queue: asyncio.Queue[Any], count: int) -> list[Any]:
    """Receive `count` messages, acking each as it arrives (as a consumer does)."""
    got = []
    for _ in range(count):
        got.append(await queue.get())
        await consumer.ack(got[-1])
    return got


async def reliable_producer(client: Any, topic: str, name: str = "p1") -> Any:
    producer = (
        client.new_producer()
        .with_topic(topic)
        .with_name(name)
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        .build()
    )
    await producer.create()
    return producer


async def exclusive_consumer(client: Any, topic: str, sub: str = "s1") -> Any:
    consumer = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name("c1")
        .with_subscription(sub)
        .with_subscription_type(SubType.EXCLUSIVE)
        .build()
    )
    await consumer.subscribe()
    return consumer


async def test_lookup_at_a_non_owner_redirects_and_a_pinned_producer_recovers(
    cluster: DataCluster,
) -> None:
    b2 = await cluster.start_broker("b2")
    client = await new_client(cluster.brokers["b1"].url)
    producer = await reliable_producer(client, "/default/mv1")
    owner = await cluster.wait_served("/default/mv1")
    other = b2 if owner is cluster.brokers["b1"] else cluster.brokers["b1"]
    # Any broker answers the lookup: the non-owner redirects to the owner's address.
    reply = await client.lookup_service.lookup_topic(other.url, "/default/mv1")
    assert reply.response_type == 0  # Redirect
    assert reply.broker_url == reply.connect_url == owner.url
    reply = await client.lookup_service.lookup_topic(owner.url, "/default/mv1")
    assert reply.response_type == 1  # Connect
    # The producer is pinned to the owner; the topic moves; sends go on by themselves.
    await producer.send(b"before")
    await AdminClient(cluster.store).unload_topic("/default/mv1")
    for i in range(3):
        await producer.send(f"after{i}".encode())
    new_owner = await cluster.wait_moved("/default/mv1", owner)
    assert new_owner is other
    storage = new_owner.host.topics["/default/mv1"].storage  # type: ignore[attr-defined]
    assert storage.next_offset == 4  # offsets 0..3, continuous across the move
    await producer.close()


async def sent_with_0_to_4_acked(
    cluster: DataCluster, topic: str, count: int
) -> tuple[Any, Any, asyncio.Queue[Any], list[Any]]:
    """A second broker; on b1, `count` messages sent and received on an Exclusive
    subscription, 0..4 acked: (producer, consumer, its queue, the messages received)."""
    await cluster.start_broker("b2")
    client = await new_client(cluster.brokers["b1"].url)
    producer = await reliable_producer(client, topic)
    consumer = await exclusive_consumer(client, topic)
    queue = await consumer.receive()
    for i in range(count):
        await producer.send(f"m{i}".encode())
    first = [await asyncio.wait_for(queue.get(), 10) for _ in range(count)]
    assert [m.msg_id.topic_offset for m in first] == list(range(count))
    for m in first[:5]:
        await consumer.ack(m)
    return producer, consumer, queue, first


async def test_unload_anchor_consumer_gets_exactly_the_unacked_and_the_new(
    cluster: DataCluster,
) -> None:
    """Danube's anchor: produce 0-9, ack 0-4, unload, produce 8 more once the topic has
    moved: 5..17 arrive, in order, each once."""
    producer, consumer, queue, _ = await sent_with_0_to_4_acked(cluster, "/default/anchor", 10)
    source = cluster.owner("/default/anchor")
    assert source is not None
    reader = asyncio.create_task(receive_and_ack(consumer, queue, 13))
    await AdminClient(cluster.store).unload_topic("/default/anchor")
    # The move is done (the old owner sealed, the new one serves) before 10.. are sent; a
    # send racing the seal is the next test's case.
    target = await cluster.wait_moved("/default/anchor", source)
    for i in range(10, 18):
        await producer.send(f"m{i}".encode())
    after = await asyncio.wait_for(reader, 30)
    assert [m.msg_id.topic_offset for m in after] == list(range(5, 18))
    assert [m.payload for m in after] == [f"m{i}".encode() for i in range(5, 18)]
    # The new owner continued after the seal: 5..9 came from object storage, 10.. its WAL.
    opened = target.host.topics["/default/anchor"].storage.opened  # type: ignore[attr-defined]
    assert (opened.next_offset, opened.source.value) == (10, "sealed")
    await asyncio.sleep(0.5)
    assert queue.empty()  # and nothing more: each of 5..17 exactly once
    await consumer.close()
    await producer.close()


@pytest.mark.parametrize("acked_before_the_seal", [True, False])
async def test_a_message_the_old_owner_delivered_just_before_the_move(
    cluster: DataCluster, acked_before_the_seal: bool
) -> None:
    """The interleaving of a send racing the unload: the old owner takes message 10 and
    delivers it before it seals, while 5..9 are still unacked. The consumer sees 10 first;
    after the move the new owner delivers again, in offset order, what was unacked at the
    seal — 5..9, and 10 too unless its ack reached the old owner first — then 11.."""
    topic = "/default/anchor-race"
    producer, consumer, queue, first = await sent_with_0_to_4_acked(cluster, topic, 11)
    if acked_before_the_seal:
        await consumer.ack(first[10])  # answered by the old owner: kept with its seal
    source = cluster.owner(topic)
    assert source is not None
    redelivered = [*range(5, 10), *([] if acked_before_the_seal else [10])]
    reader = asyncio.create_task(receive_and_ack(consumer, queue, len(redelivered) + 7))
    await AdminClient(cluster.store).unload_topic(topic)
    target = await cluster.wait_moved(topic, source)
    for i in range(11, 18):
        await producer.send(f"m{i}".encode())
    after = await asyncio.wait_for(reader, 30)
    assert [m.msg_id.topic_offset for m in after] == [*redelivered, *range(11, 18)]
    opened = target.host.topics[topic].storage.opened  # type: ignore[attr-defined]
    assert (opened.next_offset, opened.source.value) == (11, "sealed")
    await asyncio.sleep(0.5)
    assert queue.empty()
    await consumer.close()
    await producer.close()


async def test_a_moving_consumer_is_relayed_without_waiting_for_its_health_check(
    cluster: DataCluster,
) -> None:
    """The old owner feeds the open stream from the new owner: messages keep flowing long
    before the client's next health check (every 5 s) would move it; acks pass on."""
    await cluster.start_broker("b2")
    client = await new_client(cluster.brokers["b1"].url)
    producer = await reliable_producer(client, "/default/relay")
    consumer = await exclusive_consumer(client, "/default/relay")
    queue = await consumer.receive()
    await producer.send(b"0")
    first = await asyncio.wait_for(queue.get(), 10)
    await consumer.ack(first)
    source = cluster.owner("/default/relay")
    assert source is not None
    loop = asyncio.get_running_loop()
    start = loop.time()
    await AdminClient(cluster.store).unload_topic("/default/relay")

    target = await cluster.wait_moved("/default/relay", source, timeout=10)
    # Sent to the new owner directly (another client), received through the relay.
    other = await new_client(target.url)
    direct = await reliable_producer(other, "/default/relay", name="p2")
    await direct.send(b"1")
    message = await asyncio.wait_for(queue.get(), 10)
    assert (message.msg_id.topic_offset, message.payload) == (1, b"1")
    assert loop.time() - start < 3.0
    await consumer.ack(message)  # to the old owner, passed on to the new one
    dispatcher = target.host.topics["/default/relay"].subscriptions["s1"]

    async def acked() -> bool:
        return dispatcher.cursor == 1

    await wait_until(acked, 5, "the relayed ack to reach the new owner")
    assert relays(source) == 1
    await consumer.close()
    await producer.close()
    await direct.close()


async def test_a_reliable_topic_on_s3_moves_and_replays_from_the_objects(
    etcd_store: EtcdStore, tmp_path: Path
) -> None:
    """Objects in s3:// (moto's S3 server): the new owner replays what the old one sealed."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        ).create_bucket(Bucket="ballast-dataplane")  # fmt: skip
        base = data_config(tmp_path)
        options = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
            "skip_instance_cache": True,
        }
        storage = base.storage.model_copy(
            update={"object_store": "s3://ballast-dataplane/t", "object_store_options": options}
        )
        async with DataCluster(etcd_store, base.model_copy(update={"storage": storage})) as c:
            await c.start_broker("s1")
            await c.start_broker("s2")
            client = await new_client(c.brokers["s1"].url)
            producer = await reliable_producer(client, "/default/s3")
            consumer = await exclusive_consumer(client, "/default/s3")
            queue = await consumer.receive()
            for i in range(5):
                await producer.send(f"{i}".encode())
            first = [await asyncio.wait_for(queue.get(), 10) for _ in range(5)]
            await consumer.ack(first[0])
            source = c.owner("/default/s3")
            await AdminClient(c.store).unload_topic("/default/s3")
            await producer.send(b"5")
            after = []
            for _ in range(5):  # 1..4 again from the objects on S3, then 5
                after.append(await asyncio.wait_for(queue.get(), 20))
                await consumer.ack(after[-1])
            assert [m.msg_id.topic_offset for m in after] == [1, 2, 3, 4, 5]
            assert source is not None and source.host.stats.objects_uploaded >= 1
            await c.wait_moved("/default/s3", source)
            await consumer.close()
            await producer.close()
    finally:
        server.stop()


async def test_close_handshake_without_relay_moves_the_consumer_with_no_reopen_spin(
    etcd_store: EtcdStore, tmp_path: Path
) -> None:
    """Relay off: the old owner keeps the stream open, answers CLOSE on the next health
    check, then ends the stream; the client re-subscribes on the new owner at once."""
    config = data_config(tmp_path, data_plane={"relay_moving_consumers": False})
    async with DataCluster(etcd_store, config) as c:
        await c.start_broker("h1")
        await c.start_broker("h2")
        client = await new_client(c.brokers["h1"].url)
        producer = await reliable_producer(client, "/default/hs")
        consumer = await exclusive_consumer(client, "/default/hs")
        queue = await consumer.receive()
        await producer.send(b"0")
        await consumer.ack(await asyncio.wait_for(queue.get(), 10))
        source = c.owner("/default/hs")
        assert source is not None
        await AdminClient(c.store).unload_topic("/default/hs")
        # Sent once the new owner serves the topic: only the handshake brings it here.
        await c.wait_moved("/default/hs", source)
        await producer.send(b"1")
        message = await asyncio.wait_for(queue.get(), 15)  # within one health period
        assert (message.msg_id.topic_offset, message.payload) == (1, b"1")
        # No reopen spin: the client never opened a stream for an id the source forgot.
        assert source.host.counters.rejected_count("ReceiveMessages", "unknown_consumer") == 0
        await consumer.ack(message)
        await consumer.close()
        await producer.close()


async def test_a_move_makes_its_marker_ready_in_the_seals_own_write(
    cluster: DataCluster,
) -> None:
    """The old owner writes the sealed state and the ready marker in one transaction: the
    leader learns the topic can move from the seal itself (one round trip sooner)."""
    await cluster.start_broker("b2")
    topic = "/default/handoff"
    client = await new_client(cluster.brokers["b1"].url)
    producer = await reliable_producer(client, topic)
    await producer.send(b"0")
    source = await cluster.wait_served(topic)
    start = (await cluster.store.get_prefix(keys.unassigned(topic))).revision + 1
    await AdminClient(cluster.store).unload_topic(topic)
    await cluster.wait_moved(topic, source)
    sealed_at: int | None = None
    ready_at: int | None = None
    watch = cluster.store.watch_prefix("/", start)
    async with asyncio.timeout(10):
        async for event in watch:
            if event.key == keys.storage_state(topic) and (event.value or {}).get("sealed"):
                sealed_at = event.revision
            if event.key == keys.unassigned(topic) and (event.value or {}).get("ready"):
                ready_at = event.revision
            if sealed_at is not None and ready_at is not None:
                break
    await watch.aclose()  # type: ignore[attr-defined]  # an async generator
    assert sealed_at == ready_at
    await producer.close()


async def _revisions_of_the_handoff(
    store: Any, topic: str, start: int, target: str
) -> tuple[int | None, int | None, bool]:
    """(revision of the sealed state, of `target`'s assignment, whether the marker was
    ever made ready) as the store's history shows them from `start`."""
    sealed_at = assigned_at = None
    made_ready = False
    watch = store.watch_prefix("/", start)
    async with asyncio.timeout(10):
        async for event in watch:
            if event.key == keys.storage_state(topic) and (event.value or {}).get("sealed"):
                sealed_at = event.revision
            if event.key == keys.unassigned(topic) and (event.value or {}).get("ready"):
                made_ready = True
            if event.key == keys.broker_assignment(target, topic) and event.kind == "put":
                assigned_at = event.revision
            if sealed_at is not None and assigned_at is not None:
                break
    await watch.aclose()  # an async generator
    return sealed_at, assigned_at, made_ready


async def test_a_move_that_names_its_destination_is_placed_by_the_seal_itself(
    cluster: DataCluster,
) -> None:
    """``unload --to``: the old owner's seal writes the sealed state and the new owner's
    assignment in one transaction (no round through the leader, no ready marker); every
    acknowledged send is read from the new owner, offsets continue."""
    await cluster.start_broker("b2")
    await cluster.start_broker("b3")
    topic = "/default/direct"
    client = await new_client(cluster.brokers["b1"].url)
    producer = await reliable_producer(client, topic)
    consumer = await exclusive_consumer(client, topic)  # before the traffic, read after
    for i in range(3):
        await producer.send(f"m{i}".encode())
    source = await cluster.wait_served(topic)
    target = next(b for b in ("b2", "b3") if b != source.broker_id)
    start = (await cluster.store.get_prefix(keys.unassigned(topic))).revision + 1
    await AdminClient(cluster.store).unload_topic(topic, to_broker=target)
    moved = await cluster.wait_moved(topic, source)
    assert moved.broker_id == target
    sealed_at, assigned_at, made_ready = await _revisions_of_the_handoff(
        cluster.store, topic, start, target
    )
    assert sealed_at is not None and sealed_at == assigned_at
    assert not made_ready
    counted = source.process.metrics.registry.get_sample_value(
        "ballast_topic_assignments_total", {"broker_id": target, "action": "assign"}
    )
    assert counted == 1  # counted by the source (the leader did not place it)
    await producer.send(b"m3")
    got = await receive_and_ack(consumer, await consumer.receive(), 4)
    assert [m.msg_id.topic_offset for m in got] == [0, 1, 2, 3]
    await consumer.close()
    await producer.close()


async def test_a_destination_gone_before_the_seal_leaves_the_placement_to_the_leader(
    cluster: DataCluster,
) -> None:
    """The move names a broker that is not registered when the seal is written: the seal
    is written alone, the marker made ready, and the leader places the topic elsewhere."""
    await cluster.start_broker("b2")
    topic = "/default/direct-gone"
    client = await new_client(cluster.brokers["b1"].url)
    producer = await reliable_producer(client, topic)
    consumer = await exclusive_consumer(client, topic)  # before the traffic, read after
    await producer.send(b"m0")
    source = await cluster.wait_served(topic)
    view = await AdminClient(cluster.store).view()
    owner = source.broker_id
    marker = UnassignedMarker(
        MarkerReason.UNLOAD, from_broker=owner, to_broker="gone", timestamp=0.0, ready=False
    )
    key = keys.broker_assignment(owner, topic)
    result = await cluster.store.txn(
        [Compare.mod_revision_equals(key, view.owners[topic][owner])],
        [*release_ops(owner, topic), Put(keys.unassigned(topic), marker.to_dict())],
    )
    assert result.succeeded
    moved = await cluster.wait_moved(topic, source)
    assert moved.broker_id != "gone"
    await producer.send(b"m1")
    got = await receive_and_ack(consumer, await consumer.receive(), 2)
    assert [m.payload for m in got] == [b"m0", b"m1"]
    await consumer.close()
    await producer.close()


async def test_a_broker_stopped_while_a_topic_seals_finishes_the_seal(
    etcd_store: EtcdStore, tmp_path: Path
) -> None:
    """A graceful stop during a move's seal (the upload stalled) waits for it: the next
    owner continues from the seal, not after the stopped owner's whole reservation."""
    config = data_config(tmp_path)
    objects = GatedObjects.of(config)
    async with DataCluster(etcd_store, config, objects) as c:
        h1 = await c.start_broker("h1")
        await c.start_broker("h2")
        topic = "/default/stop-seal"
        client = await new_client(h1.url)
        producer = await reliable_producer(client, topic)
        source = await c.wait_served(topic)
        for i in range(3):
            await producer.send(f"m{i}".encode())
        objects.gate.clear()  # the next upload stalls: the seal waits for it
        pending = asyncio.create_task(producer.send(b"m3"))
        storage = source.host.topics[topic].storage  # type: ignore[attr-defined]
        await until(lambda: storage.next_offset == 4, 10, "m3 in the WAL")
        await AdminClient(c.store).unload_topic(topic)
        await until(lambda: topic not in source.host.topics, 10, "the seal to start")
        stopping = asyncio.create_task(c.stop_broker(source.broker_id))
        await asyncio.sleep(0.3)
        assert not stopping.done()  # waiting for the seal
        objects.gate.set()
        await asyncio.wait_for(stopping, 20)
        target = await c.wait_served(topic)
        opened = target.host.topics[topic].storage.opened  # type: ignore[attr-defined]
        assert (opened.next_offset, opened.source.value) == (4, "sealed")
        await asyncio.wait_for(pending, 20)
        await producer.close()


async def test_acks_above_the_oldest_unacked_survive_a_move(cluster: DataCluster) -> None:
    """Shared subscription, acks out of order (all but offset 2): the new owner delivers
    again only 2 (before the acks above the cursor were persisted: 2, 3, 4 and 5)."""
    await cluster.start_broker("b2")
    client = await new_client(cluster.brokers["b1"].url)
    producer = await reliable_producer(client, "/default/acks")
    consumer = (
        client.new_consumer()
        .with_topic("/default/acks")
        .with_consumer_name("c1")
        .with_subscription("s1")
        .with_subscription_type(SubType.SHARED)
        .build()
    )
    await consumer.subscribe()
    queue = await consumer.receive()
    for i in range(6):
        await producer.send(f"m{i}".encode())
    first = [await asyncio.wait_for(queue.get(), 10) for _ in range(6)]
    assert [m.msg_id.topic_offset for m in first] == list(range(6))
    for m in first:
        if m.msg_id.topic_offset != 2:
            await consumer.ack(m)
    source = cluster.owner("/default/acks")
    assert source is not None
    assert handovers(source, "seal")[0] == 0
    await AdminClient(cluster.store).unload_topic("/default/acks")
    target = await cluster.wait_moved("/default/acks", source)  # m6 is then the new owner's
    # Each broker's part of the move is on its metrics (one seal here, one open there).
    sealed, sealing = handovers(source, "seal")
    assert sealed == 1 and 0 < sealing < 10
    assert handovers(target, "open")[0] == 1 and handovers(target, "seal")[0] == 0
    await producer.send(b"m6")
    after: list[Any] = []
    while not after or after[-1].msg_id.topic_offset != 6:
        after.append(await asyncio.wait_for(queue.get(), 20))
        await consumer.ack(after[-1])
    assert [m.msg_id.topic_offset for m in after] == [2, 6]
    await asyncio.sleep(0.5)
    assert queue.empty()
    await consumer.close()
    await producer.close()


class KeyedWorker:
    """A KeyShared consumer that works on one message at a time (`work` seconds each),
    logs (key, offset) into a log shared with the other workers, then acks."""

    def __init__(self, consumer: Any, log: list[tuple[str, int]], work: float) -> None:
        self.consumer = consumer
        self.log = log
        self.work = work
        self.done = 0
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls, client: Any, topic: str, name: str, log: list[tuple[str, int]], work: float
    ) -> KeyedWorker:
        consumer = (
            client.new_consumer()
            .with_topic(topic)
            .with_consumer_name(name)
            .with_subscription("ks")
            .with_subscription_type(SubType.KEY_SHARED)
            .build()
        )
        await consumer.subscribe()
        worker = cls(consumer, log, work)
        worker.task = asyncio.create_task(worker._run(await consumer.receive()))
        return worker

    async def _run(self, queue: asyncio.Queue[Any]) -> None:
        while not self.stop.is_set():
            try:
                message = await asyncio.wait_for(queue.get(), 0.2)
            except TimeoutError:
                continue
            await asyncio.sleep(self.work)
            self.log.append((message.routing_key, message.msg_id.topic_offset))
            await self.consumer.ack(message)
            self.done += 1

    async def close(self) -> None:
        self.stop.set()
        assert self.task is not None
        await self.task
        await self.consumer.close()


async def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    async def done() -> bool:
        return check()

    await wait_until(done, timeout, what)


def per_key_order_breaks(log: list[tuple[str, int]]) -> list[str]:
    """Where a key's message was worked on after a newer one of the same key."""
    newest: dict[str, int] = {}
    breaks = []
    for key, offset in log:
        if offset < newest.get(key, -1):
            breaks.append(f"{key}: {offset} after {newest[key]}")
        newest[key] = max(offset, newest.get(key, -1))
    return breaks


async def send_keyed(producer: Any, count: int, keys: int = 6) -> None:
    for i in range(count):
        await producer.send_with_key(f"m{i}".encode(), None, f"key-{i % keys}")


async def test_key_shared_keeps_per_key_order_as_consumers_join_and_leave(
    cluster: DataCluster,
) -> None:
    """A slow consumer with a backlog of every key; a second one joins mid-stream, the
    first leaves later: each key's messages are worked on in order, each exactly once
    (before, keys were re-mapped by hash % consumers while the first still held them)."""
    client = await new_client(cluster.brokers["b1"].url)
    producer = await reliable_producer(client, "/default/ks")
    log: list[tuple[str, int]] = []
    first = await KeyedWorker.start(client, "/default/ks", "c1", log, 0.01)
    await send_keyed(producer, 60)
    await until(lambda: first.done >= 10, 10, "c1 to work on 10 messages")
    second = await KeyedWorker.start(client, "/default/ks", "c2", log, 0.01)
    await send_keyed(producer, 60)
    await until(lambda: second.done >= 10, 10, "c2 to take over some keys")
    await first.close()  # leaves with unacked messages of its keys
    await until(lambda: len(log) >= 120, 20, "every message worked on")
    await second.close()
    assert per_key_order_breaks(log) == []
    assert sorted(offset for _, offset in log) == list(range(120))  # each exactly once
    await producer.close()


async def test_key_shared_keeps_per_key_order_across_a_move(cluster: DataCluster) -> None:
    """Two KeyShared consumers working while the topic moves: the new owner resumes
    from the cursor and the acks above it, and delivers a key's unacked messages before
    its newer ones, so no message is worked on before an older one of its key. (What the
    client had prefetched and not acked when the topic moved comes again: at-least-once;
    such a repeat may follow newer messages the client already had.)"""
    await cluster.start_broker("b2")
    client = await new_client(cluster.brokers["b1"].url)
    producer = await reliable_producer(client, "/default/ksm")
    log: list[tuple[str, int]] = []
    workers = [
        await KeyedWorker.start(client, "/default/ksm", name, log, 0.01) for name in ("c1", "c2")
    ]
    await send_keyed(producer, 60)
    await until(lambda: len(log) >= 20, 10, "20 messages worked on")
    source = cluster.owner("/default/ksm")
    await AdminClient(cluster.store).unload_topic("/default/ksm")
    await send_keyed(producer, 40)
    await until(lambda: {o for _, o in log} >= set(range(100)), 30, "every message worked on")
    assert source is not None
    await cluster.wait_moved("/default/ksm", source)
    for worker in workers:
        await worker.close()
    first_times = list(dict.fromkeys(log))
    assert per_key_order_breaks(first_times) == []
    await producer.close()
