"""The write-ahead log of one reliable topic: a view on its broker's shared `BrokerLog`.

Every reliable topic of a broker writes to the one broker log (see `log`); this view
keeps the topic's offsets, read cache and acknowledgements. Appends get their offsets at
once, in call order, and go into the broker's next group commit: whatever all topics
appended while the previous batch was being written (and fsynced) is written together.
An append returns only when its batch is as durable as the fsync policy promises; only
then does it become visible to readers (a reader never sees a record that a crash could
take back). Recent records are served from the cache, older ones through the topic's
index into the log's segments.

Offsets are contiguous except across a gap declared on open (`open(..., allow_gap=True)`,
when the topic continues past a crashed owner's reservation): a GAP frame, written before
any record after the gap, tells recovery that the jump is not a loss. Offsets in a gap do
not exist: `read` continues at the next existing one.

With an `OffsetReserver` set, no offset beyond its reservation is ever assigned: an append
that would need one first waits for the reservation to be extended (or fails with it).

A view has no task nor timer of its own: an idle topic costs memory only.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self

from ballast.clock import Clock
from ballast.storage.codec import (
    Message,
    Record,
    decode_records,
    encode_record,
)
from ballast.storage.config import StorageConfig
from ballast.storage.log import (
    Batch,
    BrokerLog,
    Control,
    FrameDecoder,
    FrameKind,
    TopicPart,
    WalClosedError,
    WalError,
    encode_frame,
    read_ranges,
)
from ballast.storage.stats import StorageStats

__all__ = [
    "OffsetReserver",
    "OffsetUnavailableError",
    "WalClosedError",
    "WalError",
    "WalRecovery",
    "WriteAheadLog",
]


class OffsetUnavailableError(WalError):
    """The offset is no longer in the WAL (retention removed it): read object storage."""


class OffsetReserver(Protocol):
    """Who allows the WAL to assign offsets: the owner's reservation in the metadata store."""

    @property
    def limit(self) -> int:
        """Highest offset that may be assigned now (-1: none)."""
        ...

    async def ensure(self, last_offset: int) -> None:
        """Return once `limit` >= `last_offset`; raise if that cannot be (e.g. fenced)."""
        ...

    def note_next(self, next_offset: int) -> None:
        """Offsets below `next_offset` are assigned (a chance to extend early)."""
        ...


@dataclass(frozen=True)
class WalRecovery:
    """What the scan on open found."""

    first_offset: int | None
    last_offset: int | None
    segments: int
    records: int
    truncated_bytes: int
    dropped_segments: int
    corruption: str | None
    gaps: tuple[tuple[int, int], ...] = ()  # declared gaps between the recovered segments

    @property
    def clean(self) -> bool:
        """True when nothing had to be truncated or dropped."""
        return self.truncated_bytes == 0 and self.dropped_segments == 0


class WriteAheadLog:
    """One topic's append-only, group-committed log: a view on the broker's `log`.

    Lifecycle: `recover()` takes the topic's part of the (recovered) broker log,
    `open(next_offset)` fixes where appends continue, ``async with wal:`` accepts appends;
    leaving the block waits for what is pending and fsyncs it if the policy did not.
    """

    def __init__(
        self,
        log: BrokerLog,
        topic: str,
        *,
        clock: Clock,
        config: StorageConfig | None = None,
        stats: StorageStats | None = None,
        name: str | None = None,
    ) -> None:
        self.log = log
        self.topic = str(topic)
        self.name = name or f"wal{self.topic}"
        self._clock = clock
        self._config = config or log.config
        self._stats = stats or log.stats
        self._part: TopicPart | None = None
        self._recovered = False
        self._opened = False
        self._running = False
        self._closing = False
        self._closed = False
        self._next_offset = 0
        self._committed = -1  # last offset visible to readers (as durable as the policy)
        self._pending: Batch | None = None  # the batch appends go to, queued in the log
        self._last: Batch | None = None  # the newest batch handed to the log
        self._written = 0  # the log's batch number of this topic's newest written batch
        self._gap: tuple[int, int] | None = None  # to declare before the next record
        self._committed_event = asyncio.Event()
        self._cache: list[Record] = []
        self._cache_start = 0
        self._cache_bytes = 0  # payload + key bytes of the cached records
        self._uploaded = -1
        self._unuploaded_bytes = 0
        self._upload_trigger: Callable[[], None] | None = None
        self._reserver: OffsetReserver | None = None
        self._accepting = True

    # -- state ---------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """Offset the next append gets."""
        return self._next_offset

    @property
    def committed_offset(self) -> int:
        """Last offset acknowledged and visible to readers (-1 or initial-1 when empty)."""
        return self._committed

    @property
    def first_offset(self) -> int:
        """Lowest offset still held locally; equals `next_offset` when the WAL is empty."""
        first = self._part.first if self._part is not None else None
        return first if first is not None else self._committed + 1

    @property
    def closed(self) -> bool:
        """True once the WAL stopped (readers waiting for new records are released)."""
        return self._closed

    @property
    def segment_count(self) -> int:
        """Segments of the broker log holding records of this topic."""
        return self._part.segment_count if self._part is not None else 0

    def set_accepting_appends(self, accepting: bool) -> None:
        """Refuse (False) or accept again (True) new appends, e.g. while sealing.

        An append still waiting for its reservation is refused too: no offset is assigned
        after a seal has taken the last committed offset.
        """
        self._accepting = accepting

    def set_reserver(self, reserver: OffsetReserver | None) -> None:
        """Assign offsets only within `reserver`'s reservation (None: no limit)."""
        self._reserver = reserver

    def set_upload_trigger(self, trigger: Callable[[], None]) -> None:
        """Call `trigger` after every commit (the uploader decides whether to upload)."""
        self._upload_trigger = trigger

    @property
    def unuploaded_bytes(self) -> int:
        """Bytes committed here and not yet marked uploaded."""
        return self._unuploaded_bytes

    def mark_uploaded(self, offset: int, nbytes: int = 0) -> None:
        """Everything up to `offset` is in object storage (its log segments may go)."""
        if offset > self._uploaded:
            self._uploaded = offset
            self._unuploaded_bytes = max(0, self._unuploaded_bytes - nbytes)
        if self._part is not None:
            self._part.release_upto(offset)

    # -- recovery --------------------------------------------------------------------------

    async def recover(self) -> WalRecovery:
        """Take the topic's part of the broker log (recovered when the log opened).

        A torn or corrupt tail of the log is truncated, counted and logged once, by the
        log; the topic's recovery reports what it holds.
        """
        if self._recovered:
            raise WalError(f"{self.name}: already recovered")
        await self.log.open()
        part = self._part = self.log.attach(self.topic)
        self._recovered = True
        last = part.last
        return WalRecovery(
            part.first,
            last,
            part.segment_count,
            part.records,
            0,
            0,
            None,
            tuple(g for g in part.gaps if last is not None and g[1] < last),
        )

    def _require_part(self) -> TopicPart:
        if self._part is None:
            raise WalError(f"{self.name}: recover() it first")
        return self._part

    async def discard(self) -> int:
        """Forget the topic's local records (stale, or already in object storage): a RESET
        frame in the log; returns how many segments held them."""
        if self._opened:
            raise WalError(f"{self.name}: cannot discard an open WAL")
        part = self._require_part()
        count = part.segment_count
        if part.last is not None or part.firsts:
            self.log.reset(part)
        return count

    async def open(self, next_offset: int, *, allow_gap: bool = False) -> None:
        """Continue at `next_offset`; it must follow the recovered records exactly.

        With `allow_gap`, it may also lie beyond them: the offsets in between never exist
        (a GAP frame declares them before the next record).
        """
        if not self._recovered:
            await self.recover()
        if self._opened:
            raise WalError(f"{self.name}: already open")
        last = self._require_part().last
        if last is not None and not (
            next_offset == last + 1 or (allow_gap and next_offset > last + 1)
        ):
            raise WalError(
                f"{self.name}: local records end at offset {last}, cannot continue at "
                f"{next_offset}; discard() them first"
            )
        if next_offset < 0:
            raise WalError(f"{self.name}: next offset must be >= 0, got {next_offset}")
        self._gap = (
            (last + 1, next_offset - 1) if last is not None and next_offset > last + 1 else None
        )
        self._next_offset = next_offset
        self._committed = next_offset - 1
        self._cache_start = next_offset
        self._opened = True

    async def start_segment(self) -> None:
        """Prepare the log for the first append now: declare the gap (if any) and make
        sure the active segment exists, so that the first send (a topic that moved here
        opens while it waits) only writes its records."""
        if not self._opened:
            raise WalError(f"{self.name}: open() it before starting a segment")
        if self._gap is not None:
            batch = self._batch()
            batch.controls.append(Control(FrameKind.GAP, self._gap))
            self._gap = None
            await asyncio.shield(batch.waiter())
        await self.log.ensure_segment()

    # -- service lifecycle -----------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if not self._opened:
            raise WalError(f"{self.name}: open() it before starting it")
        if self._closed or self._running:
            raise WalError(f"{self.name}: already started or closed")
        self._running = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing = True
        try:
            await self.settle()
        except WalError:
            pass  # failed appends were told so; nothing more to write
        finally:
            self._running = False
            await self.close_files()

    async def close_files(self) -> None:
        """Stop: what this topic wrote is fsynced (if the policy did not already); appends
        and waiting readers are refused from then on. Also for a WAL never started."""
        pending = self._pending
        if pending is not None and self.log.withdraw(pending):
            pending.resolve(WalClosedError(f"{self.name}: closed"))
        if (
            self._written > self.log.synced_batches
            and self.log.failure is None
            and not self.log.closed
        ):
            await self.log.sync()
        if self._part is not None:
            self.log.detach(self._part)
        self._closed = True
        self._notify()

    async def destroy(self) -> None:
        """Forget the topic's local records for good (after a seal: everything is in
        object storage): a RESET frame, so that recovery ignores its earlier frames."""
        if self._running:
            raise WalError(f"{self.name}: stop the WAL before destroying it")
        self._cache.clear()
        self._cache_bytes = 0
        if self._part is not None:
            await self.log.release_topic(self._part)

    # -- appends ---------------------------------------------------------------------------

    def _check_writable(self) -> None:
        failure = self.log.failure
        if failure is not None:
            raise WalError(f"{self.name}: failed earlier: {failure}") from failure
        if not self._running or self._closing:
            raise WalClosedError(f"{self.name}: not accepting appends (closed or not started)")
        if not self._accepting:
            raise WalClosedError(f"{self.name}: not accepting appends (sealing)")

    async def _reserve(self, count: int) -> None:
        """Wait until the reservation covers the next `count` offsets."""
        reserver = self._reserver
        assert reserver is not None
        while self._next_offset + count - 1 > reserver.limit:
            self._check_writable()
            self._stats.reservation_stalls += 1
            await reserver.ensure(self._next_offset + count - 1)

    def _batch(self) -> Batch:
        """The batch new frames go to: the queued one until the writer takes it."""
        batch = self._pending
        if batch is None or batch.taken:
            batch = Batch(self._require_part(), self._commit)
            self.log.enqueue(batch)
            self._pending = self._last = batch
        return batch

    def _enqueue(self, messages: Sequence[Message]) -> tuple[int, Batch]:
        self._check_writable()
        now = self._clock.now()
        first = self._next_offset
        reserver = self._reserver
        if reserver is not None and first + len(messages) - 1 > reserver.limit:
            # Unreachable through append(): the one rule reservations exist for.
            raise WalError(
                f"{self.name}: offsets {first}..{first + len(messages) - 1} are not reserved "
                f"(reserved through {reserver.limit})"
            )
        batch = self._batch()
        if self._gap is not None:  # before the first record after it
            batch.controls.append(Control(FrameKind.GAP, self._gap))
            self._gap = None
        topic_id = batch.part.id
        for i, message in enumerate(messages):
            record = Record(first + i, now, message.payload, message.key, message.headers)
            frame = encode_record(record)
            batch.records.append(record)
            batch.frames.append(encode_frame(FrameKind.RECORD, topic_id, frame))
            batch.nbytes += len(frame)
        self._next_offset = first + len(messages)
        if reserver is not None:
            reserver.note_next(self._next_offset)
        return first, batch

    async def append(
        self,
        payload: bytes,
        *,
        key: bytes | None = None,
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> int:
        """Append one message; returns its offset once it is durable per the policy."""
        if self._reserver is not None and self._next_offset > self._reserver.limit:
            await self._reserve(1)
        offset, batch = self._enqueue([Message(payload, key, headers)])
        # Shielded: one cancelled producer must not fail the batch shared with others.
        await asyncio.shield(batch.waiter())
        return offset

    async def append_batch(self, messages: Sequence[Message]) -> range:
        """Append messages with consecutive offsets; returns them once durable."""
        if not messages:
            return range(self._next_offset, self._next_offset)
        if (
            self._reserver is not None
            and self._next_offset + len(messages) - 1 > self._reserver.limit
        ):
            await self._reserve(len(messages))
        first, batch = self._enqueue(messages)
        await asyncio.shield(batch.waiter())
        return range(first, first + len(messages))

    async def flush(self) -> int:
        """Wait for every append so far and fsync; returns the last committed offset."""
        await self.settle()
        if self._written > self.log.synced_batches:
            await self.log.sync()
        return self._committed

    async def settle(self) -> int:
        """Wait for every append so far to be written (not fsynced); returns the last
        committed offset."""
        while self._last is not None and not self._last.done:
            await asyncio.shield(self._last.waiter())  # raises the batch's failure
        failure = self.log.failure
        if failure is not None:
            raise WalError(f"{self.name}: failed: {failure}") from failure
        return self._committed

    def _trim_cache(self) -> None:
        """Keep the cache within its count and byte bounds, trimming in bulk (to half the
        byte budget) rather than per batch."""
        config = self._config
        overflow = len(self._cache) - config.cache_messages
        if overflow <= config.cache_messages and self._cache_bytes <= config.cache_bytes:
            return
        drop = max(overflow, 0)
        freed = sum(r.size for r in self._cache[:drop])
        while drop < len(self._cache) - 1 and self._cache_bytes - freed > config.cache_bytes // 2:
            freed += self._cache[drop].size
            drop += 1
        self._drop_cached(drop)

    def _drop_cached(self, count: int) -> None:
        """Forget the `count` oldest cached records."""
        self._cache_bytes -= sum(r.size for r in self._cache[:count])
        del self._cache[:count]
        self._cache_start += count

    @property
    def cache_bytes(self) -> int:
        """Bytes (payload + key) of the records in the read cache."""
        return self._cache_bytes

    def _commit(self, batch: Batch) -> None:
        """The log wrote `batch` (as durable as the policy): make its records visible."""
        self._written = batch.seq
        if not batch.records:
            return
        self._committed = batch.records[-1].offset
        if not self._cache:
            self._cache_start = batch.records[0].offset
        self._cache.extend(batch.records)
        added = sum(r.size for r in batch.records)
        self._cache_bytes += added
        self._trim_cache()
        self._stats.appended_records += len(batch.records)
        self._stats.appended_bytes += added
        self._unuploaded_bytes += batch.nbytes
        if self._upload_trigger is not None:
            self._upload_trigger()
        self._notify()

    def _notify(self) -> None:
        event, self._committed_event = self._committed_event, asyncio.Event()
        event.set()

    # -- reads -----------------------------------------------------------------------------

    async def wait_for(self, offset: int) -> bool:
        """Wait until `offset` is committed; False if the WAL closed first."""
        while self._committed < offset:
            if self._closed or self.log.failure is not None:
                return False
            await self._committed_event.wait()
        return True

    async def read(self, from_offset: int, max_records: int = 1024) -> list[Record]:
        """Committed records from `from_offset` on (at most `max_records`); [] if none yet.

        Raises `OffsetUnavailableError` if `from_offset` is below `first_offset`.
        """
        if from_offset > self._committed:
            return []
        if from_offset < self.first_offset:
            raise OffsetUnavailableError(
                f"{self.name}: offset {from_offset} is below the first local offset "
                f"{self.first_offset}"
            )
        if self._cache and from_offset >= self._cache_start:
            i = from_offset - self._cache_start
            return self._cache[i : i + max_records]
        part = self._require_part()
        i = bisect.bisect_right(part.firsts, from_offset) - 1
        if i < 0:
            raise OffsetUnavailableError(f"{self.name}: offset {from_offset} not in the log")
        if from_offset > part.lasts[i]:
            # In a gap after this run: those offsets do not exist, the next one does.
            i += 1
            if i >= len(part.firsts):
                return []
            from_offset = part.firsts[i]
        # Runs of this topic in one segment, adjacent ones merged: one pread per range.
        segment = part.segments[i]
        ranges: list[tuple[int, int]] = []
        total = count = 0
        j = i
        while j < len(part.firsts) and part.segments[j] is segment:
            if j > i and (total >= self._config.read_batch_bytes or count >= max_records):
                break
            position, length = part.positions[j], part.lengths[j]
            if ranges and sum(ranges[-1]) == position:
                ranges[-1] = (ranges[-1][0], ranges[-1][1] + length)
            else:
                ranges.append((position, length))
            total += length
            count += part.lasts[j] - max(part.firsts[j], from_offset) + 1
            j += 1
        try:
            chunks = await asyncio.to_thread(read_ranges, segment.path, ranges)
        except FileNotFoundError as exc:
            raise OffsetUnavailableError(
                f"{self.name}: segment {segment.path.name} was removed"
            ) from exc
        contents: list[bytes] = []
        for (position, length), data in zip(ranges, chunks, strict=True):
            decoder = FrameDecoder(position)
            frames = decoder.feed(data)
            if decoder.corruption is not None or decoder.buffered or len(data) != length:
                where = decoder.corruption.position if decoder.corruption else position
                raise WalError(f"{self.name}: {segment.path.name} corrupt at byte {where}")
            contents.extend(f.content for f in frames if f.kind is FrameKind.RECORD)
        try:
            records = decode_records(b"".join(contents))
        except ValueError as exc:
            raise WalError(f"{self.name}: {segment.path.name}: {exc}") from exc
        return [r for r in records if from_offset <= r.offset <= self._committed][:max_records]

    # -- retention -------------------------------------------------------------------------

    async def apply_retention(self) -> int:
        """Let the broker log delete the segments nobody needs any more (uploaded by every
        topic with records in them, and older than the retention period)."""
        deleted = await self.log.apply_retention()
        if deleted:
            first = self.first_offset
            if self._cache and self._cache_start < first:
                self._drop_cached(min(first - self._cache_start, len(self._cache)))
        return deleted
