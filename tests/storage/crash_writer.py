"""A broker-log writer to be killed with SIGKILL by test_wal_crash.py.

Usage: python crash_writer.py DIRECTORY FSYNC_POLICY TOPICS

It recovers the broker log in DIRECTORY, opens TOPICS topics on it (``/crash/t{i}``),
then appends forever from several concurrent producers per topic (single appends and
batches), all topics' appends interleaved in the one log, and prints
``ack TOPIC OFFSET PAYLOAD`` for every append that returned, i.e. every acknowledged
offset, flushing stdout each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from ballast.clock import SystemClock
from ballast.storage.codec import Message
from ballast.storage.config import FsyncPolicy, StorageConfig
from ballast.storage.log import BrokerLog
from ballast.storage.wal import WriteAheadLog


async def producer(wal: WriteAheadLog, name: int) -> None:
    seq = 0
    while True:
        if seq % 3 == 0:
            payloads = [f"p{name}-{seq + i}".encode() for i in range(5)]
            offsets = await wal.append_batch([Message(p) for p in payloads])
            seq += 5
            lines = "".join(
                f"ack {wal.topic} {o} {p.decode()}\n"
                for o, p in zip(offsets, payloads, strict=True)
            )
        else:
            data = f"p{name}-{seq}".encode() * (1 + seq % 7)
            offset = await wal.append(data)
            seq += 1
            lines = f"ack {wal.topic} {offset} {data.decode()}\n"
        sys.stdout.write(lines)
        sys.stdout.flush()


async def main(directory: str, policy: str, topics: int) -> None:
    config = StorageConfig(fsync_policy=FsyncPolicy(policy), segment_bytes=16 * 1024)
    clock = SystemClock()
    log = BrokerLog(directory, clock=clock, config=config)
    async with log, contextlib.AsyncExitStack() as stack:
        wals: list[WriteAheadLog] = []
        for i in range(topics):
            wal = WriteAheadLog(log, f"/crash/t{i}", clock=clock, config=config)
            recovery = await wal.recover()
            await wal.open(0 if recovery.last_offset is None else recovery.last_offset + 1)
            wals.append(await stack.enter_async_context(wal))
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        await asyncio.gather(*(producer(wal, i) for wal in wals for i in range(4)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
