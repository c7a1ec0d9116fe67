"""The gateway with real processes and the real client: lookups through the gateway, and
clients that survive the SIGKILL of the broker that owns their topic."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from ballast.metadata.etcd import EtcdStore
from ballast.wire.protocol import CONNECT, pb, pb_grpc
from tests.etcd_fixtures import EtcdServer
from tests.server.helpers import DispatchStrategy, SubType, new_client, wait_until
from tests.server.procs import Processes, write_config

pytestmark = pytest.mark.timeout(150)


class Traffic:
    """One producer and one consumer of the real client on a reliable topic."""

    def __init__(self, client: Any, topic: str) -> None:
        self.client = client
        self.topic = topic
        self.acked: dict[int, float] = {}  # seq -> when its send returned
        self.errors: list[str] = []
        self.received: list[tuple[int, int, float]] = []  # (seq, offset, when)
        self.stop = asyncio.Event()
        self.running = asyncio.Event()  # cleared: the consumer takes nothing from its queue
        self.running.set()
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        producer = (
            self.client.new_producer().with_topic(self.topic).with_name("p1")
            .with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
        )  # fmt: skip
        await producer.create()
        consumer = (
            self.client.new_consumer().with_topic(self.topic).with_consumer_name("c1")
            .with_subscription("s1").with_subscription_type(SubType.EXCLUSIVE).build()
        )  # fmt: skip
        await consumer.subscribe()
        queue = await consumer.receive()
        self.tasks = [
            asyncio.create_task(self._produce(producer)),
            asyncio.create_task(self._consume(consumer, queue)),
        ]

    async def _produce(self, producer: Any) -> None:
        seq = 0
        try:
            while not self.stop.is_set():
                try:
                    await producer.send(str(seq).encode())
                    self.acked[seq] = time.monotonic()
                except grpc.aio.AioRpcError as exc:
                    self.errors.append(f"{exc.code().name}: {exc.details()}")
                seq += 1
                await asyncio.sleep(0.005)
        finally:
            await producer.close()

    async def _consume(self, consumer: Any, queue: asyncio.Queue[Any]) -> None:
        try:
            while True:
                await self.running.wait()
                msg = await queue.get()
                self.received.append(
                    (int(msg.payload.decode()), msg.msg_id.topic_offset, time.monotonic())
                )
                try:
                    await consumer.ack(msg)
                except grpc.aio.AioRpcError as exc:  # in flight when a gateway died
                    self.errors.append(f"ack {exc.code().name}: {exc.details()}")
        finally:
            await consumer.close()

    async def close(self) -> None:
        self.stop.set()
        await asyncio.sleep(0.1)
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def missing(self) -> set[int]:
        return set(self.acked) - {seq for seq, _, _ in self.received}


async def test_lookups_through_gateways_name_the_owner_and_proxy(
    etcd_store: EtcdStore, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    procs = Processes(
        etcd_server.client_url, write_config(tmp_path / "c.yaml", tmp_path / "data"), etcd_store
    )
    try:
        url = await procs.start_broker("g1")
        gateway = await procs.start_gateway()
        client = await new_client(gateway)
        producer = client.new_producer().with_topic("/default/gw").with_name("p").build()
        await producer.create()
        await producer.send(b"x")
        # A second gateway side by side: a consumer there gets what went in through the first.
        other = await procs.start_gateway()
        assert other != gateway
        consumer = (
            (await new_client(other)).new_consumer().with_topic("/default/gw")
            .with_consumer_name("c").with_subscription("s").build()
        )  # fmt: skip
        await consumer.subscribe()
        queue = await consumer.receive()
        await producer.send(b"y")
        assert (await asyncio.wait_for(queue.get(), 15)).payload == b"y"
        await consumer.close()
        async with grpc.aio.insecure_channel(gateway) as channel:
            stub = pb_grpc.DiscoveryStub(channel)
            answer = await stub.TopicLookup(
                pb.TopicLookupRequest(request_id=7, topic="/default/gw")
            )
            assert answer.response_type == CONNECT
            assert (answer.connect_url, answer.broker_url, answer.proxy) == (gateway, url, True)
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await stub.TopicLookup(pb.TopicLookupRequest(request_id=8, topic="/default/none"))
            assert missing.value.code() is grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await stub.TopicLookup(pb.TopicLookupRequest(request_id=9, topic="nope"))
            assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await procs.close()


async def test_clients_survive_the_sigkill_of_the_owner_without_an_error(
    etcd_store: EtcdStore, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    # Nothing reaches the object store before the kill: the acknowledged messages live
    # only in the killed owner's WAL, which the next owner salvages.
    config = write_config(
        tmp_path / "c.yaml",
        tmp_path / "data",
        storage={"upload_interval_seconds": 60},
        data_plane={"unacked_window": 50},
    )
    procs = Processes(etcd_server.client_url, config, etcd_store)
    traffic: Traffic | None = None
    try:
        await procs.start_broker("k1")
        await procs.start_broker("k2")
        gateway = await procs.start_gateway()
        topic = "/default/survivor"
        traffic = Traffic(await new_client(gateway), topic)
        await traffic.start()
        t = traffic

        async def flowing() -> bool:
            return len(t.received) >= 20

        await wait_until(flowing, 30, "messages to flow through the gateway")
        # The consumer falls behind by more than its client-side queue holds (100), so
        # some acknowledged messages are only in the owner's WAL when it is killed.
        t.running.clear()
        backlog = len(t.acked)

        async def behind() -> bool:
            return len(t.acked) > backlog + 150

        await wait_until(behind, 30, "the consumer to fall behind")
        victim = await procs.owner(topic)
        assert victim in ("k1", "k2")
        await procs.kill(victim)
        t.running.set()

        async def reassigned() -> bool:
            return await procs.owner(topic) not in (None, victim)

        await wait_until(reassigned, 40, "the topic to get a new owner", interval=0.02)
        reassigned_at = time.monotonic()

        async def recovered() -> bool:
            return any(when > reassigned_at for _, _, when in t.received) and any(
                when > reassigned_at for when in t.acked.values()
            )

        await wait_until(recovered, 40, "producer and consumer to resume after the kill")
        # The gateway held the calls and carried both to the new owner: they flow as soon
        # as it serves the topic, with no client backoff (which took 2.3-2.8 s).
        flowing = max(
            min(when for _, _, when in t.received if when > reassigned_at),
            min(when for when in t.acked.values() if when > reassigned_at),
        )
        assert flowing - reassigned_at < 2.0, flowing - reassigned_at
        survivor = await procs.owner(topic)
        assert survivor is not None and survivor != victim
        await asyncio.sleep(1.0)
        t.stop.set()

        async def drained() -> bool:
            return not t.missing()

        await wait_until(drained, 30, f"every acknowledged message (missing {t.missing()})")
        assert t.errors == [], t.errors[:3]
        # No offset carries two different messages (the crashed owner's are never reused).
        by_offset: dict[int, int] = {}
        for seq, offset, _ in t.received:
            assert by_offset.setdefault(offset, seq) == seq, f"offset {offset} reused"
        first_seen = {}
        for seq, offset, _ in t.received:
            first_seen.setdefault(seq, offset)
        offsets = [first_seen[s] for s in sorted(first_seen)]
        assert offsets == sorted(offsets), "offsets follow the send order"
    finally:
        if traffic is not None:
            await traffic.close()
        await procs.close()
