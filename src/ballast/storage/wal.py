"""The write-ahead log of one reliable topic.

Segments are append-only files named after their first offset (``{offset:020}.wal``) and
hold frames of the record codec. Appends get their offsets at once, in call order, and
are written by one writer task in group commits: whatever accumulated while the previous
batch was being written (and fsynced) becomes the next batch. An append returns only when
its batch is as durable as the fsync policy promises; only then does the batch become
visible to readers (a reader never sees a record that a crash could take back).

On open the segments are scanned and every CRC verified; a torn or corrupt tail is
truncated at the last good record (and later segments dropped), counted and logged, and
the log resumes at the next offset. Closed segments are deleted once they are in object
storage *and* older than the retention period.

Offsets are contiguous except across a gap declared on open (`open(..., allow_gap=True)`,
when the topic continues past a crashed owner's reservation): the next append starts a
new segment after the gap, and a marker file ``{start:020}-{end:020}.gap``, made durable
before that segment exists, tells recovery that the jump is not a lost segment. Offsets
in a gap do not exist: `read` continues at the next existing one.

With an `OffsetReserver` set, no offset beyond its reservation is ever assigned: an append
that would need one first waits for the reservation to be extended (or fails with it).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from ballast.aio import TaskOwner
from ballast.clock import Clock
from ballast.storage.codec import (
    Message,
    Record,
    RecordDecoder,
    encode_record,
    frame_size,
)
from ballast.storage.config import FsyncPolicy, StorageConfig
from ballast.storage.stats import StorageStats

__all__ = [
    "OffsetReserver",
    "OffsetUnavailableError",
    "WalClosedError",
    "WalError",
    "WalRecovery",
    "WriteAheadLog",
]

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".wal"
GAP_SUFFIX = ".gap"
_SCAN_CHUNK = 4 * 1024 * 1024
# Below this size a batch is written on the event loop thread: a write to the page cache
# is quicker than a hop to a worker thread.
_INLINE_WRITE_BYTES = 256 * 1024


class WalError(Exception):
    """The WAL cannot do what was asked (I/O failure, bad state)."""


class WalClosedError(WalError):
    """The WAL is closed (or was never started): no more appends."""


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


class _Segment:
    """Book-keeping of one segment file; `size` counts committed bytes only."""

    __slots__ = ("base", "closed_at", "index_offsets", "index_positions", "last", "path", "size")

    def __init__(self, path: Path, base: int) -> None:
        self.path = path
        self.base = base
        self.last: int | None = None
        self.size = 0
        self.index_offsets: list[int] = []
        self.index_positions: list[int] = []
        self.closed_at: float | None = None

    def note(self, offset: int, position: int, interval: int) -> None:
        """Index `offset` at `position` if the previous index entry is far enough behind."""
        if not self.index_positions or position - self.index_positions[-1] >= interval:
            self.index_offsets.append(offset)
            self.index_positions.append(position)

    def position_for(self, offset: int) -> int:
        """Byte position of the indexed record at or before `offset`."""
        i = bisect.bisect_right(self.index_offsets, offset) - 1
        return self.index_positions[max(i, 0)]


class _Batch:
    """Appends waiting for the same group commit."""

    __slots__ = ("frames", "future", "nbytes", "records")

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.frames: list[bytes] = []
        self.nbytes = 0
        self.future: asyncio.Future[None] | None = None

    def waiter(self) -> asyncio.Future[None]:
        """The future resolved when this batch is committed (created on first use)."""
        if self.future is None:
            self.future = asyncio.get_running_loop().create_future()
        return self.future

    def resolve(self, exc: BaseException | None = None) -> None:
        """Acknowledge the batch, or fail it with `exc`."""
        if self.future is None or self.future.done():
            return
        if exc is None:
            self.future.set_result(None)
        else:
            self.future.set_exception(exc)
            # Waiters may all have been cancelled; do not log "exception never retrieved".
            self.future.exception()


def _segment_name(base: int) -> str:
    return f"{base:020d}{SEGMENT_SUFFIX}"


def _gap_name(start: int, end: int) -> str:
    return f"{start:020d}-{end:020d}{GAP_SUFFIX}"


def _parse_gap_name(path: Path) -> tuple[int, int] | None:
    start, sep, end = path.stem.partition("-")
    if not sep or not start.isdigit() or not end.isdigit() or int(end) < int(start):
        return None
    return int(start), int(end)


def _write_all(fd: int, data: bytes, sync: bool) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    if sync:
        os.fsync(fd)


def _pread(path: Path, position: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(position)
        return f.read(length)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    """Append-only, CRC-checked, group-committed log of one topic in `directory`.

    Lifecycle: `recover()` scans the files, `open(next_offset)` fixes where appends
    continue, ``async with wal:`` runs the writer (and, for the interval policy, the fsync
    ticker) in a task group; leaving the block writes and fsyncs what is pending.
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        clock: Clock,
        config: StorageConfig | None = None,
        stats: StorageStats | None = None,
        name: str = "wal",
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self._clock = clock
        self._config = config or StorageConfig()
        self._stats = stats or StorageStats()
        self._segments: list[_Segment] = []
        self._fd: int | None = None  # active segment, open for appending
        self._recovered = False
        self._opened = False
        self._running = False
        self._closing = False
        self._closed = False
        self._failure: BaseException | None = None
        self._next_offset = 0
        self._committed = -1  # last offset visible to readers (as durable as the policy)
        self._dirty = False  # written but not fsynced
        self._pending = _Batch()
        self._inflight: _Batch | None = None
        self._wake = asyncio.Event()
        self._committed_event = asyncio.Event()
        self._io_lock = asyncio.Lock()
        self._cache: list[Record] = []
        self._cache_start = 0
        self._cache_bytes = 0  # payload + key bytes of the cached records
        self._uploaded = -1
        self._unuploaded_bytes = 0
        self._upload_trigger: Callable[[], None] | None = None
        self._tasks = TaskOwner(name)
        self._ticker: asyncio.Task[None] | None = None
        self._reserver: OffsetReserver | None = None
        self._gap_markers: dict[tuple[int, int], Path] = {}
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
        for segment in self._segments:
            if segment.last is not None:
                return segment.base
        return self._committed + 1

    @property
    def closed(self) -> bool:
        """True once the WAL stopped (readers waiting for new records are released)."""
        return self._closed

    @property
    def segment_count(self) -> int:
        """Number of segment files."""
        return len(self._segments)

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
        """Everything up to `offset` is in object storage (enables retention)."""
        if offset > self._uploaded:
            self._uploaded = offset
            self._unuploaded_bytes = max(0, self._unuploaded_bytes - nbytes)

    # -- recovery --------------------------------------------------------------------------

    async def recover(self) -> WalRecovery:
        """Scan the segment files, verify every record and truncate a bad tail."""
        if self._recovered:
            raise WalError(f"{self.name}: already recovered")
        if self.directory.exists():
            recovery = await asyncio.to_thread(self._recover_sync)
        else:
            # Nothing to scan (a topic new to this broker, e.g. one that moved here): no
            # thread hop on a move's path, only the directory to create.
            recovery = self._recover_sync()
        self._recovered = True
        if recovery.truncated_bytes or recovery.dropped_segments:
            self._stats.wal_truncated_tails += 1
            self._stats.wal_truncated_bytes += recovery.truncated_bytes
            self._stats.wal_dropped_segments += recovery.dropped_segments
            log.warning(
                "%s: truncated %d bytes and dropped %d segment(s) after offset %s (%s)",
                self.name,
                recovery.truncated_bytes,
                recovery.dropped_segments,
                recovery.last_offset,
                recovery.corruption,
            )
        return recovery

    def _recover_sync(self) -> WalRecovery:
        self.directory.mkdir(parents=True, exist_ok=True)
        files: list[tuple[int, Path]] = []
        markers: dict[tuple[int, int], Path] = {}
        for path in self.directory.iterdir():
            if path.suffix == GAP_SUFFIX:
                gap = _parse_gap_name(path)
                if gap is None:
                    log.warning("%s: ignoring stray file %s", self.name, path)
                else:
                    markers[gap] = path
                continue
            if path.suffix != SEGMENT_SUFFIX:
                continue
            try:
                files.append((int(path.stem), path))
            except ValueError:
                log.warning("%s: ignoring stray file %s", self.name, path)
        files.sort()
        truncated = 0
        dropped = 0
        records = 0
        corruption: str | None = None
        expected: int | None = None
        stop_at: int | None = None
        bridged: list[tuple[int, int]] = []
        interval = self._config.index_interval_bytes
        for i, (base, path) in enumerate(files):
            if stop_at is not None:
                break
            if expected is not None and base > expected and (expected, base - 1) in markers:
                bridged.append((expected, base - 1))  # a declared gap, not a lost segment
            elif expected is not None and base != expected:
                corruption = f"segment {path.name} starts at {base}, expected {expected}"
                stop_at = i
                break
            segment = _Segment(path, base)
            decoder = RecordDecoder()
            good_end = 0  # byte position after the last good, contiguous record
            next_expected = base
            bad: str | None = None
            file_size = path.stat().st_size
            with open(path, "rb") as f:
                while bad is None:
                    chunk = f.read(_SCAN_CHUNK)
                    if not chunk:
                        break
                    result = decoder.feed(chunk)
                    for record in result.records:
                        if record.offset != next_expected:
                            bad = f"offset {record.offset} where {next_expected} was expected"
                            break
                        segment.note(record.offset, good_end, interval)
                        good_end += frame_size(record)
                        segment.last = record.offset
                        next_expected += 1
                        records += 1
                    if result.corruption is not None and bad is None:
                        bad = f"{result.corruption.reason} at byte {result.corruption.position}"
            if bad is None and good_end < file_size:
                bad = f"torn record at byte {good_end} ({file_size - good_end} bytes)"
            if bad is not None:
                corruption = f"{path.name}: {bad}"
                truncated += file_size - good_end
                with open(path, "r+b") as f:
                    f.truncate(good_end)
                    os.fsync(f.fileno())
                stop_at = i + 1
            segment.size = good_end
            if segment.last is None:
                path.unlink()
                if stop_at is None and i == len(files) - 1:
                    break
                if stop_at is None:
                    # An empty segment in the middle cannot be: everything after is suspect.
                    corruption = corruption or f"{path.name}: empty segment"
                    stop_at = i + 1
                continue
            segment.closed_at = self._clock.now()
            self._segments.append(segment)
            expected = segment.last + 1
        if stop_at is not None:
            for _, path in files[stop_at:]:
                if path.exists():
                    truncated += path.stat().st_size
                    path.unlink()
                    dropped += 1
        if (truncated or dropped) and files:
            _fsync_dir(self.directory)
        if self._segments:
            self._segments[-1].closed_at = None  # the last one keeps taking appends
        first = self._segments[0].base if self._segments else None
        last = self._segments[-1].last if self._segments else None
        kept = {gap for gap in bridged if last is not None and gap[1] < last}
        for gap, path in markers.items():
            if gap in kept:
                self._gap_markers[gap] = path
            else:
                path.unlink(missing_ok=True)  # stale: bridges nothing that is left
        return WalRecovery(
            first,
            last,
            len(self._segments),
            records,
            truncated,
            dropped,
            corruption,
            tuple(sorted(kept)),
        )

    async def discard(self) -> int:
        """Delete every local segment (they are stale or already in object storage)."""
        if self._opened:
            raise WalError(f"{self.name}: cannot discard an open WAL")
        count = len(self._segments)
        for segment in self._segments:
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(segment.path.unlink)
        self._segments.clear()
        for path in self._gap_markers.values():
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(path.unlink)
        self._gap_markers.clear()
        return count

    async def open(self, next_offset: int, *, allow_gap: bool = False) -> None:
        """Continue at `next_offset`; it must follow the recovered records exactly.

        With `allow_gap`, it may also lie beyond them: the offsets in between never exist
        (the next append starts a new segment and records the gap).
        """
        if not self._recovered:
            await self.recover()
        if self._opened:
            raise WalError(f"{self.name}: already open")
        last = self._segments[-1].last if self._segments else None
        if last is not None and not (
            next_offset == last + 1 or (allow_gap and next_offset > last + 1)
        ):
            raise WalError(
                f"{self.name}: local segments end at offset {last}, cannot continue at "
                f"{next_offset}; discard() them first"
            )
        if next_offset < 0:
            raise WalError(f"{self.name}: next offset must be >= 0, got {next_offset}")
        self._next_offset = next_offset
        self._committed = next_offset - 1
        self._cache_start = next_offset
        self._opened = True
        if self._segments:
            segment = self._segments[-1]
            self._fd = os.open(segment.path, os.O_WRONLY | os.O_APPEND)

    # -- service lifecycle -----------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if not self._opened:
            raise WalError(f"{self.name}: open() it before starting it")
        if self._closed or self._running:
            raise WalError(f"{self.name}: already started or closed")
        await self._tasks.open()
        self._running = True
        self._tasks.spawn(self._writer(), "writer")
        if self._config.fsync_policy is FsyncPolicy.INTERVAL:
            self._ticker = self._tasks.spawn(self._fsync_ticker(), "fsync")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing = True
        self._wake.set()
        if self._ticker is not None:
            # It sleeps on the injected clock, which may never move again: stop it outright.
            self._ticker.cancel()
        try:
            await self._tasks.close(exc_type, exc, tb, cancel=False)
        finally:
            self._running = False
            await self.close_files()

    async def close_files(self) -> None:
        """Close the active segment's file (fsynced if dirty); appends and waiting readers
        are refused from then on. Also for a WAL opened and never started."""
        async with self._io_lock:
            fd, self._fd = self._fd, None
            if fd is not None:
                try:
                    if self._dirty:
                        await asyncio.to_thread(os.fsync, fd)
                        self._stats.wal_fsyncs += 1
                        self._dirty = False
                finally:
                    os.close(fd)
        self._closed = True
        failure = self._failure or WalClosedError(f"{self.name}: closed")
        self._pending.resolve(failure)
        self._notify()

    async def destroy(self) -> None:
        """Delete the WAL directory (after a seal: everything is in object storage)."""
        if self._running:
            raise WalError(f"{self.name}: stop the WAL before destroying it")
        self._segments.clear()
        self._cache.clear()
        self._cache_bytes = 0
        await asyncio.to_thread(shutil.rmtree, self.directory, True)

    # -- appends ---------------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._failure is not None:
            raise WalError(f"{self.name}: failed earlier: {self._failure}") from self._failure
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

    def _enqueue(self, messages: Sequence[Message]) -> tuple[int, _Batch]:
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
        batch = self._pending
        for i, message in enumerate(messages):
            record = Record(first + i, now, message.payload, message.key, message.headers)
            frame = encode_record(record)
            batch.records.append(record)
            batch.frames.append(frame)
            batch.nbytes += len(frame)
        self._next_offset = first + len(messages)
        self._wake.set()
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
        await self._sync()
        return self._committed

    async def settle(self) -> int:
        """Wait for every append so far to be written (not fsynced); returns the last
        committed offset."""
        while True:
            if self._failure is not None:
                raise WalError(f"{self.name}: failed: {self._failure}") from self._failure
            batch = self._pending if self._pending.records else self._inflight
            if batch is None:
                break
            if not self._running:
                raise WalClosedError(f"{self.name}: appends pending but the writer is stopped")
            await asyncio.shield(batch.waiter())
        return self._committed

    async def _sync(self) -> None:
        async with self._io_lock:
            if self._dirty and self._fd is not None:
                await asyncio.to_thread(os.fsync, self._fd)
                self._stats.wal_fsyncs += 1
                self._dirty = False

    async def _writer(self) -> None:
        """Group commit: write (and fsync) whatever accumulated, then acknowledge it."""
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._pending.records:
                    batch, self._pending = self._pending, _Batch()
                    self._inflight = batch
                    try:
                        await self._write(batch)
                    except BaseException as exc:
                        self._failure = exc
                        batch.resolve(WalError(f"{self.name}: write failed: {exc}"))
                        raise
                    finally:
                        self._inflight = None
                    self._commit(batch)
                if self._closing:
                    return
        finally:
            if self._pending.records:
                failure = self._failure or WalClosedError(f"{self.name}: writer stopped")
                self._pending.resolve(failure)

    async def _write(self, batch: _Batch) -> None:
        sync = self._config.fsync_policy is FsyncPolicy.BATCH
        data = b"".join(batch.frames)
        async with self._io_lock:
            first = batch.records[0].offset
            if self._needs_segment(first):
                await self._roll(first)
            assert self._fd is not None
            if sync or len(data) > _INLINE_WRITE_BYTES:
                await asyncio.to_thread(_write_all, self._fd, data, sync)
            else:
                _write_all(self._fd, data, False)
            if sync:
                self._stats.wal_fsyncs += 1
            else:
                self._dirty = True

    def _needs_segment(self, first: int) -> bool:
        """Whether an append at `first` needs a new segment."""
        active = self._segments[-1] if self._segments else None
        return (
            active is None
            or (active.size >= self._config.segment_bytes and active.last is not None)
            or (active.last is not None and first != active.last + 1)  # after a gap
        )

    async def start_segment(self) -> None:
        """Create the segment the next append goes to now, if it needs a new one: a topic
        that moved here opens while its first send waits, which then only writes. (Left
        empty by a crash, recovery removes it.)"""
        if not self._opened:
            raise WalError(f"{self.name}: open() it before starting a segment")
        async with self._io_lock:
            if self._needs_segment(self._next_offset):
                await self._roll(self._next_offset)

    async def _roll(self, base: int) -> None:
        """Close the active segment (fsynced unless the policy is `never`), start a new one."""
        policy = self._config.fsync_policy
        previous = self._segments[-1].last if self._segments else None
        if previous is not None and base > previous + 1:
            # Declare the gap durably before a segment after it exists: recovery must not
            # take the jump for a lost segment (and drop everything after it).
            gap = (previous + 1, base - 1)
            marker = self.directory / _gap_name(*gap)
            await asyncio.to_thread(marker.touch)
            await asyncio.to_thread(_fsync_dir, self.directory)
            self._gap_markers[gap] = marker
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if policy is not FsyncPolicy.NEVER and self._dirty:
                await asyncio.to_thread(os.fsync, fd)
                self._stats.wal_fsyncs += 1
            self._dirty = False
            os.close(fd)
            self._segments[-1].closed_at = self._clock.now()
        path = self.directory / _segment_name(base)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if policy is FsyncPolicy.BATCH:
            # The new file's directory entry must be as durable as its records.
            await asyncio.to_thread(_fsync_dir, self.directory)
        self._segments.append(_Segment(path, base))

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

    def _commit(self, batch: _Batch) -> None:
        segment = self._segments[-1]
        interval = self._config.index_interval_bytes
        position = segment.size
        for record, frame in zip(batch.records, batch.frames, strict=True):
            segment.note(record.offset, position, interval)
            position += len(frame)
        segment.size = position
        segment.last = batch.records[-1].offset
        self._committed = segment.last
        if not self._cache:
            self._cache_start = batch.records[0].offset
        self._cache.extend(batch.records)
        added = sum(r.size for r in batch.records)
        self._cache_bytes += added
        self._trim_cache()
        self._stats.appended_records += len(batch.records)
        self._stats.appended_bytes += added
        self._stats.wal_batches += 1
        self._unuploaded_bytes += batch.nbytes
        if self._upload_trigger is not None:
            self._upload_trigger()
        batch.resolve()
        self._notify()

    def _notify(self) -> None:
        event, self._committed_event = self._committed_event, asyncio.Event()
        event.set()

    async def _fsync_ticker(self) -> None:
        interval = self._config.fsync_interval_seconds
        while not self._closing:
            await self._clock.sleep(interval)
            await self._sync()

    # -- reads -----------------------------------------------------------------------------

    async def wait_for(self, offset: int) -> bool:
        """Wait until `offset` is committed; False if the WAL closed first."""
        while self._committed < offset:
            if self._closed or self._failure is not None:
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
        starts = [s.base for s in self._segments]
        i = bisect.bisect_right(starts, from_offset) - 1
        if i < 0:
            raise OffsetUnavailableError(f"{self.name}: offset {from_offset} not in any segment")
        segment = self._segments[i]
        if segment.last is not None and from_offset > segment.last:
            # In a gap after this segment: those offsets do not exist, the next one does.
            if i + 1 >= len(self._segments):
                return []
            segment = self._segments[i + 1]
            from_offset = segment.base
        if segment.last is None:
            return []  # just rolled, nothing committed in it yet
        limit = segment.size
        position = segment.position_for(from_offset)
        chunk = self._config.read_batch_bytes
        while True:
            length = min(chunk, limit - position)
            try:
                data = await asyncio.to_thread(_pread, segment.path, position, length)
            except FileNotFoundError as exc:
                raise OffsetUnavailableError(
                    f"{self.name}: segment {segment.path.name} was removed"
                ) from exc
            result = RecordDecoder(position).feed(data)
            if result.corruption is not None:
                raise WalError(
                    f"{self.name}: {segment.path.name} corrupt at byte "
                    f"{result.corruption.position}: {result.corruption.reason}"
                )
            records = [r for r in result.records if from_offset <= r.offset <= self._committed][
                :max_records
            ]
            if records or length >= limit - position:
                return records
            chunk *= 2  # a record larger than the chunk: read more

    # -- retention -------------------------------------------------------------------------

    async def apply_retention(self) -> int:
        """Delete closed segments that are uploaded and older than the retention period."""
        now = self._clock.now()
        retention = self._config.retention_seconds
        deleted = 0
        async with self._io_lock:
            # Only a prefix of segments goes, so the local range stays contiguous.
            while len(self._segments) > 1:
                segment = self._segments[0]
                if segment.last is None or segment.last > self._uploaded:
                    break
                if segment.closed_at is None or now - segment.closed_at < retention:
                    break
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(segment.path.unlink)
                self._segments.pop(0)
                deleted += 1
        if deleted:
            self._stats.wal_segments_deleted += deleted
            first = self.first_offset
            for gap in [g for g in self._gap_markers if g[1] < first]:
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(self._gap_markers.pop(gap).unlink)
            if self._cache and self._cache_start < first:
                self._drop_cached(first - self._cache_start)
            log.info(
                "%s: retention deleted %d segment(s); first offset %d", self.name, deleted, first
            )
        return deleted
