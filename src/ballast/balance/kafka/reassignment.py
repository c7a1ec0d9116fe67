"""The `kafka-reassign-partitions` JSON format and the brokers file, as values (no I/O).

Reassignment files look like
`{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2],
"log_dirs": ["any", "any"]}]}`; `log_dirs` is optional on input and written as "any"
for a broker that did not hold the partition before, so the output feeds
`kafka-reassign-partitions --execute` directly. The brokers file is
`{"brokers": [{"id": 1, "rack": "r1"}, …]}` (or just the list; `rack` optional).

Every error names the file, the topic-partition and the offending value, in the spirit of
Kafka's own messages ("duplicate replicas", "larger than available brokers").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeGuard

from ballast.balance.kafka.replicas import (
    KafkaBroker,
    PartitionAssignment,
    PartitionChange,
    ReplicaInputError,
)

ANY_LOG_DIR = "any"


def _load(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ReplicaInputError(
            f"{source}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None


def _is_id(value: object) -> TypeGuard[int]:
    """A JSON integer ≥ 0 (JSON true/false are not numbers, whatever Python says)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_assignment(text: str, source: str = "assignment") -> list[PartitionAssignment]:
    """Partitions of a reassignment-format document, checked one by one."""
    doc = _load(text, source)
    if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), list):
        raise ReplicaInputError(
            f'{source}: expected {{"version": 1, "partitions": [...]}}, got '
            f"{type(doc).__name__}{' without a partitions list' if isinstance(doc, dict) else ''}"
        )
    version = doc.get("version", 1)
    if version != 1:
        raise ReplicaInputError(f"{source}: unsupported version {version!r} (expected 1)")
    out: list[PartitionAssignment] = []
    seen: set[tuple[str, int]] = set()
    for i, entry in enumerate(doc["partitions"]):
        where = f"{source}: partitions[{i}]"
        if not isinstance(entry, dict):
            raise ReplicaInputError(f"{where}: expected an object, got {entry!r}")
        topic, partition = entry.get("topic"), entry.get("partition")
        if not isinstance(topic, str) or not topic:
            raise ReplicaInputError(f"{where}: topic must be a non-empty string, got {topic!r}")
        if not _is_id(partition):
            raise ReplicaInputError(
                f"{where} (topic {topic}): partition must be an integer ≥ 0, got {partition!r}"
            )
        name = f"{topic}-{partition}"
        replicas = entry.get("replicas")
        if not isinstance(replicas, list) or not replicas or not all(_is_id(b) for b in replicas):
            raise ReplicaInputError(
                f"{source}: partition {name}: replicas must be a non-empty list of broker ids "
                f"(integers ≥ 0), got {replicas!r}"
            )
        if len(set(replicas)) != len(replicas):
            raise ReplicaInputError(
                f"{source}: partition {name}: duplicate replicas {replicas} (a broker holds "
                "a partition at most once)"
            )
        if (topic, partition) in seen:
            raise ReplicaInputError(f"{source}: partition {name} is listed twice")
        seen.add((topic, partition))
        log_dirs = entry.get("log_dirs")
        if log_dirs is not None and (
            not isinstance(log_dirs, list)
            or len(log_dirs) != len(replicas)
            or not all(isinstance(d, str) for d in log_dirs)
        ):
            raise ReplicaInputError(
                f"{source}: partition {name}: log_dirs must list one string per replica "
                f"({len(replicas)}), got {log_dirs!r}"
            )
        out.append(
            PartitionAssignment(
                topic, partition, tuple(replicas), tuple(log_dirs) if log_dirs else None
            )
        )
    return out


def parse_brokers(text: str, source: str = "brokers") -> list[KafkaBroker]:
    """`{"brokers": [{"id": 1, "rack": "r1"}, …]}`, the bare list, or a list of ids."""
    doc = _load(text, source)
    items = doc.get("brokers") if isinstance(doc, dict) else doc
    if not isinstance(items, list) or not items:
        raise ReplicaInputError(
            f'{source}: expected {{"brokers": [{{"id": 1, "rack": "r1"}}, ...]}} with at least '
            "one broker"
        )
    out = []
    for i, item in enumerate(items):
        where = f"{source}: brokers[{i}]"
        if _is_id(item):
            item = {"id": item}
        if not isinstance(item, dict):
            raise ReplicaInputError(f'{where}: expected {{"id": …, "rack": …}}, got {item!r}')
        broker_id, rack = item.get("id"), item.get("rack")
        if not _is_id(broker_id):
            raise ReplicaInputError(f"{where}: id must be an integer ≥ 0, got {broker_id!r}")
        if rack is not None and (not isinstance(rack, str) or not rack):
            raise ReplicaInputError(
                f"{where}: rack of broker {broker_id} must be a non-empty string or null, "
                f"got {rack!r}"
            )
        out.append(KafkaBroker(broker_id, rack))
    return out


def parse_broker_ids(text: str | None, option: str) -> list[int]:
    """A comma-separated id list as given to --add / --remove. An id given twice is an
    error naming it (Kafka's `--broker-list`: "Broker list contains duplicate entries")."""
    if not text:
        return []
    ids = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ReplicaInputError(f"{option} {text!r}: {part!r} is not a broker id")
        ids.append(int(part))
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ReplicaInputError(
            f"{option} {text!r}: broker list contains duplicate entries: "
            f"{','.join(map(str, twice))}"
        )
    return ids


def _entry(topic: str, partition: int, replicas: Sequence[int], dirs: Sequence[str]) -> dict:
    return {
        "topic": topic,
        "partition": partition,
        "replicas": list(replicas),
        "log_dirs": list(dirs),
    }


def reassignment_document(
    changes: Iterable[PartitionChange],
    log_dirs: Mapping[tuple[str, int], tuple[str, ...] | None] | None = None,
) -> dict[str, object]:
    """The proposed assignment of the changed partitions, ready for `--execute`.

    A broker that keeps a partition keeps its log dir; a new one gets "any".
    """
    log_dirs = log_dirs or {}
    partitions = []
    for ch in changes:
        old = log_dirs.get((ch.topic, ch.partition))
        kept = dict(zip(ch.before, old, strict=True)) if old else {}
        dirs = [kept.get(b, ANY_LOG_DIR) for b in ch.after]
        partitions.append(_entry(ch.topic, ch.partition, ch.after, dirs))
    return {"version": 1, "partitions": partitions}


def rollback_document(
    changes: Iterable[PartitionChange],
    log_dirs: Mapping[tuple[str, int], tuple[str, ...] | None] | None = None,
) -> dict[str, object]:
    """The current assignment of the partitions the plan changes: applying it undoes it."""
    log_dirs = log_dirs or {}
    partitions = []
    for ch in changes:
        dirs = log_dirs.get((ch.topic, ch.partition)) or (ANY_LOG_DIR,) * len(ch.before)
        partitions.append(_entry(ch.topic, ch.partition, ch.before, dirs))
    return {"version": 1, "partitions": partitions}


def dumps(document: Mapping[str, object]) -> str:
    """Compact JSON with one partition per line: diff-able and quick to write."""
    parts = document.get("partitions")
    if not isinstance(parts, list):
        return json.dumps(document)
    body = ",\n".join("  " + json.dumps(p, separators=(",", ":")) for p in parts)
    return '{"version":1,"partitions":[\n' + body + ("\n" if parts else "") + "]}\n"
