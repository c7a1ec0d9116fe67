"""The broker's write-ahead log: one append-only log shared by all its reliable topics.

As BookKeeper's journal, one log per broker takes every topic's appends, so its cost does
not grow with the number of topics: one directory, one open file (the active segment),
one writer task and one group commit for the whole broker. Whatever all topics appended
while the previous batch was written becomes the next batch: ONE write and (with
`FsyncPolicy.BATCH`) ONE fsync for all of them; with `INTERVAL`, one broker-wide ticker
fsyncs. `WriteAheadLog` is a topic's view on it (offsets, cache, index, acknowledgements).

Segments are append-only files ``{seq:020}.log`` (numbered, never reused) of frames::

    u32 content_length | u32 crc32(kind .. content) | u8 kind | u32 topic_id | content

- ``RECORD``: content is one frame of the record codec (`codec.encode_record`).
- ``DECLARE``: content is the topic's name: from here on in this segment, `topic_id` is
  that topic. Ids are per process; each segment declares the ones it uses before their
  first frame, so a segment is readable on its own (and older ones can be deleted).
- ``GAP``: u64 start | u64 end: the topic's offsets jump over start..end (declared
  before the first record after the jump, so recovery takes it for no loss).
- ``RESET``: the topic's earlier frames are no longer its records (a sealed topic's local
  records are gone for good, or stale ones were discarded).

The CRC covers the tag and the content (the whole record frame), so a torn write or a
flipped bit anywhere is detected. Recovery scans every segment once when the log opens,
truncates a torn or corrupt tail at the last good frame (segments after it are dropped),
counts and logs it, and keeps per topic an index of its records: runs of adjacent frames
(first offset, last offset, segment, position, length), split every
`index_interval_bytes`, so a read of older records is one ``pread`` per run.

A segment is deleted once it is closed, older than `retention_seconds` and every topic
with records in it has uploaded them (`mark_uploaded`) or released them (RESET); only the
oldest segment goes first, so what recovery sees is always a suffix of the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import struct
import zlib
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from types import TracebackType
from typing import Self

from ballast.clock import Clock
from ballast.storage.codec import FRAME_HEADER_SIZE, MAX_BODY_SIZE, Corruption, Record
from ballast.storage.config import AckMode, FsyncPolicy, StorageConfig
from ballast.storage.stats import StorageStats

__all__ = [
    "BrokerLog",
    "Frame",
    "FrameDecoder",
    "FrameKind",
    "LogRecovery",
    "WalClosedError",
    "WalError",
    "encode_frame",
]

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".log"
_HEAD = struct.Struct(">II")  # content length, crc32 of tag + content
_TAG = struct.Struct(">BI")  # kind, topic id
FRAME_OVERHEAD = _HEAD.size + _TAG.size
_GAP = struct.Struct(">QQ")
_U32 = struct.Struct(">I")
_OFFSET = struct.Struct(">Q")
# A content length above this is garbage (a corrupt length field), not a frame to wait for.
_MAX_CONTENT = FRAME_HEADER_SIZE + MAX_BODY_SIZE
_MAX_NAME = 1024
_SCAN_CHUNK = 4 * 1024 * 1024
# Below this size a batch is written on the event loop thread: a write to the page cache
# is quicker than a hop to a worker thread.
_INLINE_WRITE_BYTES = 256 * 1024


class WalError(Exception):
    """The WAL cannot do what was asked (I/O failure, bad state)."""


class WalClosedError(WalError):
    """The WAL is closed (or was never started): no more appends."""


class FrameKind(IntEnum):
    """What a frame of the broker log holds."""

    RECORD = 1
    DECLARE = 2
    GAP = 3
    RESET = 4


_KINDS = frozenset(int(k) for k in FrameKind)


def encode_frame(kind: FrameKind, topic_id: int, content: bytes) -> bytes:
    """One frame of the broker log."""
    tag = _TAG.pack(kind, topic_id)
    return _HEAD.pack(len(content), zlib.crc32(content, zlib.crc32(tag))) + tag + content


@dataclass(frozen=True, slots=True)
class Frame:
    """One CRC-verified frame; `position` is where it starts in its segment."""

    kind: FrameKind
    topic_id: int
    content: bytes
    position: int

    @property
    def size(self) -> int:
        """Bytes of the whole frame on disk."""
        return FRAME_OVERHEAD + len(self.content)


class FrameDecoder:
    """Incremental decoder of broker-log frames (sans I/O, as `codec.RecordDecoder`)."""

    def __init__(self, start_position: int = 0) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._base = start_position
        self.corruption: Corruption | None = None

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held back until more data arrives."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add `data`; returns the frames it completes (stops at a corrupt one, which
        `corruption` then reports)."""
        if self.corruption is not None:
            return []
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[: self._pos]
            self._base += self._pos
            self._pos = 0
        self._buf += data
        buf = self._buf
        frames: list[Frame] = []
        while len(buf) - self._pos >= FRAME_OVERHEAD:
            pos = self._pos
            length, crc = _HEAD.unpack_from(buf, pos)
            if length > _MAX_CONTENT:
                self.corruption = Corruption(self._base + pos, f"frame length {length} too big")
                break
            end = pos + FRAME_OVERHEAD + length
            if end > len(buf):
                break
            tagged = bytes(buf[pos + _HEAD.size : end])
            if zlib.crc32(tagged) != crc:
                self.corruption = Corruption(self._base + pos, "CRC mismatch")
                break
            kind, topic_id = _TAG.unpack_from(tagged, 0)
            if kind not in _KINDS:
                self.corruption = Corruption(self._base + pos, f"unknown frame kind {kind}")
                break
            frames.append(Frame(FrameKind(kind), topic_id, tagged[_TAG.size :], self._base + pos))
            self._pos = end
        return frames


@dataclass(frozen=True)
class LogRecovery:
    """What the scan on open found, for the whole broker log."""

    segments: int
    frames: int
    topics: int
    truncated_bytes: int
    dropped_segments: int
    corruption: str | None
    inconsistent: int = 0  # topics whose frames did not follow on (earlier ones dropped)

    @property
    def clean(self) -> bool:
        """True when nothing had to be truncated or dropped."""
        return self.truncated_bytes == 0 and self.dropped_segments == 0 and not self.inconsistent


@dataclass(frozen=True, slots=True)
class Control:
    """A frame written for a topic before its records: a gap or a reset."""

    kind: FrameKind
    gap: tuple[int, int] | None = None

    def encode(self, topic_id: int) -> bytes:
        content = _GAP.pack(*self.gap) if self.gap is not None else b""
        return encode_frame(self.kind, topic_id, content)


class Segment:
    """Book-keeping of one segment file; `size` counts written bytes only."""

    __slots__ = ("closed_at", "declared", "parts", "path", "pins", "seq", "size")

    def __init__(self, seq: int, path: Path) -> None:
        self.seq = seq
        self.path = path
        self.size = 0
        self.closed_at: float | None = None
        self.pins = 0  # topics with records here not uploaded (nor released) yet
        self.parts: set[TopicPart] = set()  # topics with records indexed here
        self.declared: set[int] = set()  # topic ids declared in it (active segment)


class _Pin:
    __slots__ = ("last", "segment")

    def __init__(self, segment: Segment, last: int) -> None:
        self.segment = segment
        self.last = last


class TopicPart:
    """One topic's part of the broker log: its records' index, gaps, and pins.

    It lives as long as the log (a topic closed and reopened on this broker finds it);
    `WriteAheadLog` is the view a served topic uses on it.
    """

    __slots__ = (
        "attached",
        "firsts",
        "gaps",
        "id",
        "last",
        "lasts",
        "lengths",
        "name",
        "open_gap",
        "pins",
        "positions",
        "segments",
        "uploaded",
    )

    def __init__(self, name: str, topic_id: int) -> None:
        self.name = name
        self.id = topic_id
        # Runs of adjacent record frames with contiguous offsets (arrays: 8 bytes a value).
        self.firsts = array("q")
        self.lasts = array("q")
        self.positions = array("q")
        self.lengths = array("q")
        self.segments: list[Segment] = []
        self.gaps: list[tuple[int, int]] = []  # declared gaps between indexed records
        self.open_gap: tuple[int, int] | None = None  # declared, no record after it yet
        self.last: int | None = None  # last offset written (even if retention removed it)
        self.uploaded = -1
        self.pins: deque[_Pin] = deque()
        self.attached = False  # a served topic's view uses it

    @property
    def first(self) -> int | None:
        """Lowest offset still held in the log."""
        return self.firsts[0] if self.firsts else None

    @property
    def records(self) -> int:
        """Records still held in the log."""
        return sum(self.lasts) - sum(self.firsts) + len(self.firsts)

    @property
    def segment_count(self) -> int:
        """Segments holding records of this topic."""
        count = 0
        previous: Segment | None = None
        for segment in self.segments:
            if segment is not previous:
                count += 1
                previous = segment
        return count

    def accepts(self, offset: int) -> bool:
        """Whether a record at `offset` follows on what is indexed (or a declared gap)."""
        if self.last is None or offset == self.last + 1:
            return True
        return self.open_gap is not None and offset == self.open_gap[1] + 1

    def declare_gap(self, start: int, end: int) -> None:
        # A gap after nothing bridges nothing (the records before it were deleted).
        if self.last is not None and start == self.last + 1 and end >= start:
            self.open_gap = (start, end)

    def add(self, segment: Segment, offset: int, position: int, size: int, interval: int) -> None:
        """Index one written record frame."""
        if self.open_gap is not None:
            if offset == self.open_gap[1] + 1:
                self.gaps.append(self.open_gap)
            self.open_gap = None
        if (
            self.firsts
            and self.segments[-1] is segment
            and self.lasts[-1] + 1 == offset
            and self.positions[-1] + self.lengths[-1] == position
            and self.lengths[-1] < interval
        ):
            self.lasts[-1] = offset
            self.lengths[-1] += size
        else:
            self.firsts.append(offset)
            self.lasts.append(offset)
            self.positions.append(position)
            self.lengths.append(size)
            self.segments.append(segment)
        self.last = offset
        if offset <= self.uploaded:
            return  # recovered after a reopen that had it uploaded already: nothing to pin
        if self.pins and self.pins[-1].segment is segment:
            self.pins[-1].last = offset
        else:
            self.pins.append(_Pin(segment, offset))
            segment.pins += 1
            segment.parts.add(self)

    def unpin(self) -> None:
        """Let the segments go without waiting for an upload (see `BrokerLog.detach`)."""
        while self.pins:
            self.pins.popleft().segment.pins -= 1

    def release_upto(self, offset: int) -> None:
        """Records up to `offset` are uploaded: they no longer keep their segments."""
        if offset <= self.uploaded:
            return
        self.uploaded = offset
        pins = self.pins
        while pins and pins[0].last <= offset:
            pins.popleft().segment.pins -= 1

    def reset(self) -> None:
        """Forget every record: they are no longer this topic's (destroyed, discarded)."""
        while self.pins:
            self.pins.popleft().segment.pins -= 1
        for values in (self.firsts, self.lasts, self.positions, self.lengths):
            del values[:]
        self.segments.clear()
        self.gaps.clear()
        self.open_gap = None
        self.last = None
        self.uploaded = -1

    def drop_segment(self, segment: Segment) -> None:
        """`segment` was deleted (always the oldest one): forget its runs."""
        count = 0
        while count < len(self.segments) and self.segments[count] is segment:
            count += 1
        if count and self.lasts[count - 1] > self.uploaded:
            # Records never known to be uploaded went with it (a topic not served here,
            # released by `detach`): nothing local is left to continue from, so a reopen
            # starts as after a crash, past the reservation (no offset is ever reused).
            self.reset()
            return
        if count:
            for values in (self.firsts, self.lasts, self.positions, self.lengths):
                del values[:count]
            del self.segments[:count]
        while self.pins and self.pins[0].segment is segment:  # unpinned already; defensive
            self.pins.popleft().segment.pins -= 1
        first = self.first
        self.gaps = [g for g in self.gaps if first is not None and g[1] >= first]


class Batch:
    """One topic's frames waiting for the same group commit: controls, then records."""

    __slots__ = (
        "controls",
        "frames",
        "future",
        "nbytes",
        "on_commit",
        "part",
        "records",
        "seq",
        "taken",
    )

    def __init__(self, part: TopicPart, on_commit: Callable[[Batch], None] | None = None) -> None:
        self.part = part
        self.on_commit = on_commit
        self.controls: list[Control] = []
        self.records: list[Record] = []
        self.frames: list[bytes] = []  # broker-log frames of `records`
        self.nbytes = 0  # record-codec bytes of `records` (what the upload carries)
        self.future: asyncio.Future[None] | None = None
        self.taken = False  # picked by the writer: appends go to a new batch
        self.seq = 0  # the log's batch number it was written in

    @property
    def done(self) -> bool:
        return self.future is not None and self.future.done()

    def waiter(self) -> asyncio.Future[None]:
        """The future resolved when this batch is committed (created on first use)."""
        if self.future is None:
            self.future = asyncio.get_running_loop().create_future()
        return self.future

    def resolve(self, exc: BaseException | None = None) -> None:
        """Acknowledge the batch, or fail it with `exc`."""
        future = self.waiter()
        if future.done():
            return
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)
            # Waiters may all be gone; do not log "exception never retrieved".
            future.exception()


def _segment_name(seq: int) -> str:
    return f"{seq:020d}{SEGMENT_SUFFIX}"


def _write_all(fd: int, data: bytes, sync: bool) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    if sync:
        os.fsync(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_ranges(path: Path, ranges: list[tuple[int, int]]) -> list[bytes]:
    """`(position, length)` ranges of one segment, with one open file (in a thread)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return [os.pread(fd, length, position) for position, length in ranges]
    finally:
        os.close(fd)


class BrokerLog:
    """The write-ahead log of one broker, shared by all its reliable topics.

    `open()` (idempotent; the first topic's `WriteAheadLog.recover()` calls it) scans the
    segments and starts the writer; `close()` writes what is queued, fsyncs and stops.
    A `private` log belongs to one topic (a `ReliableTopic` without a broker's log: tests,
    tools): that topic's `destroy` removes the whole directory.
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        clock: Clock,
        config: StorageConfig | None = None,
        stats: StorageStats | None = None,
        name: str = "log",
        private: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self.config = config or StorageConfig()
        self.stats = stats or StorageStats()
        self.private = private
        self._clock = clock
        self._segments: list[Segment] = []
        self._active: Segment | None = None
        self._fd: int | None = None  # the active segment, open for appending
        self._next_seq = 1
        self._parts: dict[str, TopicPart] = {}
        self._next_id = 1
        self._queue: list[Batch] = []
        self._wake = asyncio.Event()
        self._io_lock = asyncio.Lock()
        self._opening: asyncio.Future[LogRecovery] | None = None
        self._recovery: LogRecovery | None = None
        self._writer: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False
        self._failure: BaseException | None = None
        self._written = 0  # batches written
        self._synced = 0  # batches known to be fsynced
        self._dirty = False  # written and not fsynced
        self._inconsistent = 0

    # -- state ---------------------------------------------------------------------------

    @property
    def recovery(self) -> LogRecovery | None:
        """What the scan on open found (None before `open()`)."""
        return self._recovery

    @property
    def failure(self) -> BaseException | None:
        """The write error that stopped the log, if any."""
        return self._failure

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def synced_batches(self) -> int:
        """Batches written and fsynced (compare with `Batch.seq`)."""
        return self._synced

    @property
    def segment_count(self) -> int:
        """Segment files of the log."""
        return len(self._segments)

    def part(self, topic: str) -> TopicPart:
        """The topic's part of the log (created empty for a topic new here)."""
        part = self._parts.get(topic)
        if part is None:
            part = self._parts[topic] = TopicPart(topic, self._next_id)
            self._next_id += 1
        return part

    def attach(self, topic: str) -> TopicPart:
        """The part of a topic served here: its records stay until it uploads them."""
        part = self.part(topic)
        if part.attached:
            return part
        part.attached = True
        if self.config.ack is AckMode.DURABLE:  # `detach` let them go: pin them again
            for last, segment in zip(part.lasts, part.segments, strict=True):
                if last <= part.uploaded:
                    continue
                if part.pins and part.pins[-1].segment is segment:
                    part.pins[-1].last = last
                else:
                    part.pins.append(_Pin(segment, last))
                    segment.pins += 1
        return part

    def detach(self, part: TopicPart) -> None:
        """The topic is not served here any more (closed, or recovered and not reopened).

        With `AckMode.DURABLE` whatever it acknowledged is in object storage: its records
        here only save a reopen here some uploads, so they no longer hold the segments
        (which still go only after `retention_seconds`; a reopen before then finds them).
        With `AckMode.LOCAL` they may be the only copy: they stay until the topic reopens
        here and uploads them (or is sealed elsewhere and reopened, then discards them).
        """
        part.attached = False
        if self.config.ack is AckMode.DURABLE:
            part.unpin()

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> LogRecovery:
        """Recover the segments (once) and start the writer; what recovery found."""
        if self._recovery is not None:
            return self._recovery
        if self._closing or self._closed:
            raise WalClosedError(f"{self.name}: closed")
        if self._opening is None:
            self._opening = asyncio.ensure_future(self._open())
        # Shielded: a topic whose opening is cancelled must not cancel everyone's recovery.
        return await asyncio.shield(self._opening)

    async def _open(self) -> LogRecovery:
        try:
            recovery = await asyncio.to_thread(self._recover_sync)
        except BaseException:
            self._opening = None  # a later open() tries again
            raise
        if not recovery.clean:
            self.stats.wal_truncated_tails += 1 if recovery.truncated_bytes else 0
            self.stats.wal_truncated_bytes += recovery.truncated_bytes
            self.stats.wal_dropped_segments += recovery.dropped_segments
            log.warning(
                "%s: truncated %d bytes and dropped %d segment(s) (%s); %d topic(s) did not "
                "follow on",
                self.name,
                recovery.truncated_bytes,
                recovery.dropped_segments,
                recovery.corruption,
                recovery.inconsistent,
            )
        loop = asyncio.get_running_loop()
        self._writer = loop.create_task(self._write_loop(), name=f"{self.name}/writer")
        if self.config.fsync_policy is FsyncPolicy.INTERVAL:
            self._ticker = loop.create_task(self._fsync_ticker(), name=f"{self.name}/fsync")
        self._recovery = recovery
        return recovery

    async def close(self) -> None:
        """Write what is queued, fsync and close the files; appends fail from then on."""
        if self._closed:
            return
        self._closing = True
        self._wake.set()
        if self._opening is not None and not self._opening.done():
            with contextlib.suppress(Exception):
                await self._opening
        if self._ticker is not None:
            # It sleeps on the injected clock, which may never move again: stop it outright.
            self._ticker.cancel()
            with contextlib.suppress(BaseException):
                await self._ticker
        if self._writer is not None:
            # It drains the queue and ends (a write failure is recorded, not raised).
            await asyncio.wait({self._writer})
        async with self._io_lock:
            fd, self._fd = self._fd, None
            if fd is not None:
                try:
                    if self._dirty and self._failure is None:
                        await asyncio.to_thread(os.fsync, fd)
                        self.stats.wal_fsyncs += 1
                        self._dirty = False
                        self._synced = self._written
                finally:
                    os.close(fd)
        self._closed = True
        self._fail_queued(self._failure or WalClosedError(f"{self.name}: closed"))

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- recovery --------------------------------------------------------------------------

    def _recover_sync(self) -> LogRecovery:
        self.directory.mkdir(parents=True, exist_ok=True)
        files: list[tuple[int, Path]] = []
        for path in self.directory.iterdir():
            if path.suffix == SEGMENT_SUFFIX and path.stem.isdigit():
                files.append((int(path.stem), path))
        files.sort()
        if files:
            self._next_seq = files[-1][0] + 1  # never reuse a number, even a dropped one's
        interval = self.config.index_interval_bytes
        now = self._clock.now()
        truncated = 0
        dropped = 0
        frames = 0
        corruption: str | None = None
        stop_at: int | None = None
        for i, (seq, path) in enumerate(files):
            segment = Segment(seq, path)
            ids: dict[int, TopicPart] = {}
            decoder = FrameDecoder()
            good_end = 0
            bad: str | None = None
            file_size = path.stat().st_size
            with open(path, "rb") as f:
                while bad is None:
                    chunk = f.read(_SCAN_CHUNK)
                    if not chunk:
                        break
                    for frame in decoder.feed(chunk):
                        bad = self._replay(segment, ids, frame, interval)
                        if bad is not None:
                            bad = f"{bad} at byte {frame.position}"
                            break
                        good_end = frame.position + frame.size
                        frames += 1
                    if bad is None and decoder.corruption is not None:
                        c = decoder.corruption
                        bad = f"{c.reason} at byte {c.position}"
            if bad is None and good_end < file_size:
                bad = f"torn frame at byte {good_end} ({file_size - good_end} bytes)"
            if bad is not None:
                corruption = f"{path.name}: {bad}"
                truncated += file_size - good_end
                with open(path, "r+b") as f:
                    f.truncate(good_end)
                    os.fsync(f.fileno())
                stop_at = i + 1
            segment.size = good_end
            if good_end == 0:
                path.unlink()  # nothing in it (created, then a crash before any write)
            else:
                segment.closed_at = now
                self._segments.append(segment)
            if stop_at is not None:
                break
        if stop_at is not None:
            # Corruption before the tail: what follows is not known to be whole.
            for _, path in files[stop_at:]:
                truncated += path.stat().st_size
                path.unlink()
                dropped += 1
        if truncated or dropped:
            _fsync_dir(self.directory)
        for part in self._parts.values():
            self.detach(part)  # none is served yet
        topics = sum(1 for p in self._parts.values() if p.last is not None)
        return LogRecovery(
            len(self._segments),
            frames,
            topics,
            truncated,
            dropped,
            corruption,
            self._inconsistent,
        )

    def _replay(
        self, segment: Segment, ids: dict[int, TopicPart], frame: Frame, interval: int
    ) -> str | None:
        """Apply one recovered frame; a description if it is malformed (CRC-valid, so
        written wrongly: treated as corruption)."""
        content = frame.content
        if frame.kind is FrameKind.DECLARE:
            if not content or len(content) > _MAX_NAME:
                return "malformed topic declaration"
            try:
                name = content.decode()
            except UnicodeDecodeError:
                return "undecodable topic name"
            ids[frame.topic_id] = self.part(name)
            return None
        part = ids.get(frame.topic_id)
        if part is None:
            return f"topic id {frame.topic_id} used before its declaration"
        if frame.kind is FrameKind.RECORD:
            if len(content) < FRAME_HEADER_SIZE + _OFFSET.size:
                return "record frame too short"
            (length,) = _U32.unpack_from(content, 0)
            if length + FRAME_HEADER_SIZE != len(content):
                return "record frame length mismatch"
            (offset,) = _OFFSET.unpack_from(content, FRAME_HEADER_SIZE)
            if not part.accepts(offset):
                # Whole and CRC-valid, yet not after the topic's previous record: its
                # earlier frames are not to be trusted; the same choice on every recovery.
                self._inconsistent += 1
                log.warning(
                    "%s: %s: offset %d does not follow %s; earlier local records dropped",
                    self.name,
                    part.name,
                    offset,
                    part.last,
                )
                part.reset()
            part.add(segment, offset, frame.position, frame.size, interval)
        elif frame.kind is FrameKind.GAP:
            if len(content) != _GAP.size:
                return "malformed gap"
            part.declare_gap(*_GAP.unpack(content))
        else:  # RESET
            part.reset()
        return None

    # -- writes ----------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._failure is not None:
            raise WalError(f"{self.name}: failed earlier: {self._failure}") from self._failure
        if self._closing or self._closed or self._writer is None:
            raise WalClosedError(f"{self.name}: not accepting writes (closed or not open)")

    def enqueue(self, batch: Batch) -> None:
        """Queue `batch` for the next group commit (its frames are added until taken)."""
        self._check_writable()
        self._queue.append(batch)
        self._wake.set()

    def withdraw(self, batch: Batch) -> bool:
        """Take a batch not yet picked by the writer out of the queue."""
        if batch.taken or batch not in self._queue:
            return False
        self._queue.remove(batch)
        return True

    def reset(self, part: TopicPart) -> None:
        """Declare the topic's records in the log gone for good (a RESET frame, queued,
        not waited for: whatever the topic writes next comes after it in the log)."""
        part.reset()
        batch = Batch(part)
        batch.controls.append(Control(FrameKind.RESET))
        self.enqueue(batch)

    async def release_topic(self, part: TopicPart) -> None:
        """The topic was sealed: its local records are gone for good."""
        if self.private:
            # The log was the topic's own: nothing else is in the directory.
            part.reset()
            await self.close()
            await asyncio.to_thread(shutil.rmtree, self.directory, True)
            return
        if self._failure is None and not self._closing and not self._closed:
            self.reset(part)
        else:
            part.reset()  # not written: recovery finds the records and the seal wins

    async def ensure_segment(self) -> None:
        """Create the active segment now if there is none (ahead of a first append)."""
        self._check_writable()
        async with self._io_lock:
            if self._active is None:
                await self._roll()

    async def _write_loop(self) -> None:
        """Group commit: whatever all topics queued while the previous batch was written."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batches, self._queue = self._queue, []
                for batch in batches:
                    batch.taken = True
                try:
                    await self._commit(batches)
                except BaseException as exc:
                    self._failure = exc
                    failure = WalError(f"{self.name}: write failed: {exc}")
                    for batch in batches:
                        batch.resolve(failure)
                    self._fail_queued(failure)
                    if isinstance(exc, Exception):
                        log.error("%s: write failed, the log stops: %s", self.name, exc)
                        return
                    raise
            if self._closing:
                return

    def _fail_queued(self, failure: BaseException) -> None:
        queued, self._queue = self._queue, []
        for batch in queued:
            batch.resolve(failure)

    async def _write(self, data: bytes, sync: bool) -> None:
        """Write (and fsync if `sync`) one batch to the active segment."""
        fd = self._fd
        assert fd is not None
        if sync or len(data) > _INLINE_WRITE_BYTES:
            await asyncio.to_thread(_write_all, fd, data, sync)
        else:
            _write_all(fd, data, False)

    async def _commit(self, batches: list[Batch]) -> None:
        sync = self.config.fsync_policy is FsyncPolicy.BATCH
        async with self._io_lock:
            segment = self._active
            if segment is None or segment.size >= self.config.segment_bytes:
                segment = await self._roll()
            chunks: list[bytes] = []
            starts: list[int] = []
            position = segment.size
            for batch in batches:
                part = batch.part
                if part.id not in segment.declared:
                    declaration = encode_frame(FrameKind.DECLARE, part.id, part.name.encode())
                    chunks.append(declaration)
                    position += len(declaration)
                    segment.declared.add(part.id)
                for control in batch.controls:
                    frame = control.encode(part.id)
                    chunks.append(frame)
                    position += len(frame)
                starts.append(position)
                chunks.extend(batch.frames)
                position += sum(len(f) for f in batch.frames)
            await self._write(b"".join(chunks), sync)
            segment.size = position
            self._written += 1
            if sync:
                self._synced = self._written
                self.stats.wal_fsyncs += 1
            else:
                self._dirty = True
            self.stats.wal_batches += 1
        interval = self.config.index_interval_bytes
        for batch, start in zip(batches, starts, strict=True):
            part = batch.part
            for control in batch.controls:
                if control.kind is FrameKind.RESET:
                    part.reset()
                elif control.gap is not None:
                    part.declare_gap(*control.gap)
            position = start
            for record, frame in zip(batch.records, batch.frames, strict=True):
                part.add(segment, record.offset, position, len(frame), interval)
                position += len(frame)
            batch.seq = self._written
            if batch.on_commit is not None:
                try:
                    batch.on_commit(batch)
                except Exception:  # one topic's bug must not stop every topic's log
                    log.exception("%s: %s: commit callback failed", self.name, part.name)
            batch.resolve()

    async def _roll(self) -> Segment:
        """Close the active segment (fsynced unless the policy is `never`), start a new one."""
        policy = self.config.fsync_policy
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                if policy is not FsyncPolicy.NEVER and self._dirty:
                    await asyncio.to_thread(os.fsync, fd)
                    self.stats.wal_fsyncs += 1
                    self._synced = self._written
                self._dirty = False
            finally:
                os.close(fd)
            if self._active is not None:
                self._active.closed_at = self._clock.now()
        seq = self._next_seq
        self._next_seq += 1
        path = self.directory / _segment_name(seq)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if policy is FsyncPolicy.BATCH:
            # The new file's directory entry must be as durable as its frames.
            await asyncio.to_thread(_fsync_dir, self.directory)
        segment = Segment(seq, path)
        self._segments.append(segment)
        self._active = segment
        return segment

    async def sync(self) -> None:
        """fsync what was written and not fsynced yet."""
        async with self._io_lock:
            if self._dirty and self._fd is not None:
                target = self._written
                await asyncio.to_thread(os.fsync, self._fd)
                self.stats.wal_fsyncs += 1
                self._dirty = False
                self._synced = target

    async def _fsync_ticker(self) -> None:
        interval = self.config.fsync_interval_seconds
        while not self._closing:
            await self._clock.sleep(interval)
            try:
                await self.sync()
            except OSError as exc:
                self._failure = exc
                log.error("%s: fsync failed, the log stops: %s", self.name, exc)
                return

    # -- retention -------------------------------------------------------------------------

    def _deletable(self, segment: Segment, now: float) -> bool:
        return (
            segment is not self._active
            and segment.pins == 0
            and segment.closed_at is not None
            and now - segment.closed_at >= self.config.retention_seconds
        )

    async def apply_retention(self) -> int:
        """Delete the oldest segments while nothing in them is needed any more and they
        are older than the retention period; how many were deleted."""
        now = self._clock.now()
        if not self._segments or not self._deletable(self._segments[0], now):
            return 0  # the common case, for every topic's upload pass: no lock, no scan
        deleted = 0
        async with self._io_lock:
            while self._segments and self._deletable(self._segments[0], now):
                segment = self._segments[0]
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(segment.path.unlink)
                self._segments.pop(0)
                for part in segment.parts:
                    part.drop_segment(segment)
                deleted += 1
        if deleted:
            self.stats.wal_segments_deleted += deleted
            log.info("%s: retention deleted %d segment(s)", self.name, deleted)
        return deleted
