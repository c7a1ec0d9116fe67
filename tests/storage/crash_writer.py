"""A WAL writer to be killed with SIGKILL by test_wal_crash.py.

Usage: python crash_writer.py DIRECTORY FSYNC_POLICY

It recovers the WAL in DIRECTORY, then appends forever from several concurrent producers
(single appends and batches) and prints ``ack OFFSET PAYLOAD`` for every append that
returned, i.e. every acknowledged offset, flushing stdout each time.
"""

from __future__ import annotations

import asyncio
import sys

from ballast.clock import SystemClock
from ballast.storage.codec import Message
from ballast.storage.config import FsyncPolicy, StorageConfig
from ballast.storage.wal import WriteAheadLog


async def producer(wal: WriteAheadLog, name: int) -> None:
    seq = 0
    while True:
        if seq % 3 == 0:
            payloads = [f"p{name}-{seq + i}".encode() for i in range(5)]
            offsets = await wal.append_batch([Message(p) for p in payloads])
            seq += 5
            lines = "".join(
                f"ack {o} {p.decode()}\n" for o, p in zip(offsets, payloads, strict=True)
            )
        else:
            data = f"p{name}-{seq}".encode() * (1 + seq % 7)
            offset = await wal.append(data)
            seq += 1
            lines = f"ack {offset} {data.decode()}\n"
        sys.stdout.write(lines)
        sys.stdout.flush()


async def main(directory: str, policy: str) -> None:
    config = StorageConfig(fsync_policy=FsyncPolicy(policy), segment_bytes=16 * 1024)
    wal = WriteAheadLog(directory, clock=SystemClock(), config=config)
    recovery = await wal.recover()
    await wal.open(0 if recovery.last_offset is None else recovery.last_offset + 1)
    async with wal:
        sys.stdout.write(f"ready {wal.next_offset}\n")
        sys.stdout.flush()
        await asyncio.gather(*(producer(wal, i) for i in range(4)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
