"""SIGKILL a broker-log writer mid-batch: every acknowledged offset of every topic
survives, each topic recovers its own records, offsets stay contiguous."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ballast.clock import FakeClock
from ballast.storage import FsyncPolicy, StorageConfig, WriteAheadLog
from ballast.storage.log import BrokerLog

WRITER = Path(__file__).with_name("crash_writer.py")

Acked = dict[tuple[str, int], bytes]


def parse(line: bytes, acked: Acked) -> None:
    _, topic, offset, data = line.split(b" ", 3)
    acked[topic.decode(), int(offset)] = data.rstrip(b"\n")


def run_and_kill(directory: Path, policy: FsyncPolicy, topics: int, acks_before_kill: int) -> Acked:
    """Start the writer, SIGKILL it after `acks_before_kill` acks; return what it acked."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(directory), policy.value, str(topics)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    acked: Acked = {}
    deadline = time.monotonic() + 60
    try:
        for line in proc.stdout:
            if line.startswith(b"ack "):
                parse(line, acked)
                if len(acked) >= acks_before_kill:
                    break
            if time.monotonic() > deadline:
                break
        # Kill while the producers are still busy, i.e. in the middle of some batch.
        proc.send_signal(signal.SIGKILL)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, err.decode()
    for line in rest.splitlines():  # acks printed before the kill, still in the pipe
        if line.startswith(b"ack "):
            parse(line, acked)
    assert len(acked) >= acks_before_kill, err.decode()
    return acked


async def recovered(directory: Path, topics: int) -> Acked:
    clock = FakeClock()
    out: Acked = {}
    async with BrokerLog(directory, clock=clock, config=StorageConfig()) as log:
        for i in range(topics):
            topic = f"/crash/t{i}"
            wal = WriteAheadLog(log, topic, clock=clock)
            recovery = await wal.recover()
            assert recovery.last_offset is not None
            await wal.open(recovery.last_offset + 1)
            offset = 0
            while True:
                records = await wal.read(offset, 4096)
                if not records:
                    break
                for record in records:
                    assert record.offset == offset, f"{topic}: offsets must be contiguous"
                    out[topic, record.offset] = record.payload
                    offset += 1
            assert offset == recovery.last_offset + 1
            await wal.close_files()
    return out


@pytest.mark.parametrize(
    ("policy", "topics"),
    [(FsyncPolicy.BATCH, 1), (FsyncPolicy.NEVER, 1), (FsyncPolicy.BATCH, 8)],
)
async def test_sigkill_mid_batch_loses_no_acknowledged_offset(
    tmp_path: Path, policy: FsyncPolicy, topics: int
) -> None:
    directory = tmp_path / "log"
    acked: Acked = {}
    for round_ in range(2):  # the second writer recovers the first one's log, then dies too
        acked.update(run_and_kill(directory, policy, topics, 400 * (round_ + 1) * topics))
        on_disk = await recovered(directory, topics)
        missing = [key for key in acked if key not in on_disk]
        assert not missing, f"acknowledged offsets lost: {missing[:10]}"
        wrong = [key for key, data in acked.items() if on_disk[key] != data]
        assert not wrong, f"acknowledged offsets with other content: {wrong[:10]}"
        assert {topic for topic, _ in on_disk} == {f"/crash/t{i}" for i in range(topics)}
