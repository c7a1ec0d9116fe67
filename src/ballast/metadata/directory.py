"""What the metadata store says about topics: owners, brokers' addresses, namespaces.

Every broker answers lookups for every topic from here, not from what it serves itself,
so a client that lands on any broker is sent to the owner. Queries go to the store each
time (lookups are rare: one per producer or consumer (re)creation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ballast.clock import Clock
from ballast.metadata import Compare, KeyValue, Listing, MetadataStore, Put, keys
from ballast.metadata.records import Registration, parse_owner_value
from ballast.model import MarkerReason, ModelError, TopicName, UnassignedMarker

__all__ = ["DEFAULT_NAMESPACE", "Directory", "Owner", "Whereabouts", "partition_index"]

DEFAULT_NAMESPACE = "default"
_PARTITION = re.compile(r"^(?P<base>.+)-part-(?P<index>\d+)$")


def partition_index(base: str, name: str) -> int | None:
    """The partition number if `name` is ``{base}-part-{digits}``, else None."""
    match = _PARTITION.match(name)
    if match is None or match.group("base") != base:
        return None
    return int(match.group("index"))


def _meta_value(kv: KeyValue | None) -> dict[str, Any] | None:
    if kv is None:
        return None
    return dict(kv.value) if isinstance(kv.value, dict) else {}


@dataclass(frozen=True)
class Owner:
    """The broker a topic is assigned to, and where clients reach it."""

    broker_id: str
    broker_url: str


@dataclass(frozen=True)
class Whereabouts:
    """What a lookup reads about a topic: its registered owner, and whether it exists
    (metadata, or a marker waiting for an owner)."""

    owner: Owner | None
    exists: bool


class Directory:
    """Topic and namespace facts from the metadata store."""

    def __init__(self, store: MetadataStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    async def owner(self, topic: TopicName) -> Owner | None:
        """The registered broker that owns `topic` now, if any.

        Read from the topic's ownership record, written and deleted in the same
        transaction as the owner's assignment key (`records.claim_ops`, `release_ops`): two
        reads, whatever the number of brokers. A dead owner keeps its record until the
        leader fails the topic over; its registration is gone by then, so it is no answer.
        A record or registration that does not decode is no answer either.
        """
        return await self._registered(await self.store.get(keys.topic_owner(topic)))

    async def whereabouts(self, topic: TopicName) -> Whereabouts:
        """The topic's owner, and whether it exists: its ownership record, metadata and
        unassigned marker in one read (a new topic's lookup finds none of them)."""
        record, meta, marker = await self.store.get_many(
            [keys.topic_owner(topic), keys.topic_meta(topic), keys.unassigned(topic)]
        )
        return Whereabouts(await self._registered(record), meta is not None or marker is not None)

    async def _registered(self, record: KeyValue | None) -> Owner | None:
        if record is None:
            return None
        try:
            broker = parse_owner_value(record.value)
            registered = await self.store.get(keys.register(broker))
            if registered is None:
                return None
            url = Registration.from_dict(registered.value).broker_url
        except ModelError:
            return None
        return Owner(broker, url) if url else None

    async def meta(self, topic: TopicName) -> dict[str, Any] | None:
        """The topic's metadata (a JSON object), or None if the topic does not exist."""
        return _meta_value(await self.store.get(keys.topic_meta(topic)))

    async def meta_and_storage(self, topic: TopicName) -> tuple[dict[str, Any] | None, Listing]:
        """`meta` and the topic's storage keys (`keys.storage_topic_prefix`) in one round
        trip: what opening it reads."""
        kv, listing = await self.store.get_and_list(
            keys.topic_meta(topic), keys.storage_topic_prefix(topic)
        )
        return _meta_value(kv), listing

    async def marker(self, topic: TopicName) -> UnassignedMarker | None:
        """The topic's unassigned marker (it is waiting for an owner), if any."""
        kv = await self.store.get(keys.unassigned(topic))
        if kv is None:
            return None
        try:
            return UnassignedMarker.from_dict(kv.value)
        except ModelError:
            return UnassignedMarker()

    async def partitions(self, base: TopicName) -> list[str]:
        """`[base]` for a plain topic, its ``-part-N`` topics for a partitioned one, or []."""
        if await self.meta(base) is not None:
            return [str(base)]
        return await self.partitions_of(base)

    async def partitions_of(self, base: TopicName) -> list[str]:
        """The ``-part-N`` topics of `base` (a partitioned topic's; [] for any other)."""
        # Only the keys of this topic's partitions (not the namespace's: with thousands of
        # topics, every new topic's first producer listed them all).
        listing = await self.store.get_prefix(keys.partitions_prefix(base))
        found: dict[int, str] = {}
        for kv in listing.items:
            if not keys.is_topic_meta_key(kv.key):
                continue
            try:
                topic = keys.parse_topic_meta_key(kv.key)
            except ValueError:
                continue  # a foreign key is no partition
            index = partition_index(base.name, topic.name)
            if index is not None:
                found[index] = str(topic)
        return [found[i] for i in sorted(found)]

    async def namespace_exists(self, namespace: str) -> bool:
        """Whether the namespace was created (``default`` always is, at broker start)."""
        return await self.store.get(keys.namespace(namespace)) is not None

    async def meta_in_namespace(self, topic: TopicName) -> tuple[dict[str, Any] | None, bool]:
        """`meta(topic)` and `namespace_exists` of its namespace, in one read."""
        meta, namespace = await self.store.get_many(
            [keys.topic_meta(topic), keys.namespace(topic.namespace)]
        )
        return _meta_value(meta), namespace is not None

    async def ensure_namespace(self, namespace: str) -> bool:
        """Create the namespace if absent; True if this call created it."""
        result = await self.store.txn(
            [Compare.absent(keys.namespace(namespace))],
            [Put(keys.namespace(namespace), {"created_at": self.clock.now()})],
        )
        return result.succeeded

    async def create_topic(self, topic: TopicName, extra: dict[str, Any]) -> bool:
        """Create a topic (metadata and a ``new`` marker) if absent; True if created here."""
        now = self.clock.now()
        marker = UnassignedMarker(MarkerReason.NEW, timestamp=now, ready=True)
        result = await self.store.txn(
            [Compare.absent(keys.topic_meta(topic))],
            [
                Put(keys.topic_meta(topic), {**extra, "created_at": now}),
                Put(keys.unassigned(topic), marker.to_dict()),
            ],
        )
        return result.succeeded
