"""The control plane's record vocabulary: what kind of record a key holds, and the values
the shared model does not define. The leader's view, the gateway, the brokers' directory,
the admin and the simulator all classify and decode through here.

- `classify(key)`: the `RecordKind` of a key under ``/cluster/`` or ``/topics/``, with the
  broker and topic it names.
- `Registration`: the value at ``/cluster/register/{broker_id}``.
- `leader_value`: the value at ``/cluster/leader`` (written by the election; the simulator
  writes it for its leader too); `leader_fence`: the compare of a leadership term.
- `TopicMeta`: the value at ``/topics/{ns}/{topic}/meta``; a topic exists while it exists.
- The ownership record (``/cluster/owners/{ns}/{topic}``): `owner_value`, `parse_owner_value`.
- The assignment value: `Assignment` (model) plus the marker it consumed, so the new owner's
  `TopicHost.load` learns why it received the topic (a move, a failover, a new topic).
- Pulsar's failure domains and anti-affinity groups (`failure_domain_value`,
  `anti_affinity_value` and their parsers); bundle layouts have their own codec
  (`balance.pulsar.bundles`), checked against the key by `leader.view.decode_bundles`.

One error policy: a decoder raises (`KeyLayoutError` for a key, `ModelError` for a value,
both `ValueError`s naming what is wrong) and never guesses. The caller decides what a bad
record costs, and every running reader makes the same choice: it skips the record, counts
or logs it, and keeps going (the leader's view forgets what the key held and counts it as
rejected, the gateway and the directory treat it as absent, an admin listing leaves it
out). Only a command about that one record (splitting a namespace's unreadable bundles)
fails, naming the key.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ballast.metadata import keys
from ballast.metadata.store import Compare, Delete, Put
from ballast.model import (
    Assignment,
    BrokerId,
    ModelError,
    UnassignedMarker,
    validate_broker_id,
)


class RecordKind(StrEnum):
    REGISTRATION = "registration"
    STATE = "broker_state"
    ASSIGNMENT = "assignment"
    MARKER = "marker"
    OWNER = "owner"
    LOAD = "load_report"
    LEADER = "leader"
    LOAD_BALANCE = "load_balance"
    HISTORY = "history"
    TOPIC = "topic_meta"
    BUNDLES = "bundles"
    OTHER = "other"


@functools.lru_cache(maxsize=200_000)
def classify(key: str) -> tuple[RecordKind, BrokerId | None, str | None]:
    """(kind, broker, topic) of a key; raises a `ValueError` naming a key that starts like
    one of ours but does not fit its layout. Keys of no kind here are `OTHER` (failure
    domains and anti-affinity groups among them: their readers parse them)."""
    # Cached: the same keys come back on every event, and parsing validates names.
    if key.startswith(keys.REGISTER_PREFIX):
        return RecordKind.REGISTRATION, keys.parse_register_key(key), None
    if key.startswith(keys.BROKERS_PREFIX):
        if keys.is_broker_state_key(key):
            return RecordKind.STATE, keys.parse_broker_state_key(key), None
        broker, topic = keys.parse_assignment_key(key)
        return RecordKind.ASSIGNMENT, broker, str(topic)
    if key.startswith(keys.UNASSIGNED_PREFIX):
        return RecordKind.MARKER, None, str(keys.parse_unassigned_key(key))
    if key.startswith(keys.OWNERS_PREFIX):
        return RecordKind.OWNER, None, str(keys.parse_topic_owner_key(key))
    if key.startswith(keys.LOAD_PREFIX):
        return RecordKind.LOAD, keys.parse_load_key(key), None
    if key == keys.LEADER:
        return RecordKind.LEADER, None, None
    if key == keys.LOAD_BALANCE:
        return RecordKind.LOAD_BALANCE, None, None
    if key.startswith(keys.HISTORY_PREFIX):
        keys.parse_history_key(key)
        return RecordKind.HISTORY, None, None
    if key.startswith(keys.BUNDLES_PREFIX):
        keys.parse_bundles_key(key)
        return RecordKind.BUNDLES, None, None
    if keys.is_topic_meta_key(key):
        return RecordKind.TOPIC, None, str(keys.parse_topic_meta_key(key))
    return RecordKind.OTHER, None, None  # cursors, schemas and other per-topic data


def leader_value(broker_id: str, since: float) -> dict[str, Any]:
    """The value of the leader key."""
    return {"broker_id": broker_id, "since": since}


def leader_fence(term: int) -> Compare:
    """The compare every write of leadership term `term` (the leader key's create revision)
    carries: refused once another term has begun."""
    return Compare(keys.LEADER, "create_revision", "==", term)


@dataclass(frozen=True)
class Registration:
    """How to reach a broker; bound to its lease, so it vanishes when the broker dies."""

    broker_url: str
    admin_url: str = ""
    metrics_url: str = ""
    rack: str | None = None
    domain: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "broker_url": self.broker_url,
            "admin_url": self.admin_url,
            "metrics_url": self.metrics_url,
        }
        if self.rack is not None:
            data["rack"] = self.rack
        if self.domain is not None:
            data["domain"] = self.domain
        return data

    @classmethod
    def from_dict(cls, data: Any, ctx: str = "registration") -> Registration:
        if not isinstance(data, Mapping):
            raise ModelError(f"{ctx}: expected a JSON object, got {type(data).__name__}")
        values: dict[str, Any] = {}
        for name in ("broker_url", "admin_url", "metrics_url"):
            value = data.get(name, "")
            if not isinstance(value, str):
                raise ModelError(f"{ctx}.{name}: expected a string, got {value!r}")
            values[name] = value
        for name in ("rack", "domain"):
            value = data.get(name)
            if value is not None and not isinstance(value, str):
                raise ModelError(f"{ctx}.{name}: expected a string or null, got {value!r}")
            values[name] = value
        return cls(**values)


@dataclass(frozen=True)
class TopicMeta:
    """Topic metadata; `created_at` drives the minimum-age rule of rebalancing.

    Other components may store more fields under the same key; they are kept in `extra`.
    """

    created_at: float
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.extra, "created_at": self.created_at}

    @classmethod
    def from_dict(cls, data: Any, ctx: str = "topic_meta") -> TopicMeta:
        if not isinstance(data, Mapping):
            raise ModelError(f"{ctx}: expected a JSON object, got {type(data).__name__}")
        created = data.get("created_at", 0.0)
        if isinstance(created, bool) or not isinstance(created, int | float) or created < 0:
            raise ModelError(f"{ctx}.created_at: expected epoch seconds, got {created!r}")
        extra = {k: v for k, v in data.items() if k != "created_at"}
        return cls(float(created), extra)


def owner_value(broker_id: str) -> dict[str, Any]:
    """The value of a topic's ownership record (``keys.topic_owner``)."""
    return {"broker_id": broker_id}


def parse_owner_value(data: Any, ctx: str = "owner") -> str:
    """The broker id of an ownership record."""
    if not isinstance(data, Mapping):
        raise ModelError(f"{ctx}: expected a JSON object, got {type(data).__name__}")
    return validate_broker_id(data.get("broker_id"), f"{ctx}.broker_id")


def claim_ops(broker_id: str, topic: str, value: Mapping[str, Any]) -> list[Put | Delete]:
    """Writes that make `broker_id` the owner: its assignment key and the ownership record."""
    return [
        Put(keys.broker_assignment(broker_id, topic), dict(value)),
        Put(keys.topic_owner(topic), owner_value(broker_id)),
    ]


def release_ops(broker_id: str, topic: str) -> list[Put | Delete]:
    """Writes that take `topic` away from `broker_id` (assignment and ownership record)."""
    return [Delete(keys.broker_assignment(broker_id, topic)), Delete(keys.topic_owner(topic))]


def assignment_value(assignment: Assignment, marker: UnassignedMarker | None) -> dict[str, Any]:
    """The stored assignment: the model's fields plus the consumed marker (additive field)."""
    data = assignment.to_dict()
    if marker is not None:
        data["marker"] = marker.to_dict()
    return data


def parse_assignment_value(
    data: Any, ctx: str = "assignment"
) -> tuple[Assignment, UnassignedMarker | None]:
    """(assignment, consumed marker or None); Danube's null value is accepted."""
    assignment = Assignment.from_dict(data, ctx)
    raw = data.get("marker") if isinstance(data, Mapping) else None
    marker = None if raw is None else UnassignedMarker.from_dict(raw, f"{ctx}.marker")
    return assignment, marker


def failure_domain_value(brokers: Iterable[BrokerId]) -> dict[str, Any]:
    """The value of a failure-domain record (``keys.failure_domain``)."""
    return {"brokers": sorted(brokers)}


def anti_affinity_value(group: str) -> dict[str, Any]:
    """The value of a namespace's anti-affinity record (``keys.anti_affinity_group``)."""
    return {"group": group}


def parse_failure_domain_value(data: Any, ctx: str = "failure_domain") -> tuple[BrokerId, ...]:
    """The brokers of a failure-domain record ``{brokers: [...]}``, sorted."""
    brokers = _object(data, ctx).get("brokers")
    if not isinstance(brokers, list):
        raise ModelError(f"{ctx}.brokers: expected a list, got {brokers!r}")
    return tuple(sorted(validate_broker_id(b, f"{ctx}.brokers") for b in brokers))


def parse_anti_affinity_value(data: Any, ctx: str = "anti_affinity") -> str | None:
    """The group of an anti-affinity record ``{group}`` (None: no group)."""
    group = _object(data, ctx).get("group")
    if group is not None and (not isinstance(group, str) or not group):
        raise ModelError(f"{ctx}.group: expected a name, got {group!r}")
    return group


def _object(data: Any, ctx: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ModelError(f"{ctx}: expected a JSON object, got {type(data).__name__}")
    return data
