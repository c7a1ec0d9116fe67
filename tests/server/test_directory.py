"""`Directory`: who owns a topic (its ownership record, a registered broker) and which
topics are a partitioned topic's partitions, read from a real in-memory store."""

from __future__ import annotations

from ballast.clock import FakeClock
from ballast.metadata import MemoryStore, Put, keys
from ballast.metadata.directory import Directory, Owner
from ballast.metadata.records import Registration, claim_ops, release_ops
from ballast.model import TopicName

TOPIC = TopicName.parse("/default/t")


async def test_the_owner_is_the_registered_broker_of_the_ownership_record() -> None:
    store = MemoryStore()
    directory = Directory(store, FakeClock())
    assert await directory.owner(TOPIC) is None
    await store.put(keys.register("b1"), Registration("127.0.0.1:7001").to_dict())
    await store.put(keys.register("b2"), Registration("127.0.0.1:7002").to_dict())
    await store.txn([], claim_ops("b2", str(TOPIC), {"assigned_at": 1, "epoch": 1}))
    assert await directory.owner(TOPIC) == Owner("b2", "127.0.0.1:7002")
    # A dead owner keeps its record until the leader fails the topic over: no answer.
    await store.delete(keys.register("b2"))
    assert await directory.owner(TOPIC) is None
    await store.txn([], release_ops("b2", str(TOPIC)))
    assert await directory.owner(TOPIC) is None


async def test_an_undecodable_record_is_no_owner() -> None:
    store = MemoryStore()
    directory = Directory(store, FakeClock())
    await store.put(keys.register("b1"), {"broker_url": 7})
    await store.put(keys.topic_owner(TOPIC), {"broker_id": "b1"})
    assert await directory.owner(TOPIC) is None
    await store.put(keys.topic_owner(TOPIC), {"broker_id": "no such/broker"})
    assert await directory.owner(TOPIC) is None


async def test_partitions_are_read_from_topic_metadata_keys() -> None:
    store = MemoryStore()
    directory = Directory(store, FakeClock())
    base = TopicName.parse("/default/orders")
    assert await directory.partitions(base) == []
    for index in (1, 0, 10):
        await store.put(keys.topic_meta(f"/default/orders-part-{index}"), {"created_at": 1})
    await store.txn(
        [],
        [
            Put(keys.topic_meta("/default/other-part-0"), {"created_at": 1}),
            Put(keys.subscription_cursor("/default/orders-part-2", "s"), {"offset": 0}),
        ],
    )
    assert await directory.partitions(base) == [
        "/default/orders-part-0",
        "/default/orders-part-1",
        "/default/orders-part-10",
    ]
    await store.put(keys.topic_meta(base), {"created_at": 1})
    assert await directory.partitions(base) == ["/default/orders"]
