"""Values the control plane stores that the shared model does not define.

- `Registration`: the value at ``/cluster/register/{broker_id}``.
- `leader_value`: the value at ``/cluster/leader`` (written by the election; the simulator
  writes it for its leader too).
- `TopicMeta`: the value at ``/topics/{ns}/{topic}/meta``; a topic exists while it exists.
- The assignment value: `Assignment` (model) plus the marker it consumed, so the new owner's
  `TopicHost.load` learns why it received the topic (a move, a failover, a new topic).

Every decoder raises `ModelError` naming the field, like the model's codecs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ballast.metadata import Compare, Delete, Put, keys
from ballast.model import (
    Assignment,
    ModelError,
    TopicName,
    UnassignedMarker,
    validate_broker_id,
)


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


def parse_topic_meta_key(key: str) -> TopicName:
    """Topic of a ``/topics/{ns}/{topic}/meta`` key (the layout lives in `keys`)."""
    return keys.parse_topic_meta_key(key)


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
