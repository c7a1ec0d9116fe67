"""The WAL: a topic's view on the broker log — group commit across topics, fsync policies,
segments, recovery of torn and corrupt tails, gaps, resets, retention, descriptors."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from ballast.clock import FakeClock
from ballast.storage import (
    AckMode,
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
from ballast.storage.codec import Record, encode_record
from ballast.storage.log import BrokerLog, FrameDecoder, FrameKind, encode_frame

from .helpers import eventually, payload

TOPIC = "/default/t"


class Logs:
    """Broker logs of a test, each on a directory; `restart` is a crash-free restart."""

    def __init__(self, clock: FakeClock, config: StorageConfig) -> None:
        self.clock = clock
        self.config = config
        self.started: list[BrokerLog] = []

    async def start(
        self,
        directory: Path,
        config: StorageConfig | None = None,
        stats: StorageStats | None = None,
    ) -> BrokerLog:
        log = BrokerLog(directory, clock=self.clock, config=config or self.config, stats=stats)
        self.started.append(log)
        await log.open()
        return log

    async def restart(
        self, log: BrokerLog, stats: StorageStats | None = None, *, close: bool = True
    ) -> BrokerLog:
        if close:
            await log.close()
        return await self.start(log.directory, log.config, stats)


@pytest.fixture
async def logs(clock: FakeClock, config: StorageConfig) -> AsyncIterator[Logs]:
    owner = Logs(clock, config)
    try:
        yield owner
    finally:
        for log in owner.started:
            await log.close()


async def opened(
    log: BrokerLog,
    clock: FakeClock,
    next_offset: int | None = None,
    stats: StorageStats | None = None,
    *,
    topic: str = TOPIC,
    allow_gap: bool = False,
) -> tuple[WriteAheadLog, WalRecovery]:
    wal = WriteAheadLog(log, topic, clock=clock, config=log.config, stats=stats)
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
    return sorted(directory.glob("*.log"))


def frames_of(path: Path) -> list[tuple[FrameKind, bytes]]:
    decoder = FrameDecoder()
    frames = decoder.feed(path.read_bytes())
    assert decoder.corruption is None and decoder.buffered == 0
    return [(f.kind, f.content) for f in frames]


def record_frame_size(offset: int) -> int:
    record = Record(offset, FakeClock().now(), payload(offset))
    return len(encode_frame(FrameKind.RECORD, 1, encode_record(record)))


async def test_appends_get_contiguous_offsets_and_read_back(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    log = await logs.start(tmp_path / "log")
    wal, recovery = await opened(log, clock)
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
        # most of these reads went to the files through the index.
        assert len(segment_files(tmp_path / "log")) > 1 and wal.segment_count > 1
        assert await read_all(wal, 57) == list(range(57, 100))


async def test_concurrent_appends_are_group_committed_in_call_order(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    stats = StorageStats()
    log = await logs.start(tmp_path / "log", stats=stats)
    wal, _ = await opened(log, clock)
    async with wal:
        offsets = await asyncio.gather(*(wal.append(payload(i)) for i in range(200)))
        assert offsets == list(range(200))
        assert await read_all(wal, 0) == list(range(200))
    assert stats.appended_records == 200
    assert stats.wal_batches < 200  # appends shared commits


async def test_topics_share_one_batch_one_fsync_and_read_back_their_own_records(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    stats = StorageStats()
    log = await logs.start(tmp_path / "log", stats=stats)
    wals = [(await opened(log, clock, topic=f"/ns/t{i}"))[0] for i in range(100)]
    for wal in wals:
        await wal.__aenter__()
    # Every topic appends while no batch is being written: one batch for all of them.
    assert await asyncio.gather(*(wal.append(payload(0)) for wal in wals)) == [0] * 100
    assert (stats.wal_batches, stats.wal_fsyncs, stats.appended_records) == (1, 1, 100)
    # Then many rounds at once: whatever queued while a batch was written is the next.
    await asyncio.gather(*(fill(wal, 1, 1) for wal in wals), *(fill(wal, 2, 3) for wal in wals))
    assert stats.wal_fsyncs == stats.wal_batches <= 3  # not one per topic
    for wal in wals:
        await wal.__aexit__(None, None, None)
    restarted = await logs.restart(log)
    for i in (0, 42, 99):
        wal, recovery = await opened(restarted, clock, topic=f"/ns/t{i}")
        assert (recovery.first_offset, recovery.last_offset, recovery.records) == (0, 4, 5)
        async with wal:
            assert await read_all(wal, 0) == list(range(5))  # from the files, its own only


async def test_file_descriptors_stay_constant_with_a_thousand_topics(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    stats = StorageStats()
    config = replace(logs.config, segment_bytes=1 << 20)
    log = await logs.start(tmp_path / "log", config, stats)
    wal, _ = await opened(log, clock, topic="/ns/first")
    async with wal:
        await wal.append(b"x")  # the active segment is open
    before = len(os.listdir("/proc/self/fd"))
    wals = [(await opened(log, clock, topic=f"/ns/t{i}"))[0] for i in range(1000)]
    for wal in wals:
        await wal.__aenter__()
    batches = stats.wal_batches
    await asyncio.gather(*(fill(wal, 0, 2) for wal in wals))
    during = len(os.listdir("/proc/self/fd"))
    assert stats.appended_records == 2001
    assert stats.wal_batches - batches <= 2 and stats.wal_fsyncs == stats.wal_batches
    assert during - before <= 2  # not one per topic (allowing for a worker thread's)
    for wal in wals:
        await wal.__aexit__(None, None, None)
    assert len(os.listdir("/proc/self/fd")) <= before


async def test_initial_offset_is_respected(tmp_path: Path, clock: FakeClock, logs: Logs) -> None:
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock, next_offset=22)
    async with wal:
        assert wal.first_offset == 22 and wal.committed_offset == 21
        assert await fill(wal, 22, 6) == list(range(22, 28))
    _, recovery = await opened(await logs.restart(log), clock)
    assert (recovery.first_offset, recovery.last_offset) == (22, 27)


async def test_reopen_resumes_after_the_last_record(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock, next_offset=5)
    async with wal:
        await fill(wal, 5, 120)
    # Reopened on the same log (a topic closed and opened again), then after a restart.
    again, recovery = await opened(log, clock)
    assert (recovery.first_offset, recovery.last_offset, recovery.records) == (5, 124, 120)
    await again.close_files()
    restarted = await logs.restart(log)
    assert restarted.recovery is not None and restarted.recovery.clean
    wal2, recovery = await opened(restarted, clock)
    assert recovery.clean
    assert (recovery.first_offset, recovery.last_offset, recovery.records) == (5, 124, 120)
    async with wal2:
        assert wal2.next_offset == 125
        assert await fill(wal2, 125, 3) == [125, 126, 127]
        assert await read_all(wal2, 5) == list(range(5, 128))


async def test_open_refuses_an_offset_that_does_not_continue_and_discard_is_durable(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock)
    async with wal:
        await fill(wal, 0, 10)
    log = await logs.restart(log)
    wal2 = WriteAheadLog(log, TOPIC, clock=clock)
    await wal2.recover()
    with pytest.raises(WalError, match="discard"):
        await wal2.open(50)
    assert await wal2.discard() >= 1
    await wal2.open(50)
    assert wal2.first_offset == 50
    async with wal2:
        assert await fill(wal2, 50, 2) == [50, 51]
    # The reset frame is in the log before the new records: the stale ones stay gone.
    _, recovery = await opened(await logs.restart(log), clock)
    assert recovery.clean
    assert (recovery.first_offset, recovery.last_offset, recovery.records) == (50, 51, 2)


async def test_torn_tail_is_truncated_counted_logged_and_appends_continue(
    tmp_path: Path, clock: FakeClock, logs: Logs, caplog: pytest.LogCaptureFixture
) -> None:
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock)
    async with wal:
        await fill(wal, 0, 50)
    await log.close()
    last = segment_files(tmp_path / "log")[-1]
    os.truncate(last, last.stat().st_size - 5)  # the last frame lost its final bytes
    stats = StorageStats()
    with caplog.at_level(logging.WARNING):
        log = await logs.restart(log, stats, close=False)
    assert log.recovery is not None
    assert log.recovery.truncated_bytes == record_frame_size(49) - 5
    assert "torn" in (log.recovery.corruption or "")
    assert "truncated" in caplog.text
    assert stats.wal_truncated_tails == 1 and stats.wal_truncated_bytes > 0
    wal2, recovery = await opened(log, clock, stats=stats)
    assert recovery.last_offset == 48
    async with wal2:
        assert await wal2.append(payload(49)) == 49
        assert await read_all(wal2, 0) == list(range(50))


async def test_garbage_after_the_last_frame_is_truncated(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock)
    async with wal:
        await fill(wal, 0, 10)
    await log.close()
    last = segment_files(tmp_path / "log")[-1]
    good = last.stat().st_size
    with open(last, "ab") as f:
        f.write(b"\x00\x00\x00\x40garbage")
    log = await logs.restart(log, close=False)
    assert log.recovery is not None and log.recovery.truncated_bytes == 11
    assert last.stat().st_size == good
    wal2, recovery = await opened(log, clock)
    assert recovery.last_offset == 9
    async with wal2:
        assert await wal2.append(b"x") == 10


async def test_corrupt_crc_in_the_tail_truncates_from_that_frame(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock)
    async with wal:
        await fill(wal, 0, 10)
    await log.close()
    (last,) = segment_files(tmp_path / "log")
    frame = record_frame_size(0)
    declaration = len(encode_frame(FrameKind.DECLARE, 1, TOPIC.encode()))
    data = bytearray(last.read_bytes())
    data[declaration + 7 * frame + 20] ^= 0xFF  # inside record 7's frame
    last.write_bytes(bytes(data))
    log = await logs.restart(log, close=False)
    assert log.recovery is not None
    assert "CRC" in (log.recovery.corruption or "")
    assert log.recovery.truncated_bytes == 3 * frame
    wal2, recovery = await opened(log, clock)
    assert recovery.last_offset == 6
    async with wal2:
        assert await wal2.append(payload(7)) == 7
        assert await read_all(wal2, 0) == list(range(8))


async def test_corruption_in_an_early_segment_drops_the_later_ones(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock)
    async with wal:
        for start in range(0, 150, 10):  # separate batches so segments roll
            await fill(wal, start, 10)
    await log.close()
    files = segment_files(tmp_path / "log")
    assert len(files) >= 3
    first = files[0]
    records = [c for kind, c in frames_of(first) if kind is FrameKind.RECORD]
    last_in_first = len(records) - 1  # offsets start at 0
    data = bytearray(first.read_bytes())
    data[-3] ^= 0x01  # the last record of the first segment
    first.write_bytes(bytes(data))
    stats = StorageStats()
    log = await logs.restart(log, stats, close=False)
    assert log.recovery is not None and log.recovery.dropped_segments == len(files) - 1
    assert stats.wal_dropped_segments == len(files) - 1
    assert segment_files(tmp_path / "log") == [first]
    wal2, recovery = await opened(log, clock)
    assert recovery.last_offset == last_in_first - 1
    async with wal2:
        assert await wal2.append(b"again") == last_in_first


async def test_a_lost_segment_keeps_the_topic_after_it_and_never_reuses_an_offset(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock)
    async with wal:
        for start in range(0, 150, 10):
            await fill(wal, start, 10)
    await log.close()
    files = segment_files(tmp_path / "log")
    files[1].unlink()  # lost (not torn): the segments after it are whole
    log = await logs.restart(log, close=False)
    assert log.recovery is not None and log.recovery.inconsistent == 1
    wal2, recovery = await opened(log, clock)
    # What follows the hole is kept; what preceded it is dropped (the hole is not
    # declared), so the topic continues after its last record, never reusing one.
    assert recovery.last_offset == 149
    assert recovery.first_offset is not None and recovery.first_offset > 10
    async with wal2:
        assert await wal2.append(b"next") == 150


async def test_live_reader_is_woken_by_a_commit(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    wal, _ = await opened(await logs.start(tmp_path / "log"), clock)
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
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock)
    with pytest.raises(WalClosedError):
        await wal.append(b"not started")
    async with wal:
        await wal.append(b"ok")
    with pytest.raises(WalClosedError):
        await wal.append(b"closed")
    other, _ = await opened(log, clock, topic="/ns/other")
    async with other:
        await log.close()  # the broker's log closed under an open topic
        with pytest.raises(WalClosedError):
            await other.append(b"log closed")


async def test_a_cancelled_appender_does_not_fail_the_batch(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    wal, _ = await opened(await logs.start(tmp_path / "log"), clock)
    async with wal:
        cancelled = asyncio.ensure_future(wal.append(b"a"))
        kept = asyncio.ensure_future(wal.append(b"b"))
        await asyncio.sleep(0)
        cancelled.cancel()
        assert await kept == 1
        # The cancelled append was already in the batch: it is durable all the same.
        assert [r.payload for r in await wal.read(0)] == [b"a", b"b"]


async def test_a_write_failure_fails_the_appends_and_stops_the_log(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock)

    async def broken_disk(data: bytes, sync: bool) -> None:
        raise OSError(5, "Input/output error")

    async with wal:
        await wal.append(b"ok")
        log._write = broken_disk  # type: ignore[method-assign]
        with pytest.raises(WalError, match="Input/output") as failed:
            await wal.append(b"lost")
        assert not isinstance(failed.value, WalClosedError)  # a failure, not a close
        with pytest.raises(WalError, match="failed earlier"):
            await wal.append(b"refused")
        assert wal.committed_offset == 0


@pytest.mark.parametrize("policy", list(FsyncPolicy))
async def test_fsync_policies(
    tmp_path: Path, clock: FakeClock, logs: Logs, policy: FsyncPolicy
) -> None:
    stats = StorageStats()
    cfg = replace(
        logs.config, fsync_policy=policy, segment_bytes=1 << 20, fsync_interval_seconds=1.0
    )
    wal, _ = await opened(await logs.start(tmp_path / "log", cfg, stats), clock)
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
        FsyncPolicy.INTERVAL: (0, 1, 1),  # the broker's ticker synced the log
        FsyncPolicy.NEVER: (0, 0, 1),  # only the topic's close syncs
    }[policy]
    assert (after_appends, after_tick, stats.wal_fsyncs) == expected


@pytest.mark.parametrize(("call", "fsyncs"), [("flush", 1), ("settle", 0)])
async def test_flush_and_settle_wait_for_pending_writes_only_flush_syncs(
    tmp_path: Path, clock: FakeClock, logs: Logs, call: str, fsyncs: int
) -> None:
    stats = StorageStats()
    cfg = replace(logs.config, fsync_policy=FsyncPolicy.NEVER)
    wal, _ = await opened(await logs.start(tmp_path / "log", cfg, stats), clock)
    async with wal:
        pending = [asyncio.ensure_future(wal.append(payload(i))) for i in range(3)]
        await asyncio.sleep(0)  # the appends enqueue; none is committed yet
        assert wal.committed_offset == -1
        assert await getattr(wal, call)() == 2
        assert all(p.done() for p in pending)
        assert stats.wal_fsyncs == fsyncs


def segment_starts(log: BrokerLog, topic: str) -> list[int]:
    """The topic's first offset in each segment holding its records."""
    part = log.part(topic)
    starts: list[int] = []
    previous = None
    for first, segment in zip(part.firsts, part.segments, strict=True):
        if segment is not previous:
            starts.append(first)
            previous = segment
    return starts


async def test_retention_deletes_only_uploaded_and_old_segments(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock)
    async with wal:
        for start in range(0, 200, 10):
            await fill(wal, start, 10)
        starts = segment_starts(log, TOPIC)
        assert len(starts) >= 4
        # Old enough but not uploaded: kept.
        await clock.advance(120)
        assert await wal.apply_retention() == 0
        # Uploaded up to the middle of the third segment: the first two can go once old.
        third = starts[2]
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


async def test_a_segment_is_kept_until_every_topic_in_it_uploaded(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    log = await logs.start(tmp_path / "log")
    a, _ = await opened(log, clock, topic="/ns/a")
    b, _ = await opened(log, clock, topic="/ns/b")
    async with a, b:
        for start in range(0, 60, 10):  # interleaved: both topics in every segment
            await asyncio.gather(fill(a, start, 10), fill(b, start, 10))
        segments = log.segment_count
        assert segments >= 3
        await clock.advance(log.config.retention_seconds + 1)
        a.mark_uploaded(59)
        assert await a.apply_retention() == 0  # b still needs them all
        assert a.first_offset == 0 and await read_all(b, 0) == list(range(60))
        b.mark_uploaded(29)  # b's first half: the segments holding only offsets <= 29 go
        deleted = await b.apply_retention()
        assert 1 <= deleted < segments
        assert 0 < b.first_offset <= 30 and a.first_offset == b.first_offset
        assert await read_all(b, b.first_offset) == list(range(b.first_offset, 60))
        b.mark_uploaded(59)
        assert await b.apply_retention() == segments - deleted - 1  # all but the active one
        assert log.segment_count == 1


@pytest.mark.parametrize("ack", list(AckMode))
async def test_topics_not_served_here_hold_their_segments_only_with_local_acks(
    tmp_path: Path, clock: FakeClock, logs: Logs, ack: AckMode
) -> None:
    log = await logs.start(tmp_path / "log", replace(logs.config, ack=ack))
    wal, _ = await opened(log, clock)
    async with wal:
        for start in range(0, 60, 10):
            await fill(wal, start, 10)  # never marked uploaded
    # A restart after which the topic is served elsewhere: never reopened here.
    log = await logs.restart(log)
    segments = log.segment_count
    assert segments >= 2
    await clock.advance(log.config.retention_seconds + 1)
    if ack is AckMode.DURABLE:
        # What it acknowledged is in object storage: its local copy holds nothing back.
        assert await log.apply_retention() == segments
        _, recovery = await opened(log, clock)  # and if it comes back: as after a crash
        assert (recovery.first_offset, recovery.last_offset) == (None, None)
    else:
        # Possibly the only copy of acknowledged records: kept until uploaded.
        assert await log.apply_retention() == 0
        again, recovery = await opened(log, clock)
        assert recovery.last_offset == 59
        again.mark_uploaded(59)
        assert await again.apply_retention() == segments


async def test_a_destroyed_topic_reopened_does_not_see_its_old_records(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock)
    other, _ = await opened(log, clock, topic="/ns/other")
    async with other:
        async with wal:
            await fill(wal, 0, 20)
            await fill(other, 0, 5)
        await wal.destroy()  # sealed: everything is in object storage
        # Reopened on the same broker (moved back): nothing local, offsets continue.
        again, recovery = await opened(log, clock, next_offset=20)
        assert (recovery.first_offset, recovery.last_offset, recovery.records) == (None, None, 0)
        async with again:
            assert await fill(again, 20, 3) == [20, 21, 22]
            with pytest.raises(OffsetUnavailableError):
                await again.read(0)
        await fill(other, 5, 1)
    # After a restart too: the reset frame hides the records before it, not after.
    restarted = await logs.restart(log)
    reopened, recovery = await opened(restarted, clock)
    assert (recovery.first_offset, recovery.last_offset, recovery.records) == (20, 22, 3)
    other, recovery = await opened(restarted, clock, topic="/ns/other")
    assert (recovery.first_offset, recovery.last_offset) == (0, 5)
    # And a destroyed topic's records (0..19, never uploaded) no longer keep segments.
    await clock.advance(restarted.config.retention_seconds + 1)
    reopened.mark_uploaded(22)
    other.mark_uploaded(5)
    segments = restarted.segment_count
    assert segments >= 1 and await restarted.apply_retention() == segments
    assert list((tmp_path / "log").glob("*.log")) == []


async def test_open_past_a_gap_keeps_the_records_and_recovery_trusts_the_gap_frame(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    directory = tmp_path / "log"
    log = await logs.start(directory)
    wal, _ = await opened(log, clock)
    async with wal:
        await fill(wal, 0, 10)
    log = await logs.restart(log)
    wal2 = WriteAheadLog(log, TOPIC, clock=clock)
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
    # The gap frame precedes the first record after the gap in the log.
    kinds = [k for k, _ in frames_of(segment_files(directory)[-1])]
    assert kinds.index(FrameKind.GAP) < kinds.index(FrameKind.RECORD)
    log = await logs.restart(log)
    wal3, recovery = await opened(log, clock)
    assert recovery.clean and recovery.gaps == ((10, 49),)
    assert (recovery.first_offset, recovery.last_offset, recovery.records) == (0, 54, 15)
    async with wal3:
        assert await fill(wal3, 55, 2) == [55, 56]
        assert await read_all(wal3, 3) == [*range(3, 10), *range(50, 57)]
        # Once the segment before the gap is uploaded and old, it goes (the gap with it).
        wal3.mark_uploaded(49)
        await clock.advance(log.config.retention_seconds + 1)
        assert await wal3.apply_retention() >= 1
        assert wal3.first_offset == 50 and log.part(TOPIC).gaps == []


async def test_a_gap_started_before_the_first_append_and_a_crash_before_it(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    """`start_segment` writes the gap frame (and readies the segment) at open; the first
    append then only writes its records. A crash before any record: the gap bridges
    nothing, and the next open declares it again."""
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock)
    async with wal:
        await fill(wal, 0, 10)
    log = await logs.restart(log)
    wal2, _ = await opened(log, clock, 50, allow_gap=True)
    await wal2.start_segment()
    await wal2.start_segment()  # already declared: nothing more
    assert wal2.segment_count == 1 and await wal2.read(20) == []
    await wal2.close_files()  # a crash before any append
    log = await logs.restart(log)
    wal3, recovery = await opened(log, clock)
    assert recovery.clean and recovery.last_offset == 9 and recovery.gaps == ()
    await wal3.close_files()
    wal4, _ = await opened(log, clock, 50, allow_gap=True)
    await wal4.start_segment()
    async with wal4:
        assert await fill(wal4, 50, 3) == [50, 51, 52]
    _, recovery = await opened(await logs.restart(log), clock)
    assert recovery.clean and recovery.gaps == ((10, 49),) and recovery.last_offset == 52


async def test_a_corrupt_frame_of_one_topic_does_not_crash_the_recovery(
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    log = await logs.start(tmp_path / "log")
    wal, _ = await opened(log, clock)
    async with wal:
        await fill(wal, 0, 3)
    await log.close()
    (path,) = segment_files(tmp_path / "log")
    with open(path, "ab") as f:  # CRC-valid, but of a topic id never declared
        f.write(encode_frame(FrameKind.RECORD, 999, encode_record(Record(3, 0.0, b"x"))))
    log = await logs.restart(log, close=False)
    assert log.recovery is not None and "declaration" in (log.recovery.corruption or "")
    _, recovery = await opened(log, clock)
    assert recovery.last_offset == 2


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
    tmp_path: Path, clock: FakeClock, logs: Logs
) -> None:
    stats = StorageStats()
    wal, _ = await opened(await logs.start(tmp_path / "log", stats=stats), clock)
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
