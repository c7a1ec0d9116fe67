"""The uploader: moves the WAL's records into object storage and commits them there.

A reliable topic acknowledges a send only once the record is in object storage and its
object's descriptor is committed under the owner's claim (`TopicClaim.commit`, fenced on
the topic's state): the object store is the commit point, the local WAL a buffer and a
read cache. So a new owner — after a move, a crash, a stall or the loss of the whole host —
finds every acknowledged record in the catalog, and a deposed owner (its claim overwritten
by the new owner's) cannot commit, hence cannot acknowledge.

With a claim (`ReliableTopic` always passes one) every WAL commit wakes the uploader; a
pass packs everything committed to the WAL since the last pass into one object, so the
number of objects follows the passes (one in flight at a time), not the sends: appends
that arrive while a pass runs go together into the next one. Those small objects are
later rewritten into one (`_merge`: at most `merge_objects` of them, or every
`upload_interval_seconds`), its descriptor replacing theirs in one fenced transaction, so
the catalog stays small; the old objects are deleted after `merge_grace_seconds`.

Without a claim (the storage engine's own tests) the uploader works as a background
mover: every `upload_interval_seconds`, or once `upload_threshold_bytes` wait, with
create-if-absent descriptors.

Each object is written first and its descriptor second, so a descriptor never names a
missing object; a crash in between leaves only an orphan object that nothing references.
The checkpoint is the highest committed offset: it comes from the catalog on start, so it
survives restarts and moves. An object never spans a gap in the offsets (see
`WriteAheadLog.open`): the range after a gap starts a new object. Failures of the object
store or the metadata store are retried with backoff, counted and logged once per outage;
the loop itself never dies of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
import math
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Self, TypeVar

from ballast.aio import LoopTasks
from ballast.clock import Clock
from ballast.metadata import keys
from ballast.metadata.store import Delete, MetadataError, MetadataStore, Put, TxnOp
from ballast.model import TopicName
from ballast.storage.catalog import (
    CatalogIndex,
    ObjectCatalog,
    ObjectDescriptor,
    PublishOutcome,
    encode_index,
    load_catalog,
    publish_descriptor,
)
from ballast.storage.codec import Record
from ballast.storage.config import StorageConfig
from ballast.storage.objects import ObjectBuilder, ObjectStore, ObjectStoreError
from ballast.storage.reservation import TopicClaim, TopicFencedError
from ballast.storage.retention import (
    RetentionError,
    RetentionPolicies,
    RetentionPolicy,
    lowest_cursor,
    releasable,
)
from ballast.storage.seal import Gap, gap_end_after
from ballast.storage.stats import StorageStats
from ballast.storage.stream import CommitStream, object_name
from ballast.storage.ticker import Ticker
from ballast.storage.turns import Turns
from ballast.storage.wal import OffsetUnavailableError, WalClosedError, WriteAheadLog

__all__ = ["DurabilityTimeoutError", "UploadConflictError", "Uploader"]

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

# At most this many descriptors change in one merge or commit (etcd allows 128 operations
# per transaction).
_MERGE_MAX = 100
# While sends wait for their object, a merge takes at most this many objects: each pass
# of the loop writes what waits, then merges one such group (reads that do not hold the
# next acknowledgements for long).
_MERGE_MAX_BUSY = 16
_COMMIT_BATCH = 100
_INDEX_CHUNK = 100  # descriptor keys removed per transaction (etcd: 128 operations)
# An idle topic whose objects retention could release is looked at every this many upload
# intervals (a policy set meanwhile applies then).
_POLICY_LOOKS_EVERY = 10


class UploadConflictError(Exception):
    """The catalog holds something the uploader cannot reconcile (names the key)."""


class DurabilityTimeoutError(Exception):
    """An append was not committed to object storage in time (it may be later)."""


def index_name(topic: TopicName, end: int) -> str:
    """A fresh name for an index object covering descriptors up to offset `end`."""
    return f"{topic.namespace}/{topic.name}/index-{end:020d}-{uuid.uuid4().hex[:12]}.json"


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
        claim: TopicClaim | None = None,
        catalog: ObjectCatalog | None = None,
        stream: CommitStream | None = None,
        ticker: Ticker | None = None,
        policies: RetentionPolicies | None = None,
    ) -> None:
        """With a `claim`, objects are written and committed through `stream`; `ticker`
        wakes the periodic work and `policies` caches the namespaces' retention (all three
        the broker's, shared by its topics; the uploader's own otherwise)."""
        if claim is not None and stream is None:
            raise ValueError(f"uploader{topic}: a claimed topic commits through a CommitStream")
        self.topic = topic
        self._wal = wal
        self._objects = objects
        self._metadata = metadata
        self._clock = clock
        self._config = config or StorageConfig()
        self._stats = stats or StorageStats()
        self._stream = stream
        self._own_ticker = ticker is None
        self._ticker = ticker or Ticker(clock)
        self._policies = policies or RetentionPolicies(
            metadata, clock, self._config.upload_interval_seconds
        )
        self._retaining = False  # the namespace's policy may release objects
        self._checkpoint = checkpoint
        self._written = checkpoint  # highest offset written to an object (committed or not)
        # With a claim: what was written and waits for its commit, in offset order (a
        # descriptor, or None for skipped offsets), with the range's end.
        self._to_commit: asyncio.Queue[tuple[ObjectDescriptor | None, int, int]] = asyncio.Queue()
        self._gaps = tuple(gaps)  # skipped offsets: nothing to upload there
        self._claim = claim
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._committed = asyncio.Event()  # replaced after each commit (see _notify)
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # heap by offset
        self._seq = itertools.count()
        self._committing = 0  # objects in the commit transaction under way
        self._last_put = -math.inf  # loop time of the last object written (the linger)
        self._last_records = 0  # records in it
        self._failure: BaseException | None = None  # fenced: nothing commits any more
        self._stopped = False
        self._loops = LoopTasks()
        self._name = f"uploader{topic}"
        # Small objects committed and not merged yet (contiguous runs, in offset order).
        self._small: list[ObjectDescriptor] = _small_tail(catalog, self._config)
        # The catalog's index object (older descriptors) and how many descriptor keys the
        # topic has (an estimate between compactions, see `_compact`).
        self._index = catalog.index if catalog is not None else None
        self._indexed = list(catalog.objects[: catalog.indexed]) if catalog is not None else []
        self._keys = len(catalog.keyed) if catalog is not None else 0
        # What the topic keeps in the object store (metrics).
        self.stored_objects = len(catalog.objects) if catalog is not None else 0
        self.stored_bytes = catalog.size if catalog is not None else 0
        self._last_merge = clock.now()
        self._last_retention = -math.inf
        # (delete after, object, its descriptor): merged or released objects, old indexes.
        self._garbage: deque[tuple[float, str, ObjectDescriptor | None]] = deque()
        self._failing = False  # in an outage: log its end once
        wal.mark_uploaded(checkpoint)

    @property
    def checkpoint(self) -> int:
        """Highest offset committed to object storage."""
        return self._checkpoint

    def trigger(self) -> None:
        """The WAL committed records: upload now (with a claim) or at the size threshold."""
        if self._claim is not None or (
            self._wal.unuploaded_bytes >= self._config.upload_threshold_bytes
        ):
            self._wake.set()
        else:  # the background mover: at the next tick
            self._ticker.soon(self._config.upload_interval_seconds, self._wake)

    async def wait_committed(self, offset: int, timeout: float) -> None:
        """Return once `offset` is committed to object storage.

        Raises `TopicFencedError` if another broker took the topic over first,
        `DurabilityTimeoutError` after `timeout` seconds (object or metadata store down),
        `WalClosedError` if the uploader stopped (a seal gave up, the topic closed).
        """
        if self._checkpoint >= offset:
            return
        if self._failure is not None:
            raise self._failure
        if self._stopped:
            raise WalClosedError(f"{self._name}: stopped before offset {offset} was committed")
        # One future per waiting append, resolved in offset order by `_notify` (cheaper
        # than waking every waiter at every commit).
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (offset, next(self._seq), waiter))
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            self._stats.ack_timeouts += 1
            raise DurabilityTimeoutError(
                f"{self.topic}: offset {offset} not committed to object storage within "
                f"{timeout:.0f}s (object store {self._objects.url} or metadata store "
                "unavailable?)"
            ) from None
        finally:
            waiter.cancel()  # resolved or given up: no-op, or nobody will wait for it

    def _notify(self) -> None:
        """Wake whoever waits for what is committed now (or for the end)."""
        event, self._committed = self._committed, asyncio.Event()
        event.set()
        waiters = self._waiters
        if self._failure is not None or self._stopped:
            failure = self._failure or WalClosedError(
                f"{self._name}: stopped before the offsets were committed"
            )
            while waiters:
                _, _, waiter = heapq.heappop(waiters)
                if not waiter.done():
                    waiter.set_exception(failure)
            return
        while waiters and waiters[0][0] <= self._checkpoint:
            _, _, waiter = heapq.heappop(waiters)
            if not waiter.done():
                waiter.set_result(None)

    async def __aenter__(self) -> Self:
        self._ticker.start(self._config.upload_interval_seconds)
        loops = {f"{self._name}/loop": self._loop()}
        if self._claim is not None:
            loops[f"{self._name}/commit"] = self._commit_loop()
        await self._loops.start(loops)
        self._wal.set_upload_trigger(self.trigger)
        if self._wal.committed_offset > self._checkpoint:
            self._wake.set()  # kept local records (a restart): commit them
        self._rearm()  # objects left to merge or retain by earlier owners
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # No final upload here: a seal drains explicitly before stopping the uploader, and
        # what is not committed was not acknowledged. The loops sleep on the injected clock
        # (which may never move again): cancel them.
        self._stopped = True
        self._notify()
        self._ticker.forget(self._wake)
        if self._stream is not None:
            self._stream.merges.forget(self._wake)
        if self._own_ticker:
            await self._ticker.close()
        await self._loops.stop(exc_type, exc, tb)

    async def _loop(self) -> None:
        delay = self._config.upload_retry_initial_seconds
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                if self._claim is not None and self._last_records > 1:
                    # Concurrent senders: linger a moment after the previous object, so
                    # that sends arriving meanwhile share the next object and commit
                    # (fewer, fuller commits). A lone sender never waits.
                    loop = asyncio.get_running_loop()
                    linger = self._last_put + self._config.commit_linger_seconds - loop.time()
                    if linger > 0:
                        await asyncio.sleep(linger)
                # Write what the WAL holds; with a claim the commit loop commits it
                # meanwhile, so the next objects are written while earlier ones commit.
                async with self._lock:
                    await self._write_objects(self._wal.committed_offset)
                if self._claim is not None:
                    await self._merge_due()
                    if self._compaction_due():
                        async with self._lock:
                            await self._compact()
                    await self._retain_due()
                    await self._collect_garbage()
                await self._wal.apply_retention()
                delay = self._config.upload_retry_initial_seconds
                self._rearm()
            except TopicFencedError as exc:
                self._failure = exc
                self._notify()
                log.warning("%s: %s; nothing more is committed here", self._name, exc)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug or an unexpected store error: never die of it
                self._stats.upload_failures += 1
                log.exception(
                    "%s: upload pass failed; retrying in %.2fs: %s", self._name, delay, exc
                )
                await self._clock.sleep(delay)
                delay = min(delay * 2, self._config.upload_retry_max_seconds)
                self._wake.set()

    def _rearm(self) -> None:
        """Ask the broker's ticker for another pass if periodic work is pending (an idle
        topic with nothing pending asks nothing: it is never woken)."""
        interval = self._config.upload_interval_seconds
        if self._claim is None:
            pending = self._wal.committed_offset > self._checkpoint
        else:
            pending = len(self._small) > 1 or bool(self._garbage) or self._retaining
        if pending or self._wal.segment_count > 1:
            self._ticker.soon(interval, self._wake)
        elif self._claim is not None and self.stored_objects > 1:
            # Retention may apply once a policy is set (it keeps the newest object): look
            # again now and then.
            self._ticker.soon(interval * _POLICY_LOOKS_EVERY, self._wake)

    async def drain(self) -> int:
        """Upload everything committed so far; returns the checkpoint (used by seal)."""
        if self._failure is not None:
            raise self._failure
        return await self.upload_pending()

    async def upload_pending(self) -> int:
        """One pass: upload (and, with a claim, commit) up to the WAL's committed offset,
        retrying failures; returns the checkpoint."""
        async with self._lock:
            target = self._wal.committed_offset
            await self._write_objects(target)
        if self._claim is not None:
            await self._until_committed(target)
        await self._wal.apply_retention()
        return self._checkpoint

    async def _until_committed(self, offset: int) -> None:
        while self._checkpoint < offset:
            if self._failure is not None:
                raise self._failure
            await self._committed.wait()

    async def _write_objects(self, target: int) -> None:
        """Write objects for everything after `_written` up to `target`: uploaded whole
        without a claim, handed to the commit loop with one."""
        while self._written < target:
            start = self._written + 1
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
                self._skipped(first_local - 1)
                continue
            if self._claim is not None:
                target = max(target, self._wal.committed_offset)
            builder = ObjectBuilder(self._config.index_interval_bytes)
            cursor = start
            contiguous = True
            while contiguous and cursor <= target and builder.size < self._config.max_object_bytes:
                records = await self._wal.read(cursor, max_records=4096)
                if not records:
                    break
                for record in records:
                    if record.offset > target:
                        break
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
                self._skipped(target)
                break
            if self._claim is not None:
                await self._put_object(builder)
                # One object may be written while the previous one commits, no more:
                # what arrives meanwhile goes into the next object (group commit), so
                # objects follow the commits, not the sends.
                while self._to_commit.qsize() + self._committing > 1:
                    if self._failure is not None:
                        raise self._failure
                    await self._committed.wait()
                target = max(target, self._wal.committed_offset)
            else:
                await self._upload_object(builder)

    def _skipped(self, end: int) -> None:
        """Offsets up to `end` hold nothing to upload (a gap)."""
        self._written = end
        if self._claim is not None:
            self._to_commit.put_nowait((None, end, 0))  # in order, after earlier commits
            return
        self._checkpoint = end
        self._wal.mark_uploaded(end)
        self._notify()

    async def _write_object(self, builder: ObjectBuilder) -> ObjectDescriptor:
        """Write the builder's object (retrying); its descriptor, not yet published."""
        start, end = builder.start, builder.end
        assert start is not None and end is not None
        data = builder.finish()
        name = object_name(self.topic, start, end)
        await self._retrying(f"writing object {name}", lambda: self._objects.put(name, data))
        return ObjectDescriptor(start, end, name, len(data), self._clock.now())

    async def _put_object(self, builder: ObjectBuilder) -> None:
        """Write the object through the broker's stream (with other topics' parts); its
        commit follows in `_commit_loop` (in offset order)."""
        start, end, stream = builder.start, builder.end, self._stream
        assert start is not None and end is not None and stream is not None
        data = builder.finish()
        descriptor = await self._retrying(
            f"writing object {start}..{end}",
            functools.partial(stream.write, self.topic, start, end, data),
        )
        self._written = descriptor.end
        self._last_put = asyncio.get_running_loop().time()
        self._last_records = builder.count
        self._to_commit.put_nowait((descriptor, descriptor.end, descriptor.size))

    async def _commit_loop(self) -> None:
        """Commit written objects in order; everything waiting goes in one transaction."""
        claim = self._claim
        assert claim is not None
        while True:
            batch = [await self._to_commit.get()]
            while not self._to_commit.empty() and len(batch) < _COMMIT_BATCH:
                batch.append(self._to_commit.get_nowait())
            self._committing = len(batch)
            ops: list[TxnOp] = [
                Put(keys.storage_object(self.topic, d.start), d.to_dict())
                for d, _, _ in batch
                if d is not None
            ]
            if ops:
                try:
                    await self._retrying(
                        f"committing {len(ops)} object(s) up to {batch[-1][1]}",
                        functools.partial(self._commit, claim, ops),
                    )
                except TopicFencedError as exc:
                    self._failure = exc
                    self._notify()
                    log.warning("%s: %s; nothing more is committed here", self._name, exc)
                    return
            self._keys += len(ops)
            for descriptor, end, nbytes in batch:
                if descriptor is not None:
                    self._committed_range(descriptor, nbytes)
                    self._small.append(descriptor)
                else:
                    self._checkpoint = end
                    self._wal.mark_uploaded(end)
            self._committing = 0
            self._notify()
            if len(self._small) >= self._config.merge_objects:
                self._wake.set()  # the loop merges them

    async def _commit(self, claim: TopicClaim, ops: list[TxnOp]) -> None:
        """Commit `ops` under the claim in the broker's next shared transaction."""
        assert self._stream is not None
        await self._stream.commit(claim, ops)

    async def _upload_object(self, builder: ObjectBuilder) -> None:
        """Write the object, then publish its descriptor if absent (no claim)."""
        descriptor = await self._write_object(builder)
        start, end, name, size = (
            descriptor.start,
            descriptor.end,
            descriptor.object_id,
            descriptor.size,
        )
        outcome, existing = await self._retrying(
            f"writing descriptor {start}..{end}",
            lambda: publish_descriptor(self._metadata, self.topic, descriptor),
        )
        if outcome is PublishOutcome.CREATED:
            self._written = end
            self._committed_range(descriptor, size)
            return
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
        self._checkpoint = self._written = max(self._checkpoint, existing.end)
        if existing.object_id != name:
            try:
                await self._objects.delete(name)
            except ObjectStoreError as exc:
                log.warning("%s: could not delete orphan %s: %s", self._name, name, exc)
        self._wal.mark_uploaded(self._checkpoint, size)
        self._notify()

    def _committed_range(self, descriptor: ObjectDescriptor, nbytes: int) -> None:
        self._checkpoint = descriptor.end
        self.stored_objects += 1
        self.stored_bytes += descriptor.size
        self._stats.objects_uploaded += 1
        self._stats.bytes_uploaded += nbytes
        self._wal.mark_uploaded(descriptor.end, nbytes)
        self._notify()
        log.debug(
            "%s: committed %d..%d as %s",
            self._name,
            descriptor.start,
            descriptor.end,
            descriptor.object_id,
        )

    # -- merging small objects -------------------------------------------------------------

    async def _merge_due(self) -> None:
        """Merge a run of small objects when enough piled up or the interval passed, one
        run per turn: one topic of the broker reads for a merge at a time (`Turns`)."""
        assert self._stream is not None  # merging is a claimed topic's
        turns = self._stream.merges
        now = self._clock.now()
        due = len(self._small) >= self._config.merge_objects or (
            len(self._small) > 1 and now - self._last_merge >= self._config.upload_interval_seconds
        )
        if not due:
            turns.forget(self._wake)
            return
        if not turns.take(self._wake):
            return  # woken for its turn; meanwhile this loop goes on writing the sends
        self._last_merge = now
        try:
            async with self._lock:
                while len(self._small) > 1 and not await self._merge(turns):
                    pass
        finally:
            turns.give_back(self._wake)
        # Still as many small objects as make a merge due (a topic that moved brings
        # hundreds): the next run on its next turn, after the topics queued for one.
        # Fewer wait for the interval, as always (a busy topic must not merge every pass).
        if len(self._small) >= self._config.merge_objects:
            self._wake.set()

    async def _merge(self, turns: Turns) -> bool:
        """Rewrite the first run of small objects into one; False if there was none to
        merge with the first (it is dropped from the small ones), True once read (the
        turn is then given back: the write and commit go with other topics')."""
        most = _MERGE_MAX_BUSY if self._wal.committed_offset > self._written else _MERGE_MAX
        group = [self._small[0]]
        size = group[0].size
        for descriptor in self._small[1:]:
            if (
                descriptor.start != group[-1].end + 1
                or size + descriptor.size > self._config.max_object_bytes
                or len(group) >= most
            ):
                break
            group.append(descriptor)
            size += descriptor.size
        if len(group) < 2:
            self._small.pop(0)  # nothing to merge it with (a gap follows, or it is big)
            return False
        records = await self._records(group)
        turns.give_back(self._wake)
        builder = ObjectBuilder(self._config.index_interval_bytes)
        for record in records:
            builder.add(record)
        start, end = group[0].start, group[-1].end
        if builder.start != start or builder.end != end or builder.count != end - start + 1:
            log.warning(
                "%s: cannot merge %d..%d (records missing); left as is", self._name, start, end
            )
            del self._small[: len(group)]
            return True
        data = builder.finish()
        claim, stream = self._claim, self._stream
        assert claim is not None and stream is not None
        # Through the broker's stream, like the sends: the merges of many topics share
        # objects and transactions (one each per topic grew with the topics: 1 000 active
        # topics committed 4x as often as 32).
        merged = await self._retrying(
            f"writing merged object {start}..{end}",
            functools.partial(stream.write, self.topic, start, end, data),
        )
        ops: list[TxnOp] = [
            Put(keys.storage_object(self.topic, start), merged.to_dict()),
            *(Delete(keys.storage_object(self.topic, d.start)) for d in group[1:]),
        ]
        await self._retrying(
            f"committing merged {start}..{end}", functools.partial(stream.commit, claim, ops)
        )
        del self._small[: len(group)]
        self._keys -= len(group) - 1
        self.stored_objects -= len(group) - 1
        self.stored_bytes += merged.size - sum(d.size for d in group)
        after = self._clock.now() + self._config.merge_grace_seconds
        self._garbage.extend((after, d.object_id, d) for d in group)
        self._stats.objects_merged += len(group)
        log.debug(
            "%s: merged %d objects into %s (%d..%d)",
            self._name,
            len(group),
            merged.object_id,
            start,
            end,
        )
        return True

    # -- the index object -----------------------------------------------------------------

    def _compaction_due(self) -> bool:
        """Over the key budget, with keys a compaction can move: objects still to be
        merged stay keys (more of them may wait than the budget), and a compaction that
        could move none of them would list the catalog again after every commit."""
        budget = self._config.catalog_keys
        return self._keys > budget and self._keys - len(self._small) > budget // 4

    async def _compact(self) -> None:
        """Move the older descriptor keys into a new index object (see `catalog`), so the
        topic keeps at most about `catalog_keys` keys in the metadata store."""
        claim = self._claim
        assert claim is not None
        mine = ObjectCatalog(tuple(self._indexed), 0, self._index, len(self._indexed))
        catalog = await load_catalog(
            self._metadata, self.topic, self._stats, objects=self._objects, previous=mine
        )
        keyed = catalog.keyed
        self._keys = len(keyed)
        # The newest stay keys, and so does every small object still to be merged (a merge
        # rewrites their keys).
        below = self._small[0].start if self._small else math.inf
        movable = [d for d in keyed[: len(keyed) - self._config.catalog_keys // 4] if d.end < below]
        while movable:
            chunk, movable = movable[:_INDEX_CHUNK], movable[_INDEX_CHUNK:]
            content = [*self._indexed, *chunk]
            name = index_name(self.topic, chunk[-1].end)
            data = encode_index(content)
            await self._retrying(
                f"writing index {name}", functools.partial(self._objects.put, name, data)
            )
            index = CatalogIndex.of(name, content)
            ops: list[TxnOp] = [
                Put(keys.storage_index(self.topic), index.to_dict()),
                *(Delete(keys.storage_object(self.topic, d.start)) for d in chunk),
            ]
            await self._retrying(f"committing index {name}", functools.partial(claim.commit, ops))
            if self._index is not None:  # readers may still be reading the previous one
                after = self._clock.now() + self._config.merge_grace_seconds
                self._garbage.append((after, self._index.object_id, None))
            self._index, self._indexed = index, content
            self._keys -= len(chunk)
            self._stats.descriptors_indexed += len(chunk)
            log.debug("%s: %d descriptors moved into %s", self._name, len(chunk), name)

    # -- retention (storage.retention) -------------------------------------------------------

    async def _retain_due(self) -> None:
        """Every upload interval, apply the namespace's retention policy (if any)."""
        now = self._clock.now()
        if now - self._last_retention < self._config.upload_interval_seconds:
            return
        self._last_retention = now
        try:
            policy = await self._policies.get(self.topic.namespace)
        except RetentionError as exc:  # a malformed policy keeps everything, loudly
            log.error("%s: retention not applied: %s", self._name, exc)
            return
        self._retaining = not policy.keeps_everything
        if policy.keeps_everything:
            return
        lowest = await lowest_cursor(self._metadata, self.topic)
        async with self._lock:
            await self._release(policy, lowest, now)

    async def _release(self, policy: RetentionPolicy, lowest: int | None, now: float) -> None:
        """Release the oldest objects `policy` lets go (up to `_INDEX_CHUNK` descriptor keys
        a round; the next interval continues): the index object is rewritten without
        them (written first), then the index key and the deletion of their descriptor keys
        are committed in one fenced transaction; the objects are deleted after the grace."""
        claim = self._claim
        assert claim is not None
        mine = ObjectCatalog(tuple(self._indexed), 0, self._index, len(self._indexed))
        catalog = await load_catalog(
            self._metadata, self.topic, self._stats, objects=self._objects, previous=mine
        )
        # Small objects still to be merged are never released (a merge rewrites their keys).
        below = self._small[0].start if self._small else math.inf
        described = [d for d in catalog.objects if d.start < below]
        count = releasable(described, policy, now, lowest)
        if count == 0:
            return
        indexed = list(catalog.objects[: catalog.indexed])
        from_index = min(count, len(indexed))
        remaining = indexed[from_index:]
        dropped_keys = described[from_index:count][:_INDEX_CHUNK]
        released = described[: from_index + len(dropped_keys)]
        ops: list[TxnOp] = [Delete(keys.storage_object(self.topic, d.start)) for d in dropped_keys]
        index = self._index
        if from_index:
            index = None
            if remaining:
                name = index_name(self.topic, remaining[-1].end)
                data = encode_index(remaining)
                await self._retrying(
                    f"writing index {name}", functools.partial(self._objects.put, name, data)
                )
                index = CatalogIndex.of(name, remaining)
                ops.insert(0, Put(keys.storage_index(self.topic), index.to_dict()))
            else:
                ops.insert(0, Delete(keys.storage_index(self.topic)))
        await self._retrying(
            f"committing the release of {len(released)} objects",
            functools.partial(claim.commit, ops),
        )
        after = self._clock.now() + self._config.merge_grace_seconds
        if from_index and self._index is not None:  # readers may still be reading it
            self._garbage.append((after, self._index.object_id, None))
        self._index, self._indexed = index, remaining
        self._keys -= len(dropped_keys)
        self.stored_objects -= len(released)
        self.stored_bytes -= sum(d.size for d in released)
        self._garbage.extend((after, d.object_id, d) for d in released)
        self._stats.objects_released += len(released)
        log.info(
            "%s: retention released %d objects (offsets %d..%d)",
            self._name,
            len(released),
            released[0].start,
            released[-1].end,
        )

    async def _records(self, group: list[ObjectDescriptor]) -> list[Record]:
        """The records of `group`: from the local WAL, else from the objects themselves."""
        start, end = group[0].start, group[-1].end
        records: list[Record] = []
        try:
            cursor = start
            while cursor <= end:
                batch = await self._wal.read(cursor, max_records=4096)
                if not batch:
                    break
                for record in batch:
                    if record.offset > end:
                        return records
                    records.append(record)
                    cursor = record.offset + 1
            if records and records[0].offset == start and records[-1].offset == end:
                return records
        except OffsetUnavailableError:
            pass
        records = []
        for descriptor in group:
            stream = descriptor.records(self._objects, descriptor.start)
            async with contextlib.aclosing(stream):
                records.extend([record async for record in stream])
        return records

    async def _collect_garbage(self) -> None:
        """Delete merged objects once no reader can still be on its way to them."""
        now = self._clock.now()
        while self._garbage and self._garbage[0][0] <= now:  # in the order they were merged
            _, name, descriptor = self._garbage.popleft()
            if descriptor is not None and descriptor.shared:
                assert self._stream is not None  # shared objects are the stream's
                await self._stream.release(self.topic, descriptor)
                continue
            try:
                await self._objects.delete(name)
            except ObjectStoreError as exc:
                log.warning("%s: could not delete merged object %s: %s", self._name, name, exc)

    async def _retrying(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        """Run `op` until it succeeds, backing off exponentially on retryable failures.

        An outage is logged when it starts and when it ends, not at every attempt; every
        failed attempt is counted (``upload_failures``).
        """
        delay = self._config.upload_retry_initial_seconds
        attempt = 0
        while True:
            try:
                result = await op()
            except RETRYABLE as exc:
                attempt += 1
                self._stats.upload_failures += 1
                if not self._failing:
                    self._failing = True
                    log.warning(
                        "%s: %s failed, retrying with backoff (up to %.0fs): %s",
                        self._name,
                        what,
                        self._config.upload_retry_max_seconds,
                        exc,
                    )
                await self._clock.sleep(delay)
                delay = min(delay * 2, self._config.upload_retry_max_seconds)
                continue
            if self._failing:
                self._failing = False
                log.warning(
                    "%s: %s succeeded after %d failed attempt(s)", self._name, what, attempt
                )
            return result


def _small_tail(catalog: ObjectCatalog | None, config: StorageConfig) -> list[ObjectDescriptor]:
    """The catalog's trailing run of small objects (left by earlier owners), to merge.

    Only descriptor keys: what is in the index object stays as it is (a merge rewrites keys,
    and an index entry merged again would shadow the merged object)."""
    if catalog is None:
        return []
    tail: list[ObjectDescriptor] = []
    limit = max(1, config.max_object_bytes // 4)
    for descriptor in reversed(catalog.keyed):
        if descriptor.size >= limit or (tail and descriptor.end + 1 != tail[-1].start):
            break
        tail.append(descriptor)
    tail.reverse()
    return tail if len(tail) > 1 else []
