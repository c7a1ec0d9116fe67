"""The WAL: group commit, fsync policies, segments, recovery of torn and corrupt tails."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import pytest

from ballast.clock import FakeClock
from ballast.storage import (
    FsyncPolicy,
    Message,
    OffsetUnavailableError,
    StorageConfig,
    StorageStats,
    WalClosedError,
    WalError,
    WalRecovery,
    WriteAheadLog,
)
from ballast.storage.codec import encode_record

from .helpers import eventually, payload


async def opened(
    directory: Path,
    clock: FakeClock,
    config: StorageConfig,
    next_offset: int | None = None,
    stats: StorageStats | None = None,
    *,
    allow_gap: bool = False,
) -> tuple[WriteAheadLog, WalRecovery]:
    wal = WriteAheadLog(directory, clock=clock, config=config, stats=stats)
    recovery = await wal.recover()
    if next_offset is None:
        next_offset = 0 if recovery.last_offset is None else recovery.last_offset + 1
    await wal.open(next_offset, allow_gap=allow_gap)
    return wal, recovery


async def fill(wal: WriteAheadLog, start: int, count: int) -> list[int]:
    offsets = await wal.append_batch([Message(payload(o)) for o in range(start, start + count)])
    return list(offsets)


async def read_all(wal: WriteAheadLog, start: int) -> list[int]:
    out: list[int] = []
    offset = start
    while True:
        records = await wal.read(offset, max_records=7)
        if not records:
            return out
        for record in records:
            assert record.payload == payload(record.offset)
            out.append(record.offset)
        offset = records[-1].offset + 1


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.wal"))


async def test_appends_get_contiguous_offsets_and_read_back(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    wal, recovery = await opened(tmp_path / "wal", clock, config)
    assert recovery.last_offset is None
    async with wal:
        assert await wal.append(b"first", key=b"k", headers=(("h", b"v"),)) == 0
        for start in range(1, 100, 11):
            assert await fill(wal, start, 11) == list(range(start, start + 11))
        assert wal.committed_offset == 99 and wal.next_offset == 100
        first = (await wal.read(0, 1))[0]
        assert (first.payload, first.key, first.headers) == (b"first", b"k", (("h", b"v"),))
        assert first.timestamp == clock.now()
        assert await read_all(wal, 1) == list(range(1, 100))
        # Segments rolled (1 KiB each) and the cache holds only the newest records, so
        # most of these reads went to the files through the sparse index.
        assert len(segment_files(tmp_path / "wal")) > 1
        assert await read_all(wal, 57) == list(range(57, 100))


async def test_concurrent_appends_are_group_committed_in_call_order(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    stats = StorageStats()
    wal, _ = await opened(tmp_path / "wal", clock, config, stats=stats)
    async with wal:
        offsets = await asyncio.gather(*(wal.append(payload(i)) for i in range(200)))
        assert offsets == list(range(200))
        assert await read_all(wal, 0) == list(range(200))
    assert stats.appended_records == 200
    assert stats.wal_batches < 200  # appends shared commits


async def test_initial_offset_is_respected(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    wal, _ = await opened(tmp_path / "wal", clock, config, next_offset=22)
    async with wal:
        assert wal.first_offset == 22 and wal.committed_offset == 21
        assert await fill(wal, 22, 6) == list(range(22, 28))
    assert segment_files(tmp_path / "wal")[0].name == f"{22:020d}.wal"


async def test_reopen_resumes_after_the_last_record(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    wal, _ = await opened(tmp_path / "wal", clock, config, next_offset=5)
    async with wal:
        await fill(wal, 5, 120)
    wal2, recovery = await opened(tmp_path / "wal", clock, config)
    assert recovery.clean
    assert (recovery.first_offset, recovery.last_offset, recovery.records) == (5, 124, 120)
    async with wal2:
        assert wal2.next_offset == 125
        assert await fill(wal2, 125, 3) == [125, 126, 127]
        assert await read_all(wal2, 5) == list(range(5, 128))


async def test_open_refuses_an_offset_that_does_not_continue_the_log(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    wal, _ = await opened(tmp_path / "wal", clock, config)
    async with wal:
        await fill(wal, 0, 10)
    wal2 = WriteAheadLog(tmp_path / "wal", clock=clock, config=config)
    await wal2.recover()
    with pytest.raises(WalError, match="discard"):
        await wal2.open(50)
    assert await wal2.discard() >= 1
    await wal2.open(50)
    assert segment_files(tmp_path / "wal") == []


async def test_torn_tail_is_truncated_counted_and_appends_continue(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    wal, _ = await opened(tmp_path / "wal", clock, config)
    async with wal:
        await fill(wal, 0, 50)
    last = segment_files(tmp_path / "wal")[-1]
    size = last.stat().st_size
    os.truncate(last, size - 5)  # the last record lost its final bytes
    stats = StorageStats()
    wal2, recovery = await opened(tmp_path / "wal", clock, config, stats=stats)
    assert recovery.last_offset == 48
    assert recovery.truncated_bytes == len(encode_record_for(48 + 1)) - 5
    assert "torn" in (recovery.corruption or "")
    assert stats.wal_truncated_tails == 1 and stats.wal_truncated_bytes > 0
    async with wal2:
        assert await wal2.append(payload(49)) == 49
        assert await read_all(wal2, 0) == list(range(50))


def encode_record_for(offset: int) -> bytes:
    from ballast.storage.codec import Record

    return encode_record(Record(offset, FakeClock().now(), payload(offset)))


async def test_garbage_after_the_last_record_is_truncated(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    wal, _ = await opened(tmp_path / "wal", clock, config)
    async with wal:
        await fill(wal, 0, 10)
    last = segment_files(tmp_path / "wal")[-1]
    good = last.stat().st_size
    with open(last, "ab") as f:
        f.write(b"\x00\x00\x00\x40garbage")
    wal2, recovery = await opened(tmp_path / "wal", clock, config)
    assert recovery.last_offset == 9 and recovery.truncated_bytes == 11
    assert last.stat().st_size == good
    async with wal2:
        assert await wal2.append(b"x") == 10


async def test_corrupt_crc_in_the_tail_truncates_from_that_record(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    wal, _ = await opened(tmp_path / "wal", clock, config)
    async with wal:
        await fill(wal, 0, 10)
    (last,) = segment_files(tmp_path / "wal")
    frame = len(encode_record_for(0))
    data = bytearray(last.read_bytes())
    data[7 * frame + 20] ^= 0xFF  # inside record 7's body
    last.write_bytes(bytes(data))
    wal2, recovery = await opened(tmp_path / "wal", clock, config)
    assert recovery.last_offset == 6
    assert "CRC" in (recovery.corruption or "")
    assert recovery.truncated_bytes == 3 * frame
    async with wal2:
        assert await wal2.append(payload(7)) == 7
        assert await read_all(wal2, 0) == list(range(8))


async def test_corruption_in_an_early_segment_drops_the_later_ones(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    wal, _ = await opened(tmp_path / "wal", clock, config)
    async with wal:
        for start in range(0, 150, 10):  # separate batches so segments roll
            await fill(wal, start, 10)
    files = segment_files(tmp_path / "wal")
    assert len(files) >= 3
    first = files[0]
    data = bytearray(first.read_bytes())
    data[-3] ^= 0x01  # the last record of the first segment
    first.write_bytes(bytes(data))
    stats = StorageStats()
    wal2, recovery = await opened(tmp_path / "wal", clock, config, stats=stats)
    later = int(files[1].stem)
    assert recovery.last_offset == later - 2
    assert recovery.dropped_segments == len(files) - 1
    assert stats.wal_dropped_segments == len(files) - 1
    assert segment_files(tmp_path / "wal") == [first]
    async with wal2:
        assert await wal2.append(b"again") == later - 1


async def test_missing_middle_segment_is_treated_as_corruption(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    wal, _ = await opened(tmp_path / "wal", clock, config)
    async with wal:
        for start in range(0, 150, 10):
            await fill(wal, start, 10)
    files = segment_files(tmp_path / "wal")
    files[1].unlink()
    _, recovery = await opened(tmp_path / "wal", clock, config)
    assert recovery.last_offset == int(files[1].stem) - 1
    assert "expected" in (recovery.corruption or "")


async def test_live_reader_is_woken_by_a_commit(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    wal, _ = await opened(tmp_path / "wal", clock, config)
    async with wal:
        waiter = asyncio.ensure_future(wal.wait_for(0))
        await asyncio.sleep(0)
        assert not waiter.done()
        await wal.append(b"now")
        assert await asyncio.wait_for(waiter, 1) is True
        closing = asyncio.ensure_future(wal.wait_for(5))
        await asyncio.sleep(0)
    assert await asyncio.wait_for(closing, 1) is False  # released by the close


async def test_appends_after_close_are_refused(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    wal, _ = await opened(tmp_path / "wal", clock, config)
    with pytest.raises(WalClosedError):
        await wal.append(b"not started")
    async with wal:
        await wal.append(b"ok")
    with pytest.raises(WalClosedError):
        await wal.append(b"closed")


async def test_a_cancelled_appender_does_not_fail_the_batch(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    wal, _ = await opened(tmp_path / "wal", clock, config)
    async with wal:
        cancelled = asyncio.ensure_future(wal.append(b"a"))
        kept = asyncio.ensure_future(wal.append(b"b"))
        await asyncio.sleep(0)
        cancelled.cancel()
        assert await kept == 1
        # The cancelled append was already in the batch: it is durable all the same.
        assert [r.payload for r in await wal.read(0)] == [b"a", b"b"]


@pytest.mark.parametrize("policy", list(FsyncPolicy))
async def test_fsync_policies(
    tmp_path: Path, clock: FakeClock, config: StorageConfig, policy: FsyncPolicy
) -> None:
    stats = StorageStats()
    cfg = replace(config, fsync_policy=policy, segment_bytes=1 << 20, fsync_interval_seconds=1.0)
    wal, _ = await opened(tmp_path / "wal", clock, cfg, stats=stats)
    async with wal:
        for i in range(5):
            await wal.append(payload(i))
        after_appends = stats.wal_fsyncs
        await clock.advance(1.5)
        if policy is FsyncPolicy.INTERVAL:
            await eventually(lambda: stats.wal_fsyncs > 0)  # the fsync runs in a thread
        after_tick = stats.wal_fsyncs
    expected = {
        # (after the appends, after the interval passed, after the close)
        FsyncPolicy.BATCH: (5, 5, 5),  # one per batch, before each append returned
        FsyncPolicy.INTERVAL: (0, 1, 1),  # the ticker synced the dirty segment
        FsyncPolicy.NEVER: (0, 0, 1),  # only the close syncs
    }[policy]
    assert (after_appends, after_tick, stats.wal_fsyncs) == expected


@pytest.mark.parametrize(("call", "fsyncs"), [("flush", 1), ("settle", 0)])
async def test_flush_and_settle_wait_for_pending_writes_only_flush_syncs(
    tmp_path: Path, clock: FakeClock, config: StorageConfig, call: str, fsyncs: int
) -> None:
    stats = StorageStats()
    cfg = replace(config, fsync_policy=FsyncPolicy.NEVER)
    wal, _ = await opened(tmp_path / "wal", clock, cfg, stats=stats)
    async with wal:
        pending = [asyncio.ensure_future(wal.append(payload(i))) for i in range(3)]
        await asyncio.sleep(0)  # the appends enqueue; none is committed yet
        assert wal.committed_offset == -1
        assert await getattr(wal, call)() == 2
        assert all(p.done() for p in pending)
        assert stats.wal_fsyncs == fsyncs


async def test_retention_deletes_only_uploaded_and_old_segments(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    wal, _ = await opened(tmp_path / "wal", clock, config)
    async with wal:
        for start in range(0, 200, 10):
            await fill(wal, start, 10)
        files = segment_files(tmp_path / "wal")
        assert len(files) >= 4
        # Old enough but not uploaded: kept.
        await clock.advance(120)
        assert await wal.apply_retention() == 0
        # Uploaded up to the middle of the third segment: the first two can go once old.
        third = int(files[2].stem)
        wal.mark_uploaded(third + 1)
        assert await wal.apply_retention() == 2
        assert wal.first_offset == third
        with pytest.raises(OffsetUnavailableError):
            await wal.read(0)
        assert await read_all(wal, third) == list(range(third, 200))
        # Everything uploaded but the newest segments are young: kept.
        wal.mark_uploaded(199)
        await fill(wal, 200, 60)  # rolls new segments now
        assert await wal.apply_retention() >= 1  # those closed 120 s ago
        young = wal.segment_count
        assert await wal.apply_retention() == 0
        assert wal.segment_count == young


async def test_open_past_a_gap_keeps_the_segments_and_recovery_trusts_the_marker(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    directory = tmp_path / "wal"
    wal, _ = await opened(directory, clock, config)
    async with wal:
        await fill(wal, 0, 10)
    wal2 = WriteAheadLog(directory, clock=clock, config=config)
    await wal2.recover()
    with pytest.raises(WalError, match="discard"):
        await wal2.open(5, allow_gap=True)  # a gap only ever goes forward
    await wal2.open(50, allow_gap=True)
    assert (wal2.first_offset, wal2.committed_offset, wal2.next_offset) == (0, 49, 50)
    async with wal2:
        assert await read_all(wal2, 0) == list(range(10))
        assert await wal2.read(10) == []  # nothing exists in the gap (yet)
        assert await fill(wal2, 50, 5) == list(range(50, 55))
        # Offsets in the gap do not exist: a read there starts at the next existing one.
        assert [r.offset for r in await wal2.read(20)] == list(range(50, 55))
        assert await read_all(wal2, 0) == [*range(10), *range(50, 55)]
    assert [p.name for p in directory.glob("*.gap")] == [
        f"{10:020d}-{49:020d}.gap"
    ]  # declared before the segment after the gap was created
    assert segment_files(directory)[-1].name == f"{50:020d}.wal"
    wal3, recovery = await opened(directory, clock, config)
    assert recovery.clean and recovery.gaps == ((10, 49),)
    assert (recovery.first_offset, recovery.last_offset, recovery.records) == (0, 54, 15)
    async with wal3:
        assert await fill(wal3, 55, 2) == [55, 56]
        assert await read_all(wal3, 3) == [*range(3, 10), *range(50, 57)]
        # Once the segment before the gap is uploaded and old, it goes, and the marker too.
        wal3.mark_uploaded(49)
        await clock.advance(config.retention_seconds + 1)
        assert await wal3.apply_retention() >= 1
        assert wal3.first_offset == 50 and list(directory.glob("*.gap")) == []


async def test_a_jump_without_its_marker_is_still_a_lost_segment(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    directory = tmp_path / "wal"
    wal, _ = await opened(directory, clock, config)
    async with wal:
        await fill(wal, 0, 10)
    wal2, _ = await opened(directory, clock, config, 50, allow_gap=True)
    async with wal2:
        await fill(wal2, 50, 5)
    for marker in directory.glob("*.gap"):
        marker.unlink()
    _, recovery = await opened(directory, clock, config)
    assert recovery.last_offset == 9 and recovery.dropped_segments == 1
    assert recovery.corruption is not None and "expected 10" in recovery.corruption


async def test_a_segment_started_before_the_first_append_takes_it_and_a_crash_leaves_none(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    """`start_segment` creates the next append's segment (after its gap marker) at open;
    the append then only writes. Left empty by a crash, recovery removes it."""
    directory = tmp_path / "wal"
    wal, _ = await opened(directory, clock, config)
    async with wal:
        await fill(wal, 0, 10)
    wal2, _ = await opened(directory, clock, config, 50, allow_gap=True)
    await wal2.start_segment()
    assert [p.name for p in segment_files(directory)] == [f"{0:020d}.wal", f"{50:020d}.wal"]
    assert [p.name for p in directory.glob("*.gap")] == [f"{10:020d}-{49:020d}.gap"]
    await wal2.start_segment()  # already there: nothing more
    assert wal2.segment_count == 2
    assert await wal2.read(20) == []  # the empty segment holds nothing yet
    await wal2.close_files()  # a crash before any append
    wal3, recovery = await opened(directory, clock, config)
    assert recovery.clean and recovery.last_offset == 9
    assert [p.name for p in segment_files(directory)] == [f"{0:020d}.wal"]
    await wal3.close_files()
    wal4, _ = await opened(directory, clock, config, 50, allow_gap=True)
    await wal4.start_segment()
    async with wal4:
        assert await fill(wal4, 50, 3) == [50, 51, 52]
        assert wal4.segment_count == 2  # the append went into the started segment
    _, recovery = await opened(directory, clock, config)
    assert recovery.clean and recovery.gaps == ((10, 49),) and recovery.last_offset == 52


class CountingReserver:
    """An `OffsetReserver` that grants `step` more offsets per `ensure` (or fails)."""

    def __init__(self, limit: int, step: int) -> None:
        self.limit = limit
        self.step = step
        self.ensured: list[int] = []
        self.fail: Exception | None = None

    async def ensure(self, last_offset: int) -> None:
        self.ensured.append(last_offset)
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        self.limit = max(self.limit, last_offset) + self.step

    def note_next(self, next_offset: int) -> None:
        assert next_offset - 1 <= self.limit  # nothing beyond the reservation, ever


async def test_appends_never_assign_an_offset_beyond_the_reservation(
    tmp_path: Path, clock: FakeClock, config: StorageConfig
) -> None:
    stats = StorageStats()
    wal, _ = await opened(tmp_path / "wal", clock, config, stats=stats)
    reserver = CountingReserver(limit=4, step=5)
    wal.set_reserver(reserver)
    async with wal:
        assert [await wal.append(payload(o)) for o in range(5)] == list(range(5))
        assert reserver.ensured == []  # within the reservation: no waiting
        assert await wal.append(payload(5)) == 5
        assert reserver.ensured == [5] and reserver.limit == 10
        assert await fill(wal, 6, 12) == list(range(6, 18))  # a batch beyond it: waits once
        assert reserver.ensured == [5, 17] and stats.reservation_stalls == 2
        reserver.fail = RuntimeError("metadata store down")
        for _ in range(5):
            await wal.append(b"within")  # 18..22 are reserved
        with pytest.raises(RuntimeError, match="down"):
            await wal.append(b"beyond")
        assert wal.next_offset == 23  # nothing was assigned to the failed append
        reserver.fail = None
        assert await wal.append(b"again") == 23
