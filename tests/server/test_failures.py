"""Failures are explicit: a seal that fails hands the topic over unsealed (and says so),
readers retry object-store errors, a topic whose WAL fails is released and served
elsewhere — and nothing acknowledged is lost on the way. Brokers in this process, a real
etcd, the real client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ballast.broker import topics as served_topics
from ballast.cluster import AdminClient
from ballast.metadata import keys
from ballast.storage import FsspecObjectStore
from tests.server.helpers import DataCluster, DispatchStrategy, SubType, new_client, wait_until
from tests.storage.helpers import FlakyObjectStore

pytestmark = pytest.mark.timeout(90)

TOPIC = "/default/failing"


async def producer_of(client: Any) -> Any:
    producer = (
        client.new_producer().with_topic(TOPIC).with_name("p1")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
    )  # fmt: skip
    await producer.create()
    return producer


async def audit_subscription(client: Any) -> Any:
    """A subscription created now and read later (its cursor starts at the next offset)."""
    consumer = (
        client.new_consumer().with_topic(TOPIC).with_consumer_name("auditor")
        .with_subscription("audit").with_subscription_type(SubType.EXCLUSIVE).build()
    )  # fmt: skip
    await consumer.subscribe()
    return consumer


async def read(consumer: Any, count: int) -> list[bytes]:
    queue = await consumer.receive()
    got = []
    for _ in range(count):
        msg = await asyncio.wait_for(queue.get(), 20)
        got.append(msg.payload)
        await consumer.ack(msg)
    return got


async def test_a_failed_seal_hands_over_unsealed_and_readers_retry_storage_errors(
    cluster: DataCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(served_topics, "SEAL_WAIT_SECONDS", 1.0)
    b1 = cluster.brokers["b1"]
    shared = b1.host.objects()
    failing = FlakyObjectStore(shared)
    b1.host._objects = failing  # b1's path to the object store is about to break
    client = await new_client(b1.url)
    producer = await producer_of(client)
    audit = await audit_subscription(client)
    await audit.close()
    await cluster.wait_served(TOPIC)
    sent = [f"m{i}".encode() for i in range(20)]
    for payload in sent:
        await producer.send(payload)  # acknowledged: committed to object storage
    b2 = await cluster.start_broker("b2")
    flaky_reads = FlakyObjectStore(FsspecObjectStore(shared.url), fail_gets=3)
    b2.host._objects = flaky_reads
    failing.fail_puts = 10**6  # b1 can no longer write: its seal cannot complete
    late = asyncio.ensure_future(producer.send(b"late"))  # in b1's WAL, not committed
    await asyncio.sleep(0.3)
    assert not late.done()
    await AdminClient(cluster.store).unload_topic(TOPIC)

    async def on_b2() -> bool:
        return cluster.owner(TOPIC) is b2

    await wait_until(on_b2, 30, f"{TOPIC} to move to b2")
    assignment = await cluster.store.get(keys.broker_assignment("b2", TOPIC))
    assert assignment is not None
    assert "not sealed" in assignment.value["marker"]["unsealed"]  # said, not hidden
    # b2 reads what b1 committed from object storage, through three failed reads.
    await asyncio.wait_for(late, 30)  # the client retried it on b2: acknowledged there
    audit = await audit_subscription(await new_client(b2.url))
    assert await read(audit, 21) == [*sent, b"late"]
    assert flaky_reads.failed == 3 and b2.host.stats.reader_retries >= 1
    retries = b2.host.counters.registry.get_sample_value("ballast_storage_reader_retries_total")
    assert retries == b2.host.stats.reader_retries  # counted in Prometheus
    await producer.close()


async def test_a_topic_whose_wal_fails_is_released_and_served_elsewhere(
    cluster: DataCluster,
) -> None:
    b1 = cluster.brokers["b1"]
    client = await new_client(b1.url)
    producer = await producer_of(client)
    audit = await audit_subscription(client)
    await audit.close()
    await cluster.wait_served(TOPIC)
    for i in range(5):
        await producer.send(f"m{i}".encode())
    b2 = await cluster.start_broker("b2")
    storage = b1.host.topics[TOPIC].storage  # type: ignore[attr-defined]

    async def broken_disk(data: bytes, sync: bool) -> None:
        raise OSError(5, "Input/output error")

    # The broker's one log fails: every topic of b1 is released (here, the one topic).
    assert storage._wal.log is b1.host.broker_log()
    b1.host.broker_log()._write = broken_disk  # type: ignore[method-assign]
    # The client gets UNAVAILABLE, looks up again and sends to the new owner.
    for i in range(5, 10):
        await asyncio.wait_for(producer.send(f"m{i}".encode()), 30)
    assert cluster.owner(TOPIC) is b2
    audit = await audit_subscription(await new_client(b2.url))
    got = await read(audit, 10)
    assert set(got) == {f"m{i}".encode() for i in range(10)}
    await producer.close()
