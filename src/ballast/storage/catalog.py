"""The object catalog: descriptors of a topic's objects, kept in the metadata store.

A descriptor lives at ``keys.storage_object(topic, start)`` and says which object holds
the offsets ``start..end``. The catalog is the union of a topic's descriptors; the
uploader's checkpoint is derived from it (its highest `end`), so it survives restarts and
moves without a checkpoint file of its own.
"""

from __future__ import annotations

import bisect
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ballast.metadata import keys
from ballast.metadata.store import MetadataStore
from ballast.model import TopicName
from ballast.storage.stats import StorageStats

__all__ = [
    "DescriptorError",
    "ObjectCatalog",
    "ObjectDescriptor",
    "PublishOutcome",
    "load_catalog",
    "publish_descriptor",
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

    def contains(self, offset: int) -> bool:
        """True if `offset` lies in this object's range."""
        return self.start <= offset <= self.end

    def to_dict(self) -> dict[str, Any]:
        """JSON form stored in the metadata store."""
        return {
            "start": self.start,
            "end": self.end,
            "object_id": self.object_id,
            "size": self.size,
            "created": self.created,
        }

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
        return cls(start, end, object_id, _int(data, "size", ctx), float(created))


@dataclass(frozen=True)
class ObjectCatalog:
    """A topic's descriptors sorted by start offset, without overlaps."""

    objects: tuple[ObjectDescriptor, ...] = ()
    revision: int = 0

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
    store: MetadataStore, topic: TopicName, stats: StorageStats | None = None
) -> ObjectCatalog:
    """Read every descriptor of `topic`; malformed or overlapping ones are logged and skipped."""
    listing = await store.get_prefix(keys.storage_objects_prefix(topic))
    for undecodable in listing.undecodable:
        log.warning("storage %s: skipping descriptor: %s", topic, undecodable)
        if stats is not None:
            stats.descriptors_skipped += 1
    parsed: list[ObjectDescriptor] = []
    for item in listing.items:
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
    objects: list[ObjectDescriptor] = []
    for descriptor in parsed:
        if objects and descriptor.start <= objects[-1].end:
            # The uploader never writes overlaps; one found here came from outside. Keep the
            # earlier object so a reader never sees an offset twice.
            log.error(
                "storage %s: descriptor %d..%d overlaps %d..%d; ignoring it",
                topic,
                descriptor.start,
                descriptor.end,
                objects[-1].start,
                objects[-1].end,
            )
            if stats is not None:
                stats.descriptors_skipped += 1
            continue
        objects.append(descriptor)
    return ObjectCatalog(tuple(objects), listing.revision)


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
