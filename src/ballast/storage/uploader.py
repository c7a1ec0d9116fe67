"""The uploader: moves the WAL's committed records into object storage.

Every `upload_interval_seconds`, or as soon as `upload_threshold_bytes` are waiting, the
range after the checkpoint is packed into objects of at most `max_object_bytes`. Each
object is written first and its descriptor second, so a descriptor never names a missing
object; a crash in between leaves only an orphan object that nothing references. The
descriptor is created only if absent, so a retried or repeated upload never duplicates a
range. The checkpoint is the highest uploaded offset: it comes from the catalog on start,
so it survives restarts and moves. An object never spans a gap in the offsets (see
`WriteAheadLog.open`): the range after a gap starts a new object.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Self, TypeVar

from ballast.aio import LoopTasks, tick
from ballast.clock import Clock
from ballast.metadata.store import MetadataError, MetadataStore
from ballast.model import TopicName
from ballast.storage.catalog import ObjectDescriptor, PublishOutcome, publish_descriptor
from ballast.storage.config import StorageConfig
from ballast.storage.objects import ObjectBuilder, ObjectStore, ObjectStoreError
from ballast.storage.seal import Gap, gap_end_after
from ballast.storage.stats import StorageStats
from ballast.storage.wal import WriteAheadLog

__all__ = ["UploadConflictError", "Uploader", "object_name"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Failures worth retrying: the store or the network, not our own bugs.
RETRYABLE: tuple[type[BaseException], ...] = (
    ObjectStoreError,
    MetadataError,
    OSError,
    TimeoutError,
    ConnectionError,
)


class UploadConflictError(Exception):
    """The catalog holds something the uploader cannot reconcile (names the key)."""


def object_name(topic: TopicName, start: int, end: int) -> str:
    """A fresh object name for the range; the random part keeps retries from overwriting."""
    return f"{topic.namespace}/{topic.name}/{start:020d}-{end:020d}-{uuid.uuid4().hex[:12]}.bobj"


class Uploader:
    """Uploads one topic's WAL; an async context manager owning its loop and timer tasks."""

    def __init__(
        self,
        topic: TopicName,
        wal: WriteAheadLog,
        objects: ObjectStore,
        metadata: MetadataStore,
        *,
        clock: Clock,
        config: StorageConfig | None = None,
        stats: StorageStats | None = None,
        checkpoint: int = -1,
        gaps: Sequence[Gap] = (),
    ) -> None:
        self.topic = topic
        self._wal = wal
        self._objects = objects
        self._metadata = metadata
        self._clock = clock
        self._config = config or StorageConfig()
        self._stats = stats or StorageStats()
        self._checkpoint = checkpoint
        self._gaps = tuple(gaps)  # skipped offsets: nothing to upload there
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._loops = LoopTasks()
        self._name = f"uploader{topic}"
        wal.mark_uploaded(checkpoint)

    @property
    def checkpoint(self) -> int:
        """Highest offset known to be in object storage."""
        return self._checkpoint

    def trigger(self) -> None:
        """Ask for an upload pass now (the WAL calls this at the size threshold)."""
        self._wake.set()

    async def __aenter__(self) -> Self:
        await self._loops.start(
            {
                f"{self._name}/loop": self._loop(),
                f"{self._name}/timer": tick(
                    self._clock, self._config.upload_interval_seconds, self._wake
                ),
            }
        )
        self._wal.set_upload_trigger(self.trigger)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # No final upload here: what is not uploaded stays in the durable local WAL and is
        # uploaded after a restart. A seal drains explicitly before stopping the uploader.
        # The loops sleep on the injected clock (which may never move again): cancel them.
        await self._loops.stop(exc_type, exc, tb)

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.upload_pending()

    async def drain(self) -> int:
        """Upload everything committed so far; returns the checkpoint (used by seal)."""
        return await self.upload_pending()

    async def upload_pending(self) -> int:
        """One pass: upload up to the WAL's committed offset, retrying failures."""
        async with self._lock:
            target = self._wal.committed_offset
            while self._checkpoint < target:
                start = self._checkpoint + 1
                first_local = self._wal.first_offset
                if start < first_local:
                    # Not in the local WAL and not uploaded: skipped on open (a recorded
                    # gap), or lost before this broker got it. Nothing to upload.
                    if gap_end_after(self._gaps, start) < first_local:
                        log.error(
                            "%s: offsets %d..%d are neither uploaded nor local; skipping them",
                            self._name,
                            start,
                            first_local - 1,
                        )
                    self._checkpoint = first_local - 1
                    continue
                builder = ObjectBuilder(self._config.index_interval_bytes)
                cursor = start
                contiguous = True
                while (
                    contiguous and cursor <= target and builder.size < self._config.max_object_bytes
                ):
                    records = await self._wal.read(cursor, max_records=4096)
                    if not records:
                        break
                    for record in records:
                        if builder.end is not None and record.offset != builder.end + 1:
                            contiguous = False  # a gap: the rest goes into the next object
                            break
                        builder.add(record)
                        cursor = record.offset + 1
                        if builder.size >= self._config.max_object_bytes:
                            break
                if builder.count == 0:
                    # Nothing in start..target although committed: skipped offsets (a gap
                    # at the end of the WAL). Nothing to upload there, ever.
                    self._checkpoint = target
                    self._wal.mark_uploaded(target)
                    break
                await self._upload_object(builder)
        await self._wal.apply_retention()
        return self._checkpoint

    async def _upload_object(self, builder: ObjectBuilder) -> None:
        start, end = builder.start, builder.end
        assert start is not None and end is not None
        data = builder.finish()
        name = object_name(self.topic, start, end)
        await self._retrying(f"writing object {name}", lambda: self._objects.put(name, data))
        descriptor = ObjectDescriptor(start, end, name, len(data), self._clock.now())
        outcome, existing = await self._retrying(
            f"writing descriptor {start}..{end}",
            lambda: publish_descriptor(self._metadata, self.topic, descriptor),
        )
        if outcome is PublishOutcome.CREATED:
            self._checkpoint = end
            self._stats.objects_uploaded += 1
            self._stats.bytes_uploaded += len(data)
            log.debug("%s: uploaded %d..%d as %s", self._name, start, end, name)
        else:
            if existing is None:
                raise UploadConflictError(
                    f"{self._name}: a malformed descriptor occupies offset {start}; "
                    "fix or delete that key"
                )
            # The range (or its beginning) is already described, e.g. by an attempt whose
            # reply was lost. The catalog wins: adopt its end and drop our copy.
            if outcome is PublishOutcome.CONFLICT:
                log.warning(
                    "%s: offset %d already uploaded as %d..%d; continuing after it",
                    self._name,
                    start,
                    existing.start,
                    existing.end,
                )
            self._checkpoint = max(self._checkpoint, existing.end)
            if existing.object_id != name:
                try:
                    await self._objects.delete(name)
                except ObjectStoreError as exc:
                    log.warning("%s: could not delete orphan %s: %s", self._name, name, exc)
        self._wal.mark_uploaded(self._checkpoint, len(data))

    async def _retrying(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        """Run `op` until it succeeds, backing off exponentially on retryable failures."""
        delay = self._config.upload_retry_initial_seconds
        attempt = 0
        while True:
            try:
                return await op()
            except RETRYABLE as exc:
                attempt += 1
                self._stats.upload_failures += 1
                log.warning(
                    "%s: %s failed (attempt %d), retrying in %.2fs: %s",
                    self._name,
                    what,
                    attempt,
                    delay,
                    exc,
                )
                await self._clock.sleep(delay)
                delay = min(delay * 2, self._config.upload_retry_max_seconds)
