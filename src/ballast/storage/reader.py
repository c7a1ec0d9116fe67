"""The tiered reader: one ordered stream from object storage, the WAL and live appends.

From any start offset the reader serves offsets older than the local WAL from object
storage (following the catalog), then the WAL's files and cache, then waits for new
commits. Each step starts exactly where the previous one stopped, so the switch is
invisible: no gap, no duplicate. Each record says which tier served it.

Offsets skipped after a crash (the topic's recorded `gaps`) never hold a message: the
reader steps over them at once instead of looking for them or waiting. Inside the WAL's
committed range an offset the WAL does not hold never will, so the reader moves on there
too; holes in object storage that no gap explains are skipped with a warning.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from enum import StrEnum

from ballast.metadata.store import MetadataStore
from ballast.model import TopicName
from ballast.storage.catalog import ObjectCatalog, load_catalog
from ballast.storage.codec import Record
from ballast.storage.objects import ObjectStore
from ballast.storage.seal import Gap, gap_end_after
from ballast.storage.stats import StorageStats
from ballast.storage.wal import OffsetUnavailableError, WriteAheadLog

__all__ = ["Tier", "TieredRecord", "read_tiered"]

log = logging.getLogger(__name__)


class Tier(StrEnum):
    """Where a record came from."""

    OBJECT = "object"  # object storage (older than the local WAL)
    WAL = "wal"  # the local WAL, already committed when the reader got there
    LIVE = "live"  # committed while the reader was waiting for it


@dataclass(frozen=True, slots=True)
class TieredRecord:
    """A record and the tier that served it."""

    record: Record
    tier: Tier

    @property
    def offset(self) -> int:
        """The record's offset."""
        return self.record.offset


async def read_tiered(
    topic: TopicName,
    wal: WriteAheadLog,
    objects: ObjectStore,
    metadata: MetadataStore,
    from_offset: int,
    *,
    live: bool = True,
    stats: StorageStats | None = None,
    batch_records: int = 1024,
    gaps: Sequence[Gap] = (),
) -> AsyncGenerator[TieredRecord, None]:
    """Yield every record from `from_offset` on, in offset order, each exactly once.

    With `live=False` the stream ends once it has caught up with the committed offset;
    with `live=True` it then waits for new records until the WAL closes. `gaps` (sorted,
    disjoint) are offsets known to hold no message.
    """
    if from_offset < 0:
        raise ValueError(f"from_offset must be >= 0, got {from_offset}")
    stats = stats or StorageStats()
    next_offset = from_offset
    catalog: ObjectCatalog | None = None
    waited = False
    while True:
        after = gap_end_after(gaps, next_offset)
        if after != next_offset:
            stats.reader_known_gaps += 1
            log.debug(
                "reader %s: stepping over skipped offsets %d..%d", topic, next_offset, after - 1
            )
            next_offset = after
        if next_offset < wal.first_offset:
            descriptor = catalog.find(next_offset) if catalog is not None else None
            if descriptor is None:
                # New objects may have been uploaded since the last listing.
                catalog = await load_catalog(
                    metadata, topic, stats, objects=objects, previous=catalog
                )
                descriptor = catalog.find(next_offset)
            if descriptor is None:
                next_offset = _skip_hole(topic, catalog, next_offset, wal.first_offset, stats)
                continue
            stream = descriptor.records(objects, next_offset)
            async with contextlib.aclosing(stream):
                async for record in stream:
                    if record.offset >= wal.first_offset:
                        break  # the rest is local: cheaper to read from the WAL
                    yield TieredRecord(record, Tier.OBJECT)
                    next_offset = record.offset + 1
            continue
        committed = wal.committed_offset
        if next_offset <= committed:
            try:
                records = await wal.read(next_offset, batch_records)
            except OffsetUnavailableError:
                continue  # retention just removed it: it is in object storage now
            if not records:
                # Nothing from here to `committed` in the WAL: those offsets were skipped
                # (a gap) and will never exist. Later commits are above `committed`.
                next_offset = committed + 1
                continue
            tier = Tier.LIVE if waited else Tier.WAL
            waited = False
            for record in records:
                yield TieredRecord(record, tier)
                next_offset = record.offset + 1
            continue
        if not live:
            return
        if not await wal.wait_for(next_offset):
            return  # the WAL closed (topic sealed or stopped)
        waited = True


def _skip_hole(
    topic: TopicName,
    catalog: ObjectCatalog | None,
    offset: int,
    wal_first: int,
    stats: StorageStats,
) -> int:
    """Where to continue when `offset` is in neither object storage nor the WAL."""
    following = catalog.next_start_after(offset) if catalog is not None else None
    target = wal_first if following is None else min(following, wal_first)
    first_known = catalog.start if catalog is not None and catalog.start is not None else None
    if first_known is None or offset >= first_known:
        # A hole in the middle: messages lost (e.g. a crashed owner's un-uploaded tail).
        stats.reader_gaps += 1
        log.warning(
            "reader %s: offsets %d..%d are unavailable; skipping", topic, offset, target - 1
        )
    return target
