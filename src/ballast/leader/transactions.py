"""Intents into transactions: the compares each write carries and its operations.

One place builds every write of the leader, and one chunker splits the many-topic intents
so that no transaction exceeds etcd's limits. The shell adds the term's fence to the
compares of each; every `Txn` carries the part of the intent it writes, which is what the
machine books when the outcome comes back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from ballast.leader.intents import (
    Drain,
    Drained,
    DropMarker,
    Failover,
    Force,
    Intent,
    MoveTopics,
    Place,
    Placement,
    RecordOwner,
    Release,
    Relocation,
    RemoveOwner,
    Repair,
    SplitBundles,
    Unload,
    UnloadSplit,
)
from ballast.metadata import Compare, Delete, Put, keys
from ballast.metadata.records import assignment_value, claim_ops, owner_value, release_ops
from ballast.model import (
    Assignment,
    BrokerId,
    BrokerMode,
    BrokerState,
    MarkerReason,
    UnassignedMarker,
)

# etcd refuses a transaction with more than 128 compares, or 128 operations in a branch
# (its default --max-txn-ops). Per topic: failover 1 compare (+1 per distinct target) and
# 3 puts/deletes; drain and moves 1 compare and 3 ops; placement 3 compares (+1 per
# distinct target) and 3 ops. 40 / 25 topics keep every branch below the limit.
TOPICS_PER_TXN = 40
PLACEMENTS_PER_TXN = 25

T = TypeVar("T")


@dataclass(frozen=True)
class Txn:
    """One transaction to write, and the part of the intent it carries."""

    compares: tuple[Compare, ...]
    ops: tuple[Put | Delete, ...]
    what: str
    part: Intent


def chunked(items: Sequence[T], size: int) -> list[tuple[T, ...]]:
    """`items` in consecutive chunks of at most `size` (the one chunker)."""
    return [tuple(items[start : start + size]) for start in range(0, len(items), size)]


def _several(verb: str, topics: Sequence[str]) -> str:
    return f"{verb} {topics[0]}" + (f" (+{len(topics) - 1})" if len(topics) > 1 else "")


def transactions(intent: Intent) -> list[Txn]:
    """The transactions that write `intent`, in order."""
    match intent:
        case Failover():
            return [
                _failover(replace(intent, topics=c)) for c in chunked(intent.topics, TOPICS_PER_TXN)
            ]
        case Drain():
            return [
                _unload(replace(intent, unloads=c), c, f"drain of {intent.broker}")
                for c in chunked(intent.unloads, TOPICS_PER_TXN)
            ]
        case UnloadSplit():
            return [
                _unload(
                    replace(intent, unloads=c),
                    c,
                    _several("unload split bundle topics", [u.topic for u in c]),
                )
                for c in chunked(intent.unloads, TOPICS_PER_TXN)
            ]
        case Place():
            return [
                _place(replace(intent, placements=c))
                for c in chunked(intent.placements, PLACEMENTS_PER_TXN)
            ]
        case MoveTopics():
            return [
                _move(
                    replace(
                        intent, relocations=c, explanation=intent.explanation if i == 0 else None
                    )
                )
                for i, c in enumerate(chunked(intent.relocations, PLACEMENTS_PER_TXN))
            ]
        case _:
            return [_single(intent)]


def _single(intent: Intent) -> Txn:
    match intent:
        case Repair(key=key, guard=guard, op=op):
            return Txn((guard,), (op,), f"repair {key}", intent)
        case Release(topic=topic, revision=revision, marker=marker):
            key = keys.unassigned(topic)
            compares = [Compare.mod_revision_equals(key, revision)]
            if marker.from_broker is not None:
                compares.append(Compare.absent(keys.register(marker.from_broker)))
            ready = replace(marker, ready=True)
            return Txn(tuple(compares), (Put(key, ready.to_dict()),), f"release {topic}", intent)
        case Force(topic=topic, revision=revision, marker=marker, why=why):
            key = keys.unassigned(topic)
            forced = replace(marker, ready=True, forced=why)
            return Txn(
                (Compare.mod_revision_equals(key, revision),),
                (Put(key, forced.to_dict()),),
                f"force {topic}",
                intent,
            )
        case Drained(broker=broker, state_revision=revision):
            key = keys.broker_state(broker)
            drained = BrokerState(BrokerMode.DRAINED, "drained: every topic moved away")
            return Txn(
                (Compare.mod_revision_equals(key, revision),),
                (Put(key, drained.to_dict()),),
                f"drained {broker}",
                intent,
            )
        case RecordOwner(topic=topic, broker=broker, assignment_revision=revision):
            return Txn(
                (
                    Compare.absent(keys.topic_owner(topic)),
                    Compare.mod_revision_equals(keys.broker_assignment(broker, topic), revision),
                ),
                (Put(keys.topic_owner(topic), owner_value(broker)),),
                f"record the owner of {topic}",
                intent,
            )
        case RemoveOwner(topic=topic, broker=broker, record_revision=revision):
            return Txn(
                (
                    Compare.mod_revision_equals(keys.topic_owner(topic), revision),
                    Compare.absent(keys.broker_assignment(broker, topic)),
                ),
                (Delete(keys.topic_owner(topic)),),
                f"remove the stale owner record of {topic}",
                intent,
            )
        case SplitBundles(namespace=ns, revision=revision, layout=layout):
            key = keys.namespace_bundles(ns)
            guard = Compare.mod_revision_equals(key, revision) if revision else Compare.absent(key)
            return Txn((guard,), (Put(key, layout.to_dict()),), f"split bundles of {ns}", intent)
        case DropMarker(topic=topic, revision=revision, compares=compares):
            key = keys.unassigned(topic)
            return Txn(
                (Compare.mod_revision_equals(key, revision), *compares),
                (Delete(key),),
                f"drop {key}",
                intent,
            )
    raise TypeError(f"not a single-write intent: {intent!r}")


def _failover(part: Failover) -> Txn:
    dead, now = part.dead, part.now
    compares = [Compare.absent(keys.register(dead))]
    targets: set[BrokerId] = set()
    ops: list[Put | Delete] = []
    for r in part.topics:
        marker = UnassignedMarker(
            MarkerReason.FAILOVER, from_broker=dead, to_broker=r.target, timestamp=now, ready=True
        )
        assignment = keys.broker_assignment(dead, r.topic)
        compares.append(Compare.mod_revision_equals(assignment, r.revision))
        ops.append(Delete(assignment))
        if r.target is None:
            # No survivor can take it: a marker waits for one.
            ops += [
                Delete(keys.topic_owner(r.topic)),
                Put(keys.unassigned(r.topic), marker.to_dict()),
            ]
        else:
            value = assignment_value(Assignment(now, epoch=r.revision), marker)
            ops += claim_ops(r.target, r.topic, value)
            targets.add(r.target)
    compares += [Compare.present(keys.register(t)) for t in sorted(targets)]
    return Txn(tuple(compares), tuple(ops), f"failover of {dead}", part)


def _unload(part: Drain | UnloadSplit, unloads: Sequence[Unload], what: str) -> Txn:
    compares = tuple(
        Compare.mod_revision_equals(keys.broker_assignment(u.broker, u.topic), u.revision)
        for u in unloads
    )
    ops: list[Put | Delete] = []
    for u in unloads:
        ops += [*release_ops(u.broker, u.topic), Put(keys.unassigned(u.topic), u.marker.to_dict())]
    return Txn(compares, tuple(ops), what, part)


def placement_write(p: Placement, now: float) -> tuple[list[Compare], list[Put | Delete]]:
    """One marker placed on its target: the assignment and the ownership record written,
    the marker deleted, if the marker is as read, the topic exists and nobody owns it.
    The leader's placement, and a source's seal handing a move to the broker it names
    (`BrokerMachine.handoff`); the target's registration is compared by the caller (once
    per transaction)."""
    marker_key = keys.unassigned(p.topic)
    compares = [
        Compare.mod_revision_equals(marker_key, p.revision),
        Compare.present(keys.topic_meta(p.topic)),
        # Never two owners: one compare, whatever the number of brokers.
        Compare.absent(keys.topic_owner(p.topic)),
    ]
    value = assignment_value(Assignment(now, epoch=p.revision), p.marker)
    return compares, [*claim_ops(p.target, p.topic, value), Delete(marker_key)]


def _place(part: Place) -> Txn:
    compares: list[Compare] = []
    ops: list[Put | Delete] = []
    for p in part.placements:
        guards, writes = placement_write(p, part.now)
        compares += guards
        ops += writes
    targets = sorted({p.target for p in part.placements})
    compares += [Compare.present(keys.register(b)) for b in targets]
    what = _several("assign", [p.topic for p in part.placements])
    return Txn(tuple(compares), tuple(ops), what, part)


def move_write(r: Relocation, now: float) -> tuple[Compare, list[Put | Delete]]:
    """Phase 1 of a move, the leader's and the admin's alike: the source's assignment
    (compared on the revision read) and ownership record released, a rebalance marker
    {from, to, ready: false} and the history record written at the key that names this
    release (`keys.rebalancing_history`: two writers never collide)."""
    move = r.move
    marker = UnassignedMarker(
        MarkerReason.REBALANCE,
        from_broker=move.from_broker,
        to_broker=move.to_broker,
        timestamp=now,
        ready=False,
    )
    guard = Compare.mod_revision_equals(
        keys.broker_assignment(move.from_broker, move.topic), r.revision
    )
    ops = [
        *release_ops(move.from_broker, move.topic),
        Put(keys.unassigned(move.topic), marker.to_dict()),
        Put(keys.rebalancing_history(now, move.topic, r.revision), move.to_dict()),
    ]
    return guard, ops


def _move(part: MoveTopics) -> Txn:
    compares: list[Compare] = []
    ops: list[Put | Delete] = []
    for r in part.relocations:
        guard, writes = move_write(r, part.now)
        compares.append(guard)
        ops += writes
    what = _several("move", [r.move.topic for r in part.relocations])
    return Txn(tuple(compares), tuple(ops), what, part)
