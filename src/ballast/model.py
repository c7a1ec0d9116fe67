"""Value types shared by every layer, with their JSON codecs.

Everything here is a frozen dataclass. `to_dict()` gives plain JSON-ready data and
`from_dict()` validates it: a malformed value raises `ModelError` naming the field, so a
bad record can be rejected (and counted) without losing the rest.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

BrokerId = str

# Name rules, written once as regular expressions that mean the same in Python's `re` and
# Java's `java.util.regex` (the pipeline's `rlike`). They match a *whole* name: Python uses
# `fullmatch`, Spark wraps them in `\A(?:…)\z` (`$` would accept a trailing newline).
NAME_PART_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}"
BROKER_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.\-:]{0,127}"
TOPIC_NAME_PATTERN = rf"/{NAME_PART_PATTERN}/{NAME_PART_PATTERN}"
_NAME_PART = re.compile(NAME_PART_PATTERN)
_BROKER_ID = re.compile(BROKER_ID_PATTERN)
_TOPIC_NAME = re.compile(TOPIC_NAME_PATTERN)


@dataclass(frozen=True)
class Ops:
    """The few non-arithmetic operations the shared rules need, for one engine.

    Rules (scores, CV, classification, normalisation, report totals) are written once as
    plain arithmetic plus these operations, and applied to Python floats (`PYTHON_OPS`),
    NumPy arrays (`ballast.balance.scoring.NUMPY_OPS`) or Spark columns (the pipeline's
    `SPARK_OPS`). `total` and `field` are only needed by `report_totals`.
    """

    where: Any  # where(condition, if_true, if_false)
    maximum: Any  # maximum(a, b)
    total: Any = None  # total(items, term, zero): zero + term(item_1) + term(item_2) + ...
    field: Any = None  # field(item, name): one field of one item


def _python_where(condition: Any, if_true: Any, if_false: Any) -> Any:
    return if_true if condition else if_false


def _python_total(items: Any, term: Any, zero: Any) -> Any:
    # A loop, not `sum`: `sum` of floats is compensated on Python >= 3.12, and the totals
    # must be the same float, bit for bit, as Spark's left fold in list order.
    total = zero
    for item in items:
        total = total + term(item)
    return total


PYTHON_OPS = Ops(where=_python_where, maximum=max, total=_python_total, field=getattr)


def is_broker_id(value: object) -> bool:
    """The broker-id rule (`BROKER_ID_PATTERN`) on one Python value."""
    return isinstance(value, str) and _BROKER_ID.fullmatch(value) is not None


def is_topic_name(value: object) -> bool:
    """The topic-name rule (`TOPIC_NAME_PATTERN`) on one Python value."""
    return isinstance(value, str) and _TOPIC_NAME.fullmatch(value) is not None


def throughput_mbps(byte_rate: Any) -> Any:
    """Bytes per second to MB/s (10^6), the unit every score uses."""
    return byte_rate / 1_000_000


def topic_connections(producers: Any, consumers: Any) -> Any:
    """A topic's connections: producers plus consumers."""
    return producers + consumers


def report_totals(topics: Any, ops: Ops = PYTHON_OPS) -> tuple[Any, Any, Any, Any]:
    """A report's derived totals over its topics, added in list order from zero:
    (throughput MB/s, msg/s, backlog, connections).

    `LoadReport` computes them with `PYTHON_OPS`; the pipeline applies the same function to
    a Spark array column of topic structs, so both give the same floats.
    """

    if ops is PYTHON_OPS:
        # The leader builds a report per broker per interval: the same left folds over
        # `TopicLoad`s, in one pass without the indirection (same floats, same order).
        byte_rate = msg_rate = 0.0
        backlog = connections = 0
        for t in topics:
            byte_rate = byte_rate + t.byte_rate
            msg_rate = msg_rate + t.msg_rate
            backlog = backlog + t.backlog
            connections = connections + topic_connections(t.producers, t.consumers)
        return throughput_mbps(byte_rate), msg_rate, backlog, connections

    def get(topic: Any, name: str) -> Any:
        return ops.field(topic, name)

    return (
        throughput_mbps(ops.total(topics, lambda t: get(t, "byte_rate"), 0.0)),
        ops.total(topics, lambda t: get(t, "msg_rate"), 0.0),
        ops.total(topics, lambda t: get(t, "backlog"), 0),
        ops.total(topics, lambda t: topic_connections(get(t, "producers"), get(t, "consumers")), 0),
    )


class ModelError(ValueError):
    """A value that does not fit the model; the message names the offending field."""


class InvalidTopicName(ModelError):
    """A topic name that is not `/namespace/topic`."""


def validate_broker_id(value: object, field_name: str = "broker_id") -> BrokerId:
    """Return `value` if it is a valid broker id, else raise `ModelError` naming the field."""
    if not isinstance(value, str) or not is_broker_id(value):
        raise ModelError(
            f"{field_name}: invalid broker id {value!r} (letters, digits, '_', '.', '-', ':'; "
            "must not contain '/')"
        )
    return value


@dataclass(frozen=True, order=True)
class TopicName:
    """A topic name `/{namespace}/{topic}`; both parts are validated."""

    namespace: str
    name: str

    def __post_init__(self) -> None:
        for part, label in ((self.namespace, "namespace"), (self.name, "topic")):
            if not isinstance(part, str) or _NAME_PART.fullmatch(part) is None:
                raise InvalidTopicName(
                    f"invalid topic name '/{self.namespace}/{self.name}': {label} part "
                    f"{part!r} must be 1-128 characters of letters, digits, '_', '.', '-' "
                    "and start with a letter or digit"
                )

    @classmethod
    def parse(cls, value: object) -> TopicName:
        """Parse `/namespace/topic`; raise `InvalidTopicName` with the reason otherwise."""
        if isinstance(value, TopicName):
            return value
        if not isinstance(value, str):
            raise InvalidTopicName(f"invalid topic name {value!r}: expected a string")
        parts = value.split("/")
        if len(parts) != 3 or parts[0] != "":
            raise InvalidTopicName(
                f"invalid topic name {value!r}: expected the form /namespace/topic"
            )
        return cls(parts[1], parts[2])

    def __str__(self) -> str:
        return f"/{self.namespace}/{self.name}"


def topic_namespace(topic: str) -> str:
    """The namespace of a topic name that was validated on its way in (every decoder and
    command parses names with `TopicName.parse`): what the decision core and the leader
    group topics by on every round, without parsing 100 000 names again."""
    return topic.split("/", 2)[1]


def topic_str(value: object) -> str:
    """Validate a topic name and return its canonical string form."""
    if type(value) is str:
        return _valid_topic_str(value)
    return str(TopicName.parse(value))


# Every load report names the broker's topics again: a valid name is checked once.
@functools.lru_cache(maxsize=1 << 18)
def _valid_topic_str(value: str) -> str:
    return str(TopicName.parse(value))


class BrokerMode(StrEnum):
    ACTIVE = "active"
    DRAINING = "draining"
    DRAINED = "drained"


class MarkerReason(StrEnum):
    NEW = "new"
    UNLOAD = "unload"
    REBALANCE = "rebalance"
    FAILOVER = "failover"
    DRAIN_REDIRECT = "drain_redirect"


# --- field readers: one place that turns loose JSON into typed values -------------------

E = TypeVar("E", bound=StrEnum)
_NUMBERS = frozenset({int, float})  # not bool: `type(True) is bool`


def _field(data: Mapping[str, Any], name: str, ctx: str, default: Any = ...) -> Any:
    if not isinstance(data, Mapping):
        raise ModelError(f"{ctx}: expected a JSON object, got {type(data).__name__}")
    if name not in data:
        if default is ...:
            raise ModelError(f"{ctx}.{name}: missing field")
        return default
    return data[name]


def _number(data: Mapping[str, Any], name: str, ctx: str, default: Any = ...) -> float:
    value = _field(data, name, ctx, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ModelError(f"{ctx}.{name}: expected a number, got {value!r}")
    if value != value or value < 0:  # NaN or negative
        raise ModelError(f"{ctx}.{name}: must be a non-negative number, got {value!r}")
    return float(value)


def _count(data: Mapping[str, Any], name: str, ctx: str, default: Any = ...) -> int:
    value = _field(data, name, ctx, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelError(f"{ctx}.{name}: expected a non-negative integer, got {value!r}")
    return value


def _optional_text(data: Mapping[str, Any], name: str, ctx: str) -> str | None:
    value = data.get(name) if isinstance(data, Mapping) else None
    if value is not None and not isinstance(value, str):
        raise ModelError(f"{ctx}.{name}: expected a string or null, got {value!r}")
    return value


def _optional_broker(data: Mapping[str, Any], name: str, ctx: str) -> BrokerId | None:
    value = _field(data, name, ctx, None)
    return None if value is None else validate_broker_id(value, f"{ctx}.{name}")


def _enum(kind: type[E], data: Mapping[str, Any], name: str, ctx: str, default: Any = ...) -> E:
    value = _field(data, name, ctx, default)
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise ModelError(f"{ctx}.{name}: {value!r} is not one of: {allowed}") from None


def _bool(data: Mapping[str, Any], name: str, ctx: str, default: Any = ...) -> bool:
    value = _field(data, name, ctx, default)
    if not isinstance(value, bool):
        raise ModelError(f"{ctx}.{name}: expected true or false, got {value!r}")
    return value


def loads_object(text: str | bytes, ctx: str) -> dict[str, Any]:
    """Decode a JSON object, raising `ModelError` (never a raw JSONDecodeError)."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelError(f"{ctx}: malformed JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelError(f"{ctx}: expected a JSON object, got {type(data).__name__}")
    return data


# --- broker state -----------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerState:
    """A broker's administrative mode: only `active` brokers receive topics."""

    mode: BrokerMode = BrokerMode.ACTIVE
    reason: str = ""

    @property
    def is_active(self) -> bool:
        return self.mode is BrokerMode.ACTIVE

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode.value, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], ctx: str = "broker_state") -> BrokerState:
        reason = _field(data, "reason", ctx, "")
        if not isinstance(reason, str):
            raise ModelError(f"{ctx}.reason: expected a string, got {reason!r}")
        return cls(_enum(BrokerMode, data, "mode", ctx), reason)


ACTIVE = BrokerState()


# --- load reports -----------------------------------------------------------------------


@dataclass(frozen=True)
class TopicLoad:
    """Per-topic traffic as a broker reports it."""

    topic: str
    msg_rate: float = 0.0
    byte_rate: float = 0.0
    producers: int = 0
    consumers: int = 0
    subscriptions: int = 0
    backlog: int = 0

    @property
    def throughput_mbps(self) -> float:
        return float(throughput_mbps(self.byte_rate))

    @property
    def connections(self) -> int:
        return int(topic_connections(self.producers, self.consumers))

    def to_dict(self, *, sparse: bool = False) -> dict[str, Any]:
        """Every figure; `sparse`: the zero ones left out (`from_dict` reads them as 0)."""
        full = {
            "topic": self.topic,
            "msg_rate": self.msg_rate,
            "byte_rate": self.byte_rate,
            "producers": self.producers,
            "consumers": self.consumers,
            "subscriptions": self.subscriptions,
            "backlog": self.backlog,
        }
        return {k: v for k, v in full.items() if v or k == "topic"} if sparse else full

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], ctx: str = "topic") -> TopicLoad:
        if type(data) is dict:
            # The leader decodes every topic of every report: well-formed records (all
            # of them, in practice) take a short path; anything else the checks below.
            get = data.get
            topic = get("topic")
            rates = (get("msg_rate", 0.0), get("byte_rate", 0.0))
            counts = (
                get("producers", 0),
                get("consumers", 0),
                get("subscriptions", 0),
                get("backlog", 0),
            )
            if (
                type(topic) is str
                and all(type(v) in _NUMBERS and v >= 0 for v in rates)
                and all(type(v) is int and v >= 0 for v in counts)
            ):
                try:
                    name = _valid_topic_str(topic)
                except InvalidTopicName:
                    pass  # said precisely below
                else:
                    return cls(name, float(rates[0]), float(rates[1]), *counts)
        try:
            topic = topic_str(_field(data, "topic", ctx))
        except InvalidTopicName as exc:
            raise ModelError(f"{ctx}.topic: {exc}") from None
        return cls(
            topic=topic,
            msg_rate=_number(data, "msg_rate", ctx, 0.0),
            byte_rate=_number(data, "byte_rate", ctx, 0.0),
            producers=_count(data, "producers", ctx, 0),
            consumers=_count(data, "consumers", ctx, 0),
            subscriptions=_count(data, "subscriptions", ctx, 0),
            backlog=_count(data, "backlog", ctx, 0),
        )


@dataclass(frozen=True)
class LoadReport:
    """What a broker publishes every `load_report_interval_seconds`.

    This is also the record format of the load history the data pipeline reads: the
    sink writes `to_dict()` (derived totals included), one JSON object per line.
    """

    broker_id: BrokerId
    timestamp: float
    cpu_percent: float = 0.0
    memory_percent: float = 0.0
    disk_io_bps: float = 0.0
    network_io_bps: float = 0.0
    topics: tuple[TopicLoad, ...] = ()
    # Derived totals, computed once when the report is built (the leader ranks brokers on
    # every report; re-summing thousands of topics per decision would dominate).
    total_throughput_mbps: float = field(init=False, compare=False, repr=False)
    total_msg_rate: float = field(init=False, compare=False, repr=False)
    total_backlog: int = field(init=False, compare=False, repr=False)
    total_connections: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        throughput, msg_rate, backlog, connections = report_totals(self.topics)
        object.__setattr__(self, "total_throughput_mbps", throughput)
        object.__setattr__(self, "total_msg_rate", msg_rate)
        object.__setattr__(self, "total_backlog", backlog)
        object.__setattr__(self, "total_connections", connections)

    @property
    def topic_count(self) -> int:
        return len(self.topics)

    def to_dict(self, *, sparse: bool = False) -> dict[str, Any]:
        """The record; `sparse` (the value a broker publishes in etcd): each topic's zero
        figures left out, so an idle topic costs its name alone. 10 000 idle topics made
        a full report of 1.2 MB, near etcd's 1.5 MiB limit on a request; sparse, 0.3 MB.
        The history keeps full records (its readers expect every field)."""
        return {
            "broker_id": self.broker_id,
            "timestamp": self.timestamp,
            "cpu_percent": self.cpu_percent,
            "memory_percent": self.memory_percent,
            "disk_io_bps": self.disk_io_bps,
            "network_io_bps": self.network_io_bps,
            "topics": [t.to_dict(sparse=sparse) for t in self.topics],
            "topic_count": self.topic_count,
            "total_throughput_mbps": self.total_throughput_mbps,
            "total_msg_rate": self.total_msg_rate,
            "total_backlog": self.total_backlog,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], ctx: str = "load_report") -> LoadReport:
        cpu = _number(data, "cpu_percent", ctx, 0.0)
        mem = _number(data, "memory_percent", ctx, 0.0)
        for name, value in (("cpu_percent", cpu), ("memory_percent", mem)):
            if value > 100.0:
                raise ModelError(f"{ctx}.{name}: must be within 0-100, got {value!r}")
        topics = _field(data, "topics", ctx, [])
        if not isinstance(topics, list):
            raise ModelError(f"{ctx}.topics: expected a list, got {type(topics).__name__}")
        return cls(
            broker_id=validate_broker_id(_field(data, "broker_id", ctx), f"{ctx}.broker_id"),
            timestamp=_number(data, "timestamp", ctx),
            cpu_percent=cpu,
            memory_percent=mem,
            disk_io_bps=_number(data, "disk_io_bps", ctx, 0.0),
            network_io_bps=_number(data, "network_io_bps", ctx, 0.0),
            topics=tuple(
                TopicLoad.from_dict(t, f"{ctx}.topics[{i}]") for i, t in enumerate(topics)
            ),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> LoadReport:
        return cls.from_dict(loads_object(text, "load_report"))


# --- markers, assignments, moves --------------------------------------------------------


@dataclass(frozen=True)
class UnassignedMarker:
    """A topic waiting for an owner, at `/cluster/unassigned/{ns}/{topic}`.

    `ready: false` means the previous owner is still sealing: the leader must not assign
    the topic until the source sets it to true (every Ballast move is graceful), or until
    the seal timeout overrules it: then `forced` says why (an additive field). A source
    that could not seal sets it to true with `unsealed` saying why: its acknowledged
    messages are committed to object storage all the same, and the next owner's claim
    fences it.
    """

    reason: MarkerReason = MarkerReason.NEW
    from_broker: BrokerId | None = None
    to_broker: BrokerId | None = None
    timestamp: float = 0.0
    ready: bool = True
    forced: str | None = None
    unsealed: str | None = None  # the source gave the topic up without a seal: why

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "reason": self.reason.value,
            "from_broker": self.from_broker,
            "to_broker": self.to_broker,
            "timestamp": self.timestamp,
            "ready": self.ready,
        }
        if self.forced is not None:
            data["forced"] = self.forced
        if self.unsealed is not None:
            data["unsealed"] = self.unsealed
        return data

    @classmethod
    def from_dict(cls, data: Any, ctx: str = "marker") -> UnassignedMarker:
        # Danube writes an empty value for a brand-new topic: treat it as reason "new".
        if data is None or data == {} or data == "":
            return cls()
        return cls(
            reason=_enum(MarkerReason, data, "reason", ctx, "new"),
            from_broker=_optional_broker(data, "from_broker", ctx),
            to_broker=_optional_broker(data, "to_broker", ctx),
            timestamp=_number(data, "timestamp", ctx, 0.0),
            ready=_bool(data, "ready", ctx, True),
            forced=_optional_text(data, "forced", ctx),
            unsealed=_optional_text(data, "unsealed", ctx),
        )


@dataclass(frozen=True)
class Assignment:
    """The value at `/cluster/brokers/{broker_id}/{ns}/{topic}`."""

    assigned_at: float
    epoch: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"assigned_at": self.assigned_at, "epoch": self.epoch}

    @classmethod
    def from_dict(cls, data: Any, ctx: str = "assignment") -> Assignment:
        if data is None:  # Danube writes null
            return cls(0.0)
        return cls(_number(data, "assigned_at", ctx, 0.0), _count(data, "epoch", ctx, 0))


@dataclass(frozen=True)
class Move:
    """One topic moved from one broker to another; persisted in the rebalancing history."""

    topic: str
    from_broker: BrokerId
    to_broker: BrokerId
    reason: str = "LoadImbalance"
    estimated_load: float = 0.0
    timestamp: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "from_broker": self.from_broker,
            "to_broker": self.to_broker,
            "reason": self.reason,
            "estimated_load": self.estimated_load,
            "timestamp": self.timestamp,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], ctx: str = "move") -> Move:
        reason = _field(data, "reason", ctx, "LoadImbalance")
        if not isinstance(reason, str):
            raise ModelError(f"{ctx}.reason: expected a string, got {reason!r}")
        return cls(
            topic=topic_str(_field(data, "topic", ctx)),
            from_broker=validate_broker_id(_field(data, "from_broker", ctx), f"{ctx}.from_broker"),
            to_broker=validate_broker_id(_field(data, "to_broker", ctx), f"{ctx}.to_broker"),
            reason=reason,
            estimated_load=_number(data, "estimated_load", ctx, 0.0),
            timestamp=_number(data, "timestamp", ctx),
        )


# --- the cluster as the core sees it ----------------------------------------------------


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything the decision core needs, captured at one instant.

    `assignments` maps each broker to the topics it owns; `reports` holds the latest load
    report per broker (a broker may have none yet); `states` defaults to active;
    `topic_created` gives each topic's creation time for the minimum-age rule.

    Pulsar's inputs (issue 12), all optional: `bundle_boundaries` maps a namespace to its
    bundle boundaries (present: the namespace is placed by bundle); `broker_domains` maps a
    broker to its failure domain; `anti_affinity_groups` maps a namespace to its group.
    """

    brokers: tuple[BrokerId, ...]
    reports: Mapping[BrokerId, LoadReport] = field(default_factory=dict)
    states: Mapping[BrokerId, BrokerState] = field(default_factory=dict)
    assignments: Mapping[BrokerId, tuple[str, ...]] = field(default_factory=dict)
    topic_created: Mapping[str, float] = field(default_factory=dict)
    bundle_boundaries: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    broker_domains: Mapping[BrokerId, str] = field(default_factory=dict)
    anti_affinity_groups: Mapping[str, str] = field(default_factory=dict)

    def state(self, broker: BrokerId) -> BrokerState:
        return self.states.get(broker, ACTIVE)

    def active_brokers(self) -> tuple[BrokerId, ...]:
        return tuple(b for b in self.brokers if self.state(b).is_active)

    def topics_of(self, broker: BrokerId) -> tuple[str, ...]:
        return self.assignments.get(broker, ())

    def topic_loads(self, broker: BrokerId) -> dict[str, TopicLoad]:
        """Reported load per owned topic; a topic not yet in a report counts as idle."""
        report = self.reports.get(broker)
        reported = {t.topic: t for t in report.topics} if report else {}
        return {t: reported.get(t, TopicLoad(t)) for t in self.topics_of(broker)}


def moves_from_dicts(items: Sequence[Mapping[str, Any]]) -> list[Move]:
    """Decode a list of move records (e.g. the persisted history)."""
    return [Move.from_dict(d, f"moves[{i}]") for i, d in enumerate(items)]
