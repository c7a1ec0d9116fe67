"""SIGKILL a WAL writer mid-batch: every acknowledged offset survives, offsets stay contiguous."""

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

WRITER = Path(__file__).with_name("crash_writer.py")


def run_and_kill(directory: Path, policy: FsyncPolicy, acks_before_kill: int) -> dict[int, bytes]:
    """Start the writer, SIGKILL it after `acks_before_kill` acks; return what it acked."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(directory), policy.value],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    acked: dict[int, bytes] = {}
    deadline = time.monotonic() + 60
    try:
        for line in proc.stdout:
            if line.startswith(b"ack "):
                _, offset, data = line.split(b" ", 2)
                acked[int(offset)] = data.rstrip(b"\n")
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
            _, offset, data = line.split(b" ", 2)
            acked[int(offset)] = data
    assert len(acked) >= acks_before_kill, err.decode()
    return acked


async def recovered(directory: Path) -> dict[int, bytes]:
    wal = WriteAheadLog(directory, clock=FakeClock(), config=StorageConfig())
    recovery = await wal.recover()
    assert recovery.last_offset is not None
    await wal.open(recovery.last_offset + 1)
    out: dict[int, bytes] = {}
    offset = 0
    while True:
        records = await wal.read(offset, 4096)
        if not records:
            break
        for record in records:
            assert record.offset == offset, "offsets must be contiguous"
            out[record.offset] = record.payload
            offset += 1
    assert offset == recovery.last_offset + 1
    return out


@pytest.mark.parametrize("policy", [FsyncPolicy.BATCH, FsyncPolicy.NEVER])
async def test_sigkill_mid_batch_loses_no_acknowledged_offset(
    tmp_path: Path, policy: FsyncPolicy
) -> None:
    directory = tmp_path / "wal"
    acked: dict[int, bytes] = {}
    for round_ in range(2):  # the second writer recovers the first one's log, then dies too
        acked.update(run_and_kill(directory, policy, acks_before_kill=400 * (round_ + 1)))
        on_disk = await recovered(directory)
        assert sorted(on_disk) == list(range(len(on_disk)))
        missing = [o for o in acked if o not in on_disk]
        assert not missing, f"acknowledged offsets lost: {missing[:10]}"
        wrong = [o for o, data in acked.items() if on_disk[o] != data]
        assert not wrong, f"acknowledged offsets with other content: {wrong[:10]}"
