"""The object catalog: descriptors of a topic's objects, kept in the metadata store.

A descriptor lives at ``keys.storage_object(topic, start)`` and says which object holds
the offsets ``start..end``. So that a topic's keys in etcd stay few however long it runs,
the owner moves its older descriptors into an *index object* in the object store (a JSON
list of descriptors) named by ``keys.storage_index(topic)``: the key and the removal of
the descriptor keys it absorbed are one fenced transaction, written after the object, so
a crash in between leaves an unreferenced object and loses nothing. The catalog is the
index's descriptors followed by the remaining keys; the uploader's checkpoint is derived
from it (its highest `end`), so it survives restarts and moves without a file of its own.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ballast.metadata import keys
from ballast.metadata.store import Listing, MetadataStore
from ballast.model import TopicName
from ballast.storage.codec import Record
from ballast.storage.objects import ObjectPart, ObjectStore, read_object
from ballast.storage.stats import StorageStats

__all__ = [
    "CatalogIndex",
    "DescriptorError",
    "ObjectCatalog",
    "ObjectDescriptor",
    "PublishOutcome",
    "StoredSize",
    "load_catalog",
    "publish_descriptor",
    "stored_size",
]

log = logging.getLogger(__name__)


class DescriptorError(ValueError):
    """A descriptor value that does not fit the format; the message names the key."""


def _int(data: Mapping[str, Any], name: str, ctx: str) -> int:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DescriptorError(f"{ctx}.{name}: expected a non-negative integer, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ObjectDescriptor:
    """Where the offsets ``start..end`` (inclusive) of a topic are stored."""

    start: int
    end: int
    object_id: str
    size: int
    created: float
    # In an object the broker's commit stream shared by several topics: where this topic's
    # part (`size` bytes, itself laid out as a whole object) begins. None: the whole object.
    base: int | None = None

    @property
    def shared(self) -> bool:
        """True if other topics' records share the object (it is deleted by its writer's
        `CommitStream` once no topic refers to it, never by one topic)."""
        return self.base is not None

    def contains(self, offset: int) -> bool:
        """True if `offset` lies in this object's range."""
        return self.start <= offset <= self.end

    def to_dict(self) -> dict[str, Any]:
        """JSON form stored in the metadata store."""
        data: dict[str, Any] = {
            "start": self.start,
            "end": self.end,
            "object_id": self.object_id,
            "size": self.size,
            "created": self.created,
        }
        if self.base is not None:
            data["base"] = self.base
        return data

    def records(self, store: ObjectStore, from_offset: int) -> AsyncGenerator[Record, None]:
        """Stream this object's (or part's) records from `from_offset` on (`read_object`)."""
        if self.base is not None:
            store = ObjectPart(store, self.base, self.size)
        return read_object(store, self.object_id, self.size, from_offset)

    @classmethod
    def from_dict(cls, data: Any, ctx: str = "descriptor") -> ObjectDescriptor:
        """Validate a stored descriptor; raises `DescriptorError` naming the bad field."""
        if not isinstance(data, Mapping):
            raise DescriptorError(f"{ctx}: expected a JSON object, got {type(data).__name__}")
        start = _int(data, "start", ctx)
        end = _int(data, "end", ctx)
        if end < start:
            raise DescriptorError(f"{ctx}: end {end} is before start {start}")
        object_id = data.get("object_id")
        if not isinstance(object_id, str) or not object_id:
            raise DescriptorError(f"{ctx}.object_id: expected a non-empty string")
        created = data.get("created", 0.0)
        if isinstance(created, bool) or not isinstance(created, int | float):
            raise DescriptorError(f"{ctx}.created: expected a number, got {created!r}")
        base = _int(data, "base", ctx) if "base" in data else None
        return cls(start, end, object_id, _int(data, "size", ctx), float(created), base)


@dataclass(frozen=True, slots=True)
class CatalogIndex:
    """The value of ``keys.storage_index``: which object holds the older descriptors."""

    object_id: str
    count: int  # descriptors in it
    start: int  # the offsets they cover
    end: int
    size: int  # bytes of the objects they name (so storage is reported from the key alone)

    @classmethod
    def of(cls, object_id: str, descriptors: Sequence[ObjectDescriptor]) -> CatalogIndex:
        return cls(
            object_id,
            len(descriptors),
            descriptors[0].start,
            descriptors[-1].end,
            sum(d.size for d in descriptors),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "object_id": self.object_id,
            "count": self.count,
            "start": self.start,
            "end": self.end,
            "size": self.size,
        }

    @classmethod
    def from_dict(cls, data: Any, ctx: str = "index") -> CatalogIndex:
        if not isinstance(data, Mapping):
            raise DescriptorError(f"{ctx}: expected a JSON object, got {type(data).__name__}")
        object_id = data.get("object_id")
        if not isinstance(object_id, str) or not object_id:
            raise DescriptorError(f"{ctx}.object_id: expected a non-empty string")
        return cls(
            object_id,
            _int(data, "count", ctx),
            _int(data, "start", ctx),
            _int(data, "end", ctx),
            _int(data, "size", ctx),
        )


def encode_index(descriptors: Sequence[ObjectDescriptor]) -> bytes:
    """The index object's bytes: its descriptors, in offset order."""
    return json.dumps([d.to_dict() for d in descriptors], separators=(",", ":")).encode()


def decode_index(data: bytes, ctx: str) -> tuple[ObjectDescriptor, ...]:
    """An index object's descriptors; raises `DescriptorError` naming the object."""
    try:
        items = json.loads(data)
    except ValueError as exc:
        raise DescriptorError(f"{ctx}: not JSON ({exc})") from None
    if not isinstance(items, list):
        raise DescriptorError(f"{ctx}: expected a JSON list")
    return tuple(ObjectDescriptor.from_dict(item, f"{ctx}[{i}]") for i, item in enumerate(items))


@dataclass(frozen=True)
class ObjectCatalog:
    """A topic's descriptors sorted by start offset, without overlaps: first those of the
    index object (`index`, `indexed` of them), then those still kept as keys."""

    objects: tuple[ObjectDescriptor, ...] = ()
    revision: int = 0
    index: CatalogIndex | None = None
    indexed: int = 0

    @property
    def keyed(self) -> tuple[ObjectDescriptor, ...]:
        """The descriptors that are keys in the metadata store (not in the index)."""
        return self.objects[self.indexed :]

    @property
    def size(self) -> int:
        """Bytes of every object the catalog names."""
        return sum(d.size for d in self.objects)

    @property
    def start(self) -> int | None:
        """Lowest offset in object storage, or None when empty."""
        return self.objects[0].start if self.objects else None

    @property
    def end(self) -> int | None:
        """Highest offset in object storage, or None when empty."""
        return self.objects[-1].end if self.objects else None

    @functools.cached_property
    def _starts(self) -> list[int]:
        return [d.start for d in self.objects]

    def find(self, offset: int) -> ObjectDescriptor | None:
        """The object holding `offset`, if any."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0 and self.objects[i].contains(offset):
            return self.objects[i]
        return None

    def next_start_after(self, offset: int) -> int | None:
        """Start of the first object beginning after `offset` (to step over a hole)."""
        i = bisect.bisect_right(self._starts, offset)
        return self._starts[i] if i < len(self._starts) else None


async def load_catalog(
    store: MetadataStore,
    topic: TopicName,
    stats: StorageStats | None = None,
    *,
    objects: ObjectStore | None = None,
    previous: ObjectCatalog | None = None,
    listing: Listing | None = None,
) -> ObjectCatalog:
    """Read every descriptor of `topic` (the index object from `objects`, unless it is
    `previous`'s: index objects never change); malformed or overlapping descriptor keys
    are logged and skipped. One listing, so the index and the keys are of one revision
    (`listing`: the topic's storage prefix as read already)."""
    if listing is None:
        listing = await store.get_prefix(keys.storage_topic_prefix(topic))
    for undecodable in listing.undecodable:
        log.warning("storage %s: skipping descriptor: %s", topic, undecodable)
        if stats is not None:
            stats.descriptors_skipped += 1
    objects_prefix = keys.storage_objects_prefix(topic)
    index_key = keys.storage_index(topic)
    index: CatalogIndex | None = None
    indexed: tuple[ObjectDescriptor, ...] = ()
    parsed: list[ObjectDescriptor] = []
    for item in listing.items:
        if item.key == index_key:
            index = CatalogIndex.from_dict(item.value, item.key)
            if previous is not None and previous.index == index:
                indexed = previous.objects[: previous.indexed]
            else:
                if objects is None:
                    raise DescriptorError(
                        f"{item.key}: the catalog has an index object; reading it needs "
                        "the object store"
                    )
                indexed = decode_index(await objects.get(index.object_id), index.object_id)
            continue
        if not item.key.startswith(objects_prefix):
            continue
        try:
            descriptor = ObjectDescriptor.from_dict(item.value, item.key)
            _, start = keys.parse_storage_object_key(item.key)
            if start != descriptor.start:
                raise DescriptorError(
                    f"{item.key}: key says start {start}, value {descriptor.start}"
                )
        except (DescriptorError, keys.KeyLayoutError) as exc:
            log.warning("storage %s: skipping descriptor: %s", topic, exc)
            if stats is not None:
                stats.descriptors_skipped += 1
            continue
        parsed.append(descriptor)
    parsed.sort(key=lambda d: d.start)
    found: list[ObjectDescriptor] = list(indexed)
    for descriptor in parsed:
        if found and descriptor.start <= found[-1].end:
            # The uploader never writes overlaps; one found here came from outside. Keep the
            # earlier object so a reader never sees an offset twice.
            log.error(
                "storage %s: descriptor %d..%d overlaps %d..%d; ignoring it",
                topic,
                descriptor.start,
                descriptor.end,
                found[-1].start,
                found[-1].end,
            )
            if stats is not None:
                stats.descriptors_skipped += 1
            continue
        found.append(descriptor)
    return ObjectCatalog(tuple(found), listing.revision, index, len(indexed))


@dataclass(frozen=True)
class StoredSize:
    """What a topic keeps in the object store, from its metadata alone."""

    objects: int
    bytes: int
    first_offset: int | None
    last_offset: int | None
    descriptor_keys: int  # keys in the metadata store (the rest are in the index object)

    def to_dict(self) -> dict[str, Any]:
        return {
            "objects": self.objects,
            "bytes": self.bytes,
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
            "descriptor_keys": self.descriptor_keys,
        }


async def stored_size(store: MetadataStore, topic: TopicName) -> StoredSize:
    """The topic's objects, bytes and offsets (index key plus descriptor keys; bad keys are
    left out, as `load_catalog` does)."""
    listing = await store.get_prefix(keys.storage_topic_prefix(topic))
    objects_prefix = keys.storage_objects_prefix(topic)
    index: CatalogIndex | None = None
    keyed: list[ObjectDescriptor] = []
    for item in listing.items:
        try:
            if item.key == keys.storage_index(topic):
                index = CatalogIndex.from_dict(item.value, item.key)
            elif item.key.startswith(objects_prefix):
                keyed.append(ObjectDescriptor.from_dict(item.value, item.key))
        except DescriptorError:
            continue
    starts = [d.start for d in keyed] + ([index.start] if index is not None else [])
    ends = [d.end for d in keyed] + ([index.end] if index is not None else [])
    return StoredSize(
        objects=len(keyed) + (index.count if index is not None else 0),
        bytes=sum(d.size for d in keyed) + (index.size if index is not None else 0),
        first_offset=min(starts) if starts else None,
        last_offset=max(ends) if ends else None,
        descriptor_keys=len(keyed),
    )


class PublishOutcome(StrEnum):
    """Result of writing a descriptor."""

    CREATED = "created"
    ALREADY_PRESENT = "already_present"  # an earlier attempt of ours got through
    CONFLICT = "conflict"  # another range starts at the same offset


async def publish_descriptor(
    store: MetadataStore, topic: TopicName, descriptor: ObjectDescriptor
) -> tuple[PublishOutcome, ObjectDescriptor | None]:
    """Create the descriptor key unless it exists; idempotent for the same range.

    Create-if-absent makes a retried write safe: if a previous attempt reached the store
    but its reply was lost, the existing descriptor has the same range and counts as done.
    """
    key = keys.storage_object(topic, descriptor.start)
    if await store.create_if_absent(key, descriptor.to_dict()):
        return PublishOutcome.CREATED, descriptor
    existing_kv = await store.get(key)
    if existing_kv is None:  # deleted between the two calls: try once more
        if await store.create_if_absent(key, descriptor.to_dict()):
            return PublishOutcome.CREATED, descriptor
        existing_kv = await store.get(key)
    existing = None
    if existing_kv is not None:
        try:
            existing = ObjectDescriptor.from_dict(existing_kv.value, key)
        except DescriptorError:
            existing = None
    if existing is not None and existing.end == descriptor.end:
        return PublishOutcome.ALREADY_PRESENT, existing
    return PublishOutcome.CONFLICT, existing
