"""Counters of the storage engine, shared by every topic of a broker and exported by it.

The storage layer has no metrics dependency: the broker passes one `StorageStats` to every
topic and publishes the numbers (Prometheus, logs). Counters only ever increase.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["StorageStats"]


@dataclass
class StorageStats:
    """Monotonic counters; mutable on purpose (it is an accumulator, not a value)."""

    appended_records: int = 0
    appended_bytes: int = 0
    wal_batches: int = 0
    wal_fsyncs: int = 0
    wal_truncated_tails: int = 0
    wal_truncated_bytes: int = 0
    wal_dropped_segments: int = 0
    wal_segments_deleted: int = 0
    objects_uploaded: int = 0
    descriptor_commits: int = 0  # metadata transactions committing descriptors
    stream_objects: int = 0  # objects the broker's commit stream wrote
    stream_parts: int = 0  # topics' parts in them (parts / objects: topics per write)
    shared_objects_swept: int = 0  # shared objects no topic referred to any more, deleted
    bytes_uploaded: int = 0
    upload_failures: int = 0  # failed attempts to write an object or commit a descriptor
    object_write_waits: int = 0  # object writes that waited for the broker's write pacer
    objects_merged: int = 0  # small committed objects rewritten into bigger ones
    objects_released: int = 0  # objects deleted by the namespace's retention
    descriptors_indexed: int = 0  # descriptor keys moved into topics' index objects
    ack_timeouts: int = 0  # appends not committed to object storage in time (not acked)
    reader_retries: int = 0  # subscription readers restarted after a storage error
    descriptors_skipped: int = 0
    cursor_flushes: int = 0
    # Acked offsets above a cursor left out of its stored value (`cursor_ack_ranges`),
    # counted at each write that left them out: delivered again after a move.
    ack_ranges_dropped: int = 0
    reader_gaps: int = 0  # holes a reader stepped over that no recorded gap explains
    reader_known_gaps: int = 0  # recorded gaps (skipped offsets) a reader stepped over
    reservation_extensions: int = 0  # metadata writes extending an offset reservation
    reservation_stalls: int = 0  # appends that waited for a reservation extension
    opens_by_source: Counter[str] = field(default_factory=Counter)
    seals: int = 0

    def snapshot(self) -> dict[str, object]:
        """A plain-dict copy for logging or JSON."""
        data: dict[str, object] = {
            name: getattr(self, name)
            for name in self.__dataclass_fields__
            if name != "opens_by_source"
        }
        data["opens_by_source"] = dict(self.opens_by_source)
        return data
