"""`leader.transactions`: every intent's writes fit etcd's limits, and etcd takes them.

The worst case of each many-topic intent (every topic to a different broker, so the
per-target registration compares are as many as they can be) is chunked, each chunk is
checked against etcd's default limits (128 compares, 128 operations, 1.5 MiB), and then
written to a real etcd whose keys make every compare hold: a transaction etcd refused
would raise, one whose compares failed would not succeed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from ballast.balance.pulsar.bundles import NamespaceBundles
from ballast.leader.intents import (
    Drain,
    Failover,
    Intent,
    MoveTopics,
    Place,
    Placement,
    Reassign,
    Relocation,
    SplitBundles,
    Unload,
    UnloadSplit,
)
from ballast.leader.transactions import Txn, chunked, move_write, transactions
from ballast.metadata import Compare, Delete, Put, keys
from ballast.metadata.etcd import EtcdStore
from ballast.metadata.records import Registration, TopicMeta, assignment_value, claim_ops
from ballast.model import (
    Assignment,
    ClusterSnapshot,
    MarkerReason,
    Move,
    TopicName,
    UnassignedMarker,
)
from tests.etcd_fixtures import EtcdServer, etcd_server

__all__ = ["etcd_server"]

MAX_OPS = 128
MAX_REQUEST_BYTES = int(1.5 * 1024 * 1024)
TOPICS = 130  # more than any chunk size: every intent needs several transactions
NOW = 1_700_000_000.0


def topic(i: int) -> str:
    return f"/txn/t{i:03d}"


def broker(i: int) -> str:
    return f"b{i:03d}"


def intents(revisions: dict[str, int]) -> dict[str, Intent]:
    """The worst case of every many-topic intent over `TOPICS` topics owned by b000, with
    the assignment revisions as stored (`revisions`: assignment key -> mod revision)."""

    def rev(t: str) -> int:
        return revisions[keys.broker_assignment(broker(0), t)]

    unload = UnassignedMarker(MarkerReason.UNLOAD, from_broker=broker(0), ready=False)
    moves = [Move(topic(i), broker(0), broker(i + 1), timestamp=NOW) for i in range(TOPICS)]
    unloads = tuple(Unload(topic(i), broker(0), rev(topic(i)), unload) for i in range(TOPICS))
    return {
        "failover": Failover(
            broker(0),
            tuple(Reassign(topic(i), rev(topic(i)), broker(i + 1)) for i in range(TOPICS)),
            NOW,
        ),
        "drain": Drain(broker(0), unloads),
        "split-unload": UnloadSplit(unloads),
        "move": MoveTopics(
            tuple(Relocation(m, rev(m.topic)) for m in moves),
            ClusterSnapshot(()),
            "why",
            NOW,
        ),
    }


def check_limits(txn: Txn) -> None:
    assert len(txn.compares) <= MAX_OPS, txn.what
    assert len(txn.ops) <= MAX_OPS, txn.what
    size = sum(len(repr(x)) for x in (*txn.compares, *txn.ops))
    assert size < MAX_REQUEST_BYTES, txn.what


@pytest.fixture
async def etcd(etcd_server: EtcdServer) -> AsyncIterator[EtcdStore]:
    async with EtcdStore(etcd_server.client_url) as store:
        await wipe(store)
        yield store
        await wipe(store)


async def wipe(store: EtcdStore) -> None:
    for prefix in (keys.CLUSTER_PREFIX, keys.TOPICS_PREFIX):
        await store.delete_prefix(prefix)


async def seed(store: EtcdStore, *, dead: bool) -> dict[str, int]:
    """b000 owns every topic; b001.. are registered (b000 too unless `dead`)."""
    for i in range(TOPICS + 1):
        if i or not dead:
            await store.put(keys.register(broker(i)), Registration(f"{broker(i)}:6650").to_dict())
    revisions: dict[str, int] = {}
    for i in range(TOPICS):
        await store.put(keys.topic_meta(topic(i)), TopicMeta(NOW).to_dict())
        value = assignment_value(Assignment(NOW), None)
        for op in claim_ops(broker(0), topic(i), value):
            assert isinstance(op, Put)
            revisions[op.key] = await store.put(op.key, op.value)
    return revisions


async def write_all(store: EtcdStore, txns: Sequence[Txn]) -> None:
    for txn in txns:
        check_limits(txn)
        result = await store.txn(list(txn.compares), list(txn.ops))
        assert result.succeeded, txn.what


def test_the_chunker_keeps_order_and_bounds() -> None:
    assert chunked(list(range(7)), 3) == [(0, 1, 2), (3, 4, 5), (6,)]
    assert chunked([], 3) == []


def test_every_chunk_carries_its_own_part_of_the_intent() -> None:
    revisions = {keys.broker_assignment(broker(0), topic(i)): i + 1 for i in range(TOPICS)}
    for intent in intents(revisions).values():
        txns = transactions(intent)
        assert len(txns) > 1
        parts: list[Any] = [t.part for t in txns]
        assert all(type(p) is type(intent) for p in parts)
        # The parts together are the intent, in order, each topic once.
        field_name = {Failover: "topics", Drain: "unloads", UnloadSplit: "unloads"}.get(
            type(intent), "relocations"
        )
        joined = tuple(x for p in parts for x in getattr(p, field_name))
        assert joined == getattr(intent, field_name)
        for txn in txns:
            check_limits(txn)
    moves = transactions(intents(revisions)["move"])
    # The decision's explanation is noted once, with the first transaction.
    assert [t.part.explanation for t in moves] == ["why"] + [None] * (len(moves) - 1)


@pytest.mark.parametrize("kind", ["failover", "drain", "split-unload", "move"])
async def test_the_worst_case_of_each_intent_is_accepted_by_etcd(
    etcd: EtcdStore, kind: str
) -> None:
    revisions = await seed(etcd, dead=kind == "failover")
    await write_all(etcd, transactions(intents(revisions)[kind]))
    owners = await etcd.get_prefix(keys.BROKERS_PREFIX + broker(0) + "/")
    assert [kv.key for kv in owners.items if not kv.key.endswith("/state")] == []


async def test_placements_to_every_broker_are_accepted_by_etcd(etcd: EtcdStore) -> None:
    for i in range(1, TOPICS + 1):
        await etcd.put(keys.register(broker(i)), Registration(f"{broker(i)}:6650").to_dict())
    placements = []
    for i in range(TOPICS):
        await etcd.put(keys.topic_meta(topic(i)), TopicMeta(NOW).to_dict())
        marker = UnassignedMarker(timestamp=NOW)
        revision = await etcd.put(keys.unassigned(topic(i)), marker.to_dict())
        placements.append(Placement(topic(i), broker(i + 1), revision, marker))
    await write_all(etcd, transactions(Place(tuple(placements), NOW)))
    owners = await etcd.get_prefix(keys.OWNERS_PREFIX)
    assert len(owners.items) == TOPICS
    assert (await etcd.get_prefix(keys.UNASSIGNED_PREFIX)).items == []


async def test_a_bundle_layout_is_written_once_and_guarded(etcd: EtcdStore) -> None:
    layout = NamespaceBundles.create("txn", 4)
    first = SplitBundles("txn", 0, layout, 3, (), ("why",))
    await write_all(etcd, transactions(first))
    # The same intent again (absent guard): the stored layout makes it fail, as it must.
    (again,) = transactions(first)
    assert not (await etcd.txn(list(again.compares), list(again.ops))).succeeded
    stored = await etcd.get(keys.namespace_bundles("txn"))
    assert stored is not None and NamespaceBundles.from_dict(stored.value) == layout
    assert Compare.absent(keys.namespace_bundles("txn")) in again.compares
    assert not any(isinstance(op, Delete) for op in again.ops)


def test_moves_in_the_same_millisecond_never_share_a_history_key() -> None:
    # Topics placed in one transaction share their assignment revision. The leader and the
    # admin each moving one of them in the same millisecond used to write the same key
    # (each numbered its moves from 0); a history key now names the release it records.
    writes = [
        move_write(Relocation(Move("/ns/a", "b1", "b2", timestamp=NOW), 5), NOW),
        move_write(Relocation(Move("/ns/b", "b1", "b3", "Admin", timestamp=NOW), 5), NOW),
        move_write(Relocation(Move("/ns/a", "b2", "b1", timestamp=NOW), 9), NOW),
    ]
    history = [op.key for _, ops in writes for op in ops if op.key.startswith(keys.HISTORY_PREFIX)]
    assert len(history) == len(set(history)) == 3
    assert [keys.parse_history_key(k)[1:] for k in history] == [
        (5, TopicName("ns", "a")),
        (5, TopicName("ns", "b")),
        (9, TopicName("ns", "a")),
    ]
