"""Duplicates after moves when consumers ack out of order (issue 20, item 3).

Two brokers in this process on a fresh etcd (`tests.server.helpers.DataCluster`), one
reliable topic, one producer at `--rate` msg/s and two Shared consumers of the real
`danube-client` connected directly (no gateway). Each consumer acks out of order: it
holds back the ack of every `--hold-every`-th message it receives for `--hold` seconds
and acks the rest at once. The topic moves `--moves` times (admin unload, every
`--interval` s). Then the producer stops, everything is drained, and the run counts:

- ``duplicates``: deliveries of an offset the consumers had already received
  (``duplicates_per_1000`` per message sent);
- ``duplicates_of_acked``: deliveries, as the consumer takes them from the client's
  queue, of an offset whose ack it had already sent (what persisting the acks above the
  cursor removes; a few remain where the ack was held past the move and the redelivery
  was already queued in the client when the ack went out);
- ``lost``: sent and acknowledged to the producer, never delivered.

Prints one JSON object; the default run takes about 40 s.

    .venv/bin/python benchmarks/bench_acks_moves.py [--moves 10] [--rate 100] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ballast.cluster import AdminClient
from ballast.metadata.etcd import EtcdStore
from benchmarks.cli import emit, parse_args
from tests.etcd_fixtures import EtcdServer
from tests.server.helpers import (
    DataCluster,
    DispatchStrategy,
    SubType,
    data_config,
    new_client,
    wipe,
)

TOPIC = "/default/acks-moves"


class Consumer:
    """A Shared consumer holding back every n-th ack for a while (out-of-order acks)."""

    def __init__(self, consumer: Any, hold_every: int, hold: float) -> None:
        self.consumer = consumer
        self.hold_every = hold_every
        self.hold = hold
        self.received = 0
        self.again_after_ack = 0  # deliveries of an offset whose ack was already sent
        self.held: set[asyncio.Task[None]] = set()

    async def run(self, queue: asyncio.Queue[Any], seen: list[int], acked: set[int]) -> None:
        while True:
            message = await queue.get()
            offset = message.msg_id.topic_offset
            self.again_after_ack += offset in acked
            seen.append(offset)
            self.received += 1
            if self.received % self.hold_every == 0:
                task = asyncio.create_task(self._ack_later(message, acked))
                self.held.add(task)
                task.add_done_callback(self.held.discard)
            else:
                await self._ack(message, acked)

    async def _ack_later(self, message: Any, acked: set[int]) -> None:
        await asyncio.sleep(self.hold)
        await self._ack(message, acked)

    async def _ack(self, message: Any, acked: set[int]) -> None:
        try:
            await self.consumer.ack(message)
            acked.add(message.msg_id.topic_offset)
        except Exception:  # an ack lost in a move: the message comes again
            logging.getLogger(__name__).debug("ack failed", exc_info=True)


async def run(store: EtcdStore, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    await wipe(store)
    async with DataCluster(store, data_config(work / "data")) as cluster:
        await cluster.start_broker("b1")
        await cluster.start_broker("b2")
        client = await new_client(cluster.brokers["b1"].url)
        producer = (
            client.new_producer()
            .with_topic(TOPIC)
            .with_name("p1")
            .with_dispatch_strategy(DispatchStrategy.RELIABLE)
            .build()
        )
        await producer.create()
        seen: list[int] = []
        acked: set[int] = set()
        consumers, tasks = [], []
        for name in ("c1", "c2"):
            consumer = (
                client.new_consumer()
                .with_topic(TOPIC)
                .with_consumer_name(name)
                .with_subscription("s1")
                .with_subscription_type(SubType.SHARED)
                .build()
            )
            await consumer.subscribe()
            worker = Consumer(consumer, args.hold_every, args.hold)
            consumers.append(worker)
            tasks.append(asyncio.create_task(worker.run(await consumer.receive(), seen, acked)))
        sent = 0  # acknowledged sends: offsets 0..sent-1 of the fresh topic

        async def produce() -> None:
            nonlocal sent
            while True:
                await producer.send(f"m{sent}".encode())
                sent += 1
                await asyncio.sleep(1 / args.rate)

        producing = asyncio.create_task(produce())
        admin = AdminClient(store)
        for _ in range(args.moves):
            await asyncio.sleep(args.interval)
            await admin.unload_topic(TOPIC)
        await asyncio.sleep(args.interval)
        producing.cancel()
        await asyncio.gather(producing, return_exceptions=True)
        deadline = time.monotonic() + 30
        while (set(range(sent)) - acked) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(args.hold + 1)  # late redeliveries
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        duplicates = len(seen) - len(set(seen))
        again_after_ack = sum(c.again_after_ack for c in consumers)
        lost = len(set(range(sent)) - set(seen))
        for c in consumers:
            await c.consumer.close()
        await producer.close()
        return {
            "messages": sent,
            "moves": args.moves,
            "duplicates": duplicates,
            "duplicates_per_1000": round(1000 * duplicates / max(sent, 1), 1),
            "duplicates_of_acked": again_after_ack,
            "lost": lost,
        }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("danube").setLevel(logging.CRITICAL)
    logging.getLogger("ballast").setLevel(logging.CRITICAL)
    result: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_1m": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp, EtcdServer() as server:
        async with EtcdStore(server.client_url) as store:
            result.update(await run(store, Path(tmp), args))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--moves", type=int, default=10)
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between moves")
    parser.add_argument("--rate", type=float, default=100.0, help="msg/s")
    parser.add_argument("--hold-every", type=int, default=10, help="hold every n-th ack")
    parser.add_argument("--hold", type=float, default=2.0, help="seconds an ack is held")
    args = parse_args(parser, quick={"moves": 1, "interval": 1.0, "rate": 50.0, "hold": 0.5})
    emit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
