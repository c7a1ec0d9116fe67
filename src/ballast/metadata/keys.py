"""The key layout of the metadata store: the only place that spells key paths.

Every function validates its inputs (topic names via `TopicName.parse`, broker ids via
`validate_broker_id`), so a bad name raises a clear `ValueError` instead of producing a
stray key. Parsers (`parse_*_key`) invert the builders and raise `KeyLayoutError` (a
`ValueError`) naming the key when it does not fit the layout, so a watcher can log and skip
a foreign key instead of crashing.

| builder | key |
|---|---|
| `register(b)` | ``/cluster/register/{b}`` |
| `broker_state(b)` | ``/cluster/brokers/{b}/state`` |
| `broker_assignment(b, t)` | ``/cluster/brokers/{b}/{ns}/{topic}`` |
| `unassigned(t)` | ``/cluster/unassigned/{ns}/{topic}`` |
| `topic_owner(t)` | ``/cluster/owners/{ns}/{topic}`` (one per owned topic: "never two owners") |
| `load(b)` | ``/cluster/load/{b}`` |
| `LEADER` | ``/cluster/leader`` |
| `LOAD_BALANCE` | ``/cluster/load_balance`` |
| `rebalancing_history(ts, t, rev)` | ``/cluster/rebalancing_history/{ts_ms}-{rev}-{ns}:{topic}`` |
| `topic_meta(t)` | ``/topics/{ns}/{topic}/meta`` |
| `namespace_topics_prefix(ns)` | ``/topics/{ns}/`` |
| `subscription_cursor(t, s)` | ``/topics/{ns}/{topic}/subscriptions/{s}/cursor`` |
| `storage_object(t, start)` | ``/storage/topics/{ns}/{topic}/objects/{start:020}`` |
| `storage_index(t)` | ``/storage/topics/{ns}/{topic}/index`` (names its index object) |
| `storage_state(t)` | ``/storage/topics/{ns}/{topic}/state`` |
| `OBJECT_STORE` | ``/storage/object_store`` (the cluster's object store and its probe) |
| `namespace_storage_prefix(ns)` | ``/storage/topics/{ns}/`` |
| `namespace_bundles(ns)` | ``/cluster/bundles/{ns}`` (Pulsar's bundle boundaries) |
| `anti_affinity_group(ns)` | ``/cluster/anti_affinity/{ns}`` (`{group}`) |
| `failure_domain(d)` | ``/cluster/failure_domains/{d}`` (`{brokers: [...]}`) |
| `namespace(ns)` | ``/namespaces/{ns}`` |
| `topic_schema(t)` | ``/topics/{ns}/{topic}/schema`` (`{subject, validation_policy, …}`) |
| `subscription_redeliveries(t, s)` | ``/topics/{ns}/{topic}/subscriptions/{s}/redeliveries`` |
| `dead_letter_policy(ns)` | ``/policies/dead_letter/{ns}`` (`{max_deliveries, …}`) |
| `retention_policy(ns)` | ``/policies/retention/{ns}`` (`{time_seconds, size_bytes}`) |
| `quota_policy(ns)` | ``/policies/quotas/{ns}`` (`{max_topics, …}`, see `broker.quotas`) |
| `SCHEMA_ID_COUNTER` | ``/schemas/next_id`` (`{next}`: allocated by compare-and-swap) |
| `schema_subject(subj)` | ``/schemas/subjects/{subj}/meta`` (`{schema_id, compatibility}`) |
| `schema_version(subj, v)` | ``/schemas/subjects/{subj}/versions/{v:010}`` |
| `schema_id(id)` | ``/schemas/ids/{id:020}`` (`{subject}`: the id's subject) |
"""

from __future__ import annotations

import math
import re

from ballast.model import ModelError, TopicName, validate_broker_id

__all__ = [
    "ANTI_AFFINITY_PREFIX",
    "BROKERS_PREFIX",
    "BUNDLES_PREFIX",
    "CLUSTER_PREFIX",
    "FAILURE_DOMAINS_PREFIX",
    "HISTORY_PREFIX",
    "LEADER",
    "LOAD_BALANCE",
    "LOAD_PREFIX",
    "NAMESPACES_PREFIX",
    "OBJECT_STORE",
    "OWNERS_PREFIX",
    "POLICIES_PREFIX",
    "REGISTER_PREFIX",
    "SCHEMAS_PREFIX",
    "SCHEMA_ID_COUNTER",
    "SCHEMA_SUBJECTS_PREFIX",
    "STORAGE_PREFIX",
    "TOPICS_PREFIX",
    "UNASSIGNED_PREFIX",
    "KeyLayoutError",
    "TopicLike",
    "anti_affinity_group",
    "broker_assignment",
    "broker_assignments_prefix",
    "broker_prefix",
    "broker_state",
    "dead_letter_policy",
    "failure_domain",
    "is_broker_state_key",
    "is_topic_meta_key",
    "load",
    "namespace",
    "namespace_bundles",
    "namespace_storage_prefix",
    "namespace_topics_prefix",
    "parse_anti_affinity_key",
    "parse_assignment_key",
    "parse_broker_state_key",
    "parse_bundles_key",
    "parse_failure_domain_key",
    "parse_history_key",
    "parse_load_key",
    "parse_namespace_key",
    "parse_register_key",
    "parse_schema_subject_key",
    "parse_schema_version_key",
    "parse_storage_object_key",
    "parse_subscription_cursor_key",
    "parse_topic_meta_key",
    "parse_topic_owner_key",
    "parse_unassigned_key",
    "quota_policy",
    "rebalancing_history",
    "register",
    "retention_policy",
    "schema_id",
    "schema_subject",
    "schema_subject_prefix",
    "schema_version",
    "schema_versions_prefix",
    "storage_index",
    "storage_object",
    "storage_objects_prefix",
    "storage_state",
    "storage_topic_prefix",
    "subscription_cursor",
    "subscription_redeliveries",
    "subscriptions_prefix",
    "topic_meta",
    "topic_owner",
    "topic_prefix",
    "topic_pressure",
    "topic_schema",
    "unassigned",
]

TopicLike = TopicName | str

CLUSTER_PREFIX = "/cluster/"
REGISTER_PREFIX = "/cluster/register/"
BROKERS_PREFIX = "/cluster/brokers/"
UNASSIGNED_PREFIX = "/cluster/unassigned/"
OWNERS_PREFIX = "/cluster/owners/"
LOAD_PREFIX = "/cluster/load/"
LEADER = "/cluster/leader"
OBJECT_STORE = "/storage/object_store"
LOAD_BALANCE = "/cluster/load_balance"
HISTORY_PREFIX = "/cluster/rebalancing_history/"
TOPICS_PREFIX = "/topics/"
STORAGE_PREFIX = "/storage/topics/"
# Pulsar's load balancing (issue 12).
BUNDLES_PREFIX = "/cluster/bundles/"
ANTI_AFFINITY_PREFIX = "/cluster/anti_affinity/"
FAILURE_DOMAINS_PREFIX = "/cluster/failure_domains/"
NAMESPACES_PREFIX = "/namespaces/"
# Per-namespace dead-letter policies and the schema registry (issue 22).
POLICIES_PREFIX = "/policies/"
SCHEMAS_PREFIX = "/schemas/"
# Figures of a topic's limits as its owner last saw them (see `broker.pressure`); kept
# out of /topics/ so that their updates do not wake the leader.
PRESSURE_PREFIX = "/pressure/"
SCHEMA_SUBJECTS_PREFIX = "/schemas/subjects/"
SCHEMA_IDS_PREFIX = "/schemas/ids/"
SCHEMA_ID_COUNTER = "/schemas/next_id"
_VERSION_DIGITS = 10
_VERSION_RE = re.compile(rf"^\d{{{_VERSION_DIGITS}}}$")

# Widths chosen so that lexicographic key order equals numeric order: 15 digits of
# milliseconds reach year 33658; 20 digits hold any unsigned 64-bit offset or revision.
_HISTORY_TS_DIGITS = 15
_HISTORY_SEQ_DIGITS = 6
_OFFSET_DIGITS = 20
# A history key names the move it records: the topic and the revision of the assignment
# the move released. ':' joins namespace and topic (it is in neither's alphabet).
_HISTORY_RE = re.compile(
    rf"^(\d{{{_HISTORY_TS_DIGITS}}})-(\d{{{_OFFSET_DIGITS}}})-([^:/]+):([^:/]+)$"
)
# Keys written before that scheme: {ts_ms}-{seq}, numbered by each writer on its own.
_LEGACY_HISTORY_RE = re.compile(rf"^(\d{{{_HISTORY_TS_DIGITS}}})-(\d{{{_HISTORY_SEQ_DIGITS}}})$")
_OFFSET_RE = re.compile(rf"^\d{{{_OFFSET_DIGITS}}}$")
# Same alphabet as topic name parts: a subscription name becomes one path segment.
_SUBSCRIPTION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class KeyLayoutError(ValueError):
    """A key that does not fit the layout the parser expects; the message names the key."""


def _topic(topic: TopicLike) -> TopicName:
    # TopicName.parse accepts a TopicName as-is and raises InvalidTopicName otherwise.
    return TopicName.parse(topic)


def _broker(broker_id: str) -> str:
    return validate_broker_id(broker_id)


def _subscription(subscription: str) -> str:
    if not isinstance(subscription, str) or not _SUBSCRIPTION_RE.match(subscription):
        raise ValueError(
            f"invalid subscription name {subscription!r}: must be 1-128 characters of "
            "letters, digits, '_', '.', '-' and start with a letter or digit"
        )
    return subscription


def _segments(key: str, prefix: str, count: int, what: str) -> list[str]:
    """Split the part of `key` after `prefix` into exactly `count` non-empty segments."""
    if not isinstance(key, str) or not key.startswith(prefix):
        raise KeyLayoutError(f"{key!r} is not {what} key: expected it to start with {prefix!r}")
    parts = key[len(prefix) :].split("/")
    if len(parts) != count or any(not p for p in parts):
        raise KeyLayoutError(
            f"{key!r} is not {what} key: expected {count} path segment(s) after {prefix!r}"
        )
    return parts


def _parsed_topic(key: str, namespace: str, name: str, what: str) -> TopicName:
    try:
        return TopicName(namespace, name)
    except ModelError as exc:
        raise KeyLayoutError(f"{key!r} is not {what} key: {exc}") from exc


def _parsed_broker(key: str, broker_id: str, what: str) -> str:
    try:
        return validate_broker_id(broker_id)
    except ModelError as exc:
        raise KeyLayoutError(f"{key!r} is not {what} key: {exc}") from exc


# -- brokers ---------------------------------------------------------------------------


def register(broker_id: str) -> str:
    """Registration key of a broker (bound to the broker's lease)."""
    return f"{REGISTER_PREFIX}{_broker(broker_id)}"


def parse_register_key(key: str) -> str:
    """Broker id of a registration key."""
    (broker_id,) = _segments(key, REGISTER_PREFIX, 1, "a registration")
    return _parsed_broker(key, broker_id, "a registration")


def broker_prefix(broker_id: str) -> str:
    """Prefix of everything stored under one broker (its state and its assignments)."""
    return f"{BROKERS_PREFIX}{_broker(broker_id)}/"


def broker_state(broker_id: str) -> str:
    """State key of a broker (`{mode, reason}`)."""
    return f"{broker_prefix(broker_id)}state"


def is_broker_state_key(key: str) -> bool:
    """Whether `key` has the shape of a broker-state key (``/cluster/brokers/{b}/state``)."""
    return key.startswith(BROKERS_PREFIX) and key.endswith("/state") and key.count("/") == 4


def parse_broker_state_key(key: str) -> str:
    """Broker id of a broker-state key."""
    broker_id, leaf = _segments(key, BROKERS_PREFIX, 2, "a broker-state")
    if leaf != "state":
        raise KeyLayoutError(f"{key!r} is not a broker-state key: expected it to end in /state")
    return _parsed_broker(key, broker_id, "a broker-state")


def broker_assignment(broker_id: str, topic: TopicLike) -> str:
    """Assignment key: `topic` is owned by `broker_id`."""
    t = _topic(topic)
    return f"{broker_prefix(broker_id)}{t.namespace}/{t.name}"


def broker_assignments_prefix(broker_id: str) -> str:
    """Prefix of a broker's assignments.

    It also covers the broker's state key (``…/{broker_id}/state``); use
    `parse_assignment_key` to tell them apart (it rejects the state key).
    """
    return broker_prefix(broker_id)


def parse_assignment_key(key: str) -> tuple[str, TopicName]:
    """(broker id, topic) of an assignment key."""
    broker_id, namespace, name = _segments(key, BROKERS_PREFIX, 3, "an assignment")
    return (
        _parsed_broker(key, broker_id, "an assignment"),
        _parsed_topic(key, namespace, name, "an assignment"),
    )


def unassigned(topic: TopicLike) -> str:
    """Unassigned-marker key of a topic."""
    t = _topic(topic)
    return f"{UNASSIGNED_PREFIX}{t.namespace}/{t.name}"


def parse_unassigned_key(key: str) -> TopicName:
    """Topic of an unassigned-marker key."""
    namespace, name = _segments(key, UNASSIGNED_PREFIX, 2, "an unassigned-marker")
    return _parsed_topic(key, namespace, name, "an unassigned-marker")


def topic_owner(topic: TopicLike) -> str:
    """Ownership record of a topic: ``{broker_id}`` of its one owner.

    Written and deleted in the same transaction as the per-broker assignment key, so a
    placement proves "no other owner" with ONE compare (this key is absent), whatever the
    number of brokers.
    """
    t = _topic(topic)
    return f"{OWNERS_PREFIX}{t.namespace}/{t.name}"


def parse_topic_owner_key(key: str) -> TopicName:
    """Topic of an ownership-record key."""
    namespace, name = _segments(key, OWNERS_PREFIX, 2, "an ownership-record")
    return _parsed_topic(key, namespace, name, "an ownership-record")


def load(broker_id: str) -> str:
    """Load-report key of a broker."""
    return f"{LOAD_PREFIX}{_broker(broker_id)}"


def parse_load_key(key: str) -> str:
    """Broker id of a load-report key."""
    (broker_id,) = _segments(key, LOAD_PREFIX, 1, "a load-report")
    return _parsed_broker(key, broker_id, "a load-report")


# -- rebalancing history -------------------------------------------------------------------


def rebalancing_history(ts: float, topic: TopicLike, revision: int) -> str:
    """History key of the move of `topic` made at `ts` (epoch seconds) that released its
    assignment at `revision`.

    One scheme for every writer (the leader and the admin both write moves through
    `leader.transactions.move_write`), unique without a counter: a move's transaction
    compares the assignment's mod revision and deletes the assignment, so at most one move
    ever releases a given (topic, revision). Zero-padded parts sort keys by time, then
    revision.
    """
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not math.isfinite(ts):
        raise ValueError(f"invalid history timestamp {ts!r}: expected finite epoch seconds")
    ts_ms = round(ts * 1000)
    if not 0 <= ts_ms < 10**_HISTORY_TS_DIGITS:
        raise ValueError(f"invalid history timestamp {ts!r}: must be >= 0 epoch seconds")
    if (
        not isinstance(revision, int)
        or isinstance(revision, bool)
        or not 0 < revision < 10**_OFFSET_DIGITS
    ):
        raise ValueError(f"invalid history revision {revision!r}: expected an integer >= 1")
    t = _topic(topic)
    return (
        f"{HISTORY_PREFIX}{ts_ms:0{_HISTORY_TS_DIGITS}d}-{revision:0{_OFFSET_DIGITS}d}-"
        f"{t.namespace}:{t.name}"
    )


def parse_history_key(key: str) -> tuple[float, int, TopicName | None]:
    """(epoch seconds, revision, topic) of a rebalancing-history key; a key of the
    earlier ``{ts_ms}-{seq}`` scheme (still read) gives (epoch seconds, seq, None)."""
    what = "a rebalancing-history"
    (leaf,) = _segments(key, HISTORY_PREFIX, 1, what)
    legacy = _LEGACY_HISTORY_RE.match(leaf)
    if legacy is not None:
        return int(legacy.group(1)) / 1000.0, int(legacy.group(2)), None
    match = _HISTORY_RE.match(leaf)
    if match is None:
        raise KeyLayoutError(
            f"{key!r} is not {what} key: expected {{{_HISTORY_TS_DIGITS} digit ms}}-"
            f"{{{_OFFSET_DIGITS} digit revision}}-{{namespace}}:{{topic}}"
        )
    topic = _parsed_topic(key, match.group(3), match.group(4), what)
    return int(match.group(1)) / 1000.0, int(match.group(2)), topic


# -- topics --------------------------------------------------------------------------------


def topic_prefix(topic: TopicLike) -> str:
    """Prefix of everything stored about one topic (metadata, subscriptions)."""
    t = _topic(topic)
    return f"{TOPICS_PREFIX}{t.namespace}/{t.name}/"


def partitions_prefix(base: TopicLike) -> str:
    """Prefix of everything stored about the ``{base}-part-N`` partitions of a topic."""
    t = _topic(base)
    return f"{TOPICS_PREFIX}{t.namespace}/{t.name}-part-"


def topic_meta(topic: TopicLike) -> str:
    """Metadata key of a topic."""
    return f"{topic_prefix(topic)}meta"


def is_topic_meta_key(key: str) -> bool:
    """Whether `key` has the shape of a topic-metadata key (``/topics/{ns}/{topic}/meta``)."""
    return key.startswith(TOPICS_PREFIX) and key.endswith("/meta") and key.count("/") == 4


def parse_topic_meta_key(key: str) -> TopicName:
    """Topic of a ``/topics/{ns}/{topic}/meta`` key."""
    what = "a topic-metadata"
    namespace, name, leaf = _segments(key, TOPICS_PREFIX, 3, what)
    if leaf != "meta":
        raise KeyLayoutError(f"{key!r} is not {what} key: expected it to end in /meta")
    return _parsed_topic(key, namespace, name, what)


def subscriptions_prefix(topic: TopicLike) -> str:
    """Prefix of a topic's subscriptions."""
    return f"{topic_prefix(topic)}subscriptions/"


def subscription_cursor(topic: TopicLike, subscription: str) -> str:
    """Cursor key of a subscription on a topic."""
    return f"{subscriptions_prefix(topic)}{_subscription(subscription)}/cursor"


def parse_subscription_cursor_key(key: str) -> tuple[TopicName, str]:
    """(topic, subscription) of a cursor key."""
    what = "a subscription-cursor"
    namespace, name, middle, sub, leaf = _segments(key, TOPICS_PREFIX, 5, what)
    if middle != "subscriptions" or leaf != "cursor":
        raise KeyLayoutError(
            f"{key!r} is not {what} key: expected /topics/ns/topic/subscriptions/sub/cursor"
        )
    topic = _parsed_topic(key, namespace, name, what)
    if not _SUBSCRIPTION_RE.match(sub):
        raise KeyLayoutError(f"{key!r} is not {what} key: invalid subscription name {sub!r}")
    return topic, sub


# -- reliable-topic storage ----------------------------------------------------------------


def storage_topic_prefix(topic: TopicLike) -> str:
    """Prefix of a reliable topic's storage records (objects and sealed state)."""
    t = _topic(topic)
    return f"{STORAGE_PREFIX}{t.namespace}/{t.name}/"


def namespace_storage_prefix(name: str) -> str:
    """Prefix of the storage records of every reliable topic in a namespace."""
    return f"{STORAGE_PREFIX}{_namespace(name)}/"


def storage_objects_prefix(topic: TopicLike) -> str:
    """Prefix of a reliable topic's object descriptors (sorted by start offset)."""
    return f"{storage_topic_prefix(topic)}objects/"


def storage_object(topic: TopicLike, start: int) -> str:
    """Descriptor key of the object whose first offset is `start` (20-digit, sortable)."""
    if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < 10**20:
        raise ValueError(f"invalid object start offset {start!r}: expected an integer >= 0")
    return f"{storage_objects_prefix(topic)}{start:0{_OFFSET_DIGITS}d}"


def parse_storage_object_key(key: str) -> tuple[TopicName, int]:
    """(topic, start offset) of an object-descriptor key."""
    what = "a storage-object"
    namespace, name, middle, start = _segments(key, STORAGE_PREFIX, 4, what)
    if middle != "objects" or not _OFFSET_RE.match(start):
        raise KeyLayoutError(
            f"{key!r} is not {what} key: expected /storage/topics/ns/topic/objects/"
            f"{{{_OFFSET_DIGITS} digit offset}}"
        )
    return _parsed_topic(key, namespace, name, what), int(start)


def storage_index(topic: TopicLike) -> str:
    """Key naming the index object that holds a reliable topic's older descriptors."""
    return f"{storage_topic_prefix(topic)}index"


def storage_state(topic: TopicLike) -> str:
    """Sealed-state key of a reliable topic."""
    return f"{storage_topic_prefix(topic)}state"


# -- namespaces ----------------------------------------------------------------------------


def _namespace(namespace: str) -> str:
    # A namespace is the first part of a topic name: validated by the same rule.
    try:
        return TopicName(namespace, "t").namespace
    except ModelError:
        raise ValueError(
            f"invalid namespace {namespace!r}: must be 1-128 characters of letters, digits, "
            "'_', '.', '-' and start with a letter or digit"
        ) from None


def namespace(name: str) -> str:
    """Key of a namespace (its existence; value ``{created_at}``)."""
    return f"{NAMESPACES_PREFIX}{_namespace(name)}"


def parse_namespace_key(key: str) -> str:
    """Namespace of a namespace key."""
    (name,) = _segments(key, NAMESPACES_PREFIX, 1, "a namespace")
    try:
        return _namespace(name)
    except ValueError as exc:
        raise KeyLayoutError(f"{key!r} is not a namespace key: {exc}") from None


def namespace_topics_prefix(name: str) -> str:
    """Prefix of the metadata of every topic in a namespace."""
    return f"{TOPICS_PREFIX}{_namespace(name)}/"


# -- Pulsar's namespace bundles, anti-affinity groups, failure domains ----------------------


def _domain(domain: str) -> str:
    if not isinstance(domain, str) or not _SUBSCRIPTION_RE.match(domain):
        raise ValueError(
            f"invalid failure-domain name {domain!r}: must be 1-128 characters of letters, "
            "digits, '_', '.', '-' and start with a letter or digit"
        )
    return domain


def namespace_bundles(namespace: str) -> str:
    """Bundle boundaries of a namespace."""
    return f"{BUNDLES_PREFIX}{_namespace(namespace)}"


def parse_bundles_key(key: str) -> str:
    (namespace,) = _segments(key, BUNDLES_PREFIX, 1, "a namespace-bundles")
    return namespace


def anti_affinity_group(namespace: str) -> str:
    """Anti-affinity group of a namespace."""
    return f"{ANTI_AFFINITY_PREFIX}{_namespace(namespace)}"


def parse_anti_affinity_key(key: str) -> str:
    (namespace,) = _segments(key, ANTI_AFFINITY_PREFIX, 1, "an anti-affinity")
    return namespace


def failure_domain(domain: str) -> str:
    """A failure domain and its brokers."""
    return f"{FAILURE_DOMAINS_PREFIX}{_domain(domain)}"


def parse_failure_domain_key(key: str) -> str:
    (domain,) = _segments(key, FAILURE_DOMAINS_PREFIX, 1, "a failure-domain")
    return domain


# -- the schema registry -----------------------------------------------------------------


def _subject(subject: str) -> str:
    if not isinstance(subject, str) or not _SUBSCRIPTION_RE.match(subject):
        raise ValueError(
            f"invalid schema subject {subject!r}: must be 1-128 characters of letters, "
            "digits, '_', '.', '-' and start with a letter or digit"
        )
    return subject


def schema_subject_prefix(subject: str) -> str:
    """Prefix of everything stored about one subject (its record and its versions)."""
    return f"{SCHEMA_SUBJECTS_PREFIX}{_subject(subject)}/"


def schema_subject(subject: str) -> str:
    """Record of a subject: its cluster-wide id and compatibility mode."""
    return f"{schema_subject_prefix(subject)}meta"


def parse_schema_subject_key(key: str) -> str:
    """Subject of a ``/schemas/subjects/{subject}/meta`` key."""
    subject, leaf = _segments(key, SCHEMA_SUBJECTS_PREFIX, 2, "a schema-subject")
    if leaf != "meta":
        raise KeyLayoutError(f"{key!r} is not a schema-subject key: expected it to end in /meta")
    return subject


def schema_versions_prefix(subject: str) -> str:
    """Prefix of a subject's versions (sorted by version number)."""
    return f"{schema_subject_prefix(subject)}versions/"


def schema_version(subject: str, version: int) -> str:
    """One version of a subject (10-digit, sortable)."""
    if (
        not isinstance(version, int)
        or isinstance(version, bool)
        or not 0 < version < 10**_VERSION_DIGITS
    ):
        raise ValueError(f"invalid schema version {version!r}: expected an integer >= 1")
    return f"{schema_versions_prefix(subject)}{version:0{_VERSION_DIGITS}d}"


def parse_schema_version_key(key: str) -> tuple[str, int]:
    """(subject, version) of a schema-version key."""
    what = "a schema-version"
    subject, middle, version = _segments(key, SCHEMA_SUBJECTS_PREFIX, 3, what)
    if middle != "versions" or not _VERSION_RE.match(version):
        raise KeyLayoutError(
            f"{key!r} is not {what} key: expected /schemas/subjects/SUBJECT/versions/"
            f"{{{_VERSION_DIGITS} digit version}}"
        )
    return subject, int(version)


def schema_id(schema_id: int) -> str:
    """Index entry of a schema id (its subject); ids are unique cluster-wide."""
    if not isinstance(schema_id, int) or isinstance(schema_id, bool) or not 0 < schema_id < 2**64:
        raise ValueError(f"invalid schema id {schema_id!r}: expected an integer >= 1")
    return f"{SCHEMA_IDS_PREFIX}{schema_id:0{_OFFSET_DIGITS}d}"


def topic_schema(topic: TopicLike) -> str:
    """A topic's schema binding: subject and validation policy."""
    return f"{topic_prefix(topic)}schema"


def subscription_redeliveries(topic: TopicLike, subscription: str) -> str:
    """Delivery counts of the nacked messages of a subscription (offset -> deliveries)."""
    return f"{subscriptions_prefix(topic)}{_subscription(subscription)}/redeliveries"


def retention_policy(namespace: str) -> str:
    """A namespace's retention of reliable-topic storage (time and size)."""
    return f"{POLICIES_PREFIX}retention/{_namespace(namespace)}"


def dead_letter_policy(namespace: str) -> str:
    """A namespace's nack policy: maximum deliveries and dead-letter topic."""
    return f"{POLICIES_PREFIX}dead_letter/{_namespace(namespace)}"


def quota_policy(namespace: str) -> str:
    """A namespace's quotas: topics, producers, consumers, subscriptions, auto-creation."""
    return f"{POLICIES_PREFIX}quotas/{_namespace(namespace)}"


def topic_pressure(topic: TopicLike) -> str:
    """A topic's backpressure figures, written by its owner (`broker.pressure`)."""
    t = _topic(topic)
    return f"{PRESSURE_PREFIX}{t.namespace}/{t.name}"
