"""Moves and failovers through a gateway: what the clients notice (issue 20).

Real `danube-client` producers and Exclusive consumers (`LiveTraffic`) on `--topics` live
reliable topics, connected through a gateway, while the cluster

- moves the topics `--moves` times, each naming its destination as the rebalancer's moves
  do (``unload --to``: the old owner's seal places the topic there), then unloads them
  `--unloads` times without one (the leader places each, one round through it more): per
  move, the longest pause the moved topic's producer and consumer saw;
- loses an owner `--kills` times (SIGKILL; registration TTL `--ttl` s; a fresh broker
  replaces it): per topic it owned, the time from its reassignment until its producer
  and consumer both flow again;

then checks nothing acknowledged was lost and counts duplicate deliveries. Last, the
gateway's cost: 8 producers (1 KiB, non-reliable) directly to the broker, through the
gateway and, for comparison, through `relay.py` (a `grpc.aio` forwarder that keeps no
sessions and checks nothing: what the gateway cost before it had its own HTTP/2
server), msg/s and each process's CPU time per message. Goals: move pauses p99 ≤ 0.1 s,
flowing ≤ 0.5 s after reassignment, ≤ 5 duplicates per 1 000, 0 lost, gateway overhead
≤ 25 %.

Everything runs on this machine (etcd, broker and gateway processes, the clients in this
process). Prints one JSON object; the default run takes about two minutes.

    .venv/bin/python benchmarks/bench_moves.py [--moves 20] [--kills 3] [--ttl 5] [--quick]

`--quick` (the test suite's run): 2 topics, one move, one unload, one kill (TTL 2 s), and
no gateway's cost (`--no-overhead`: its figures null). That part is `bench_failover`'s
`overhead`, which ``bench_failover.py --quick`` runs; here it would double the quick run.
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
from ballast.clock import SystemClock
from ballast.cluster import AdminClient
from ballast.cluster.traffic import LiveTraffic
from ballast.metadata.directory import Directory
from ballast.metadata.etcd import EtcdStore
from ballast.model import TopicName
from benchmarks.bench_failover import overhead, pct, spread
from benchmarks.cli import emit, parse_args
from benchmarks.processes import Processes
from tests.etcd_fixtures import EtcdServer
from tests.server.procs import write_config


async def _until(check: Any, timeout: float, what: str) -> None:
    # Every 0.1 s, not faster: each check reads etcd in the clients' process, and a move's
    # pause is measured there, in the very window it polls.
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def moves_and_kills(
    store: EtcdStore, etcd_url: str, work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    config = write_config(
        work / "moves.yaml",
        work / "data-moves",
        broker={"registration_ttl_seconds": args.ttl, "leader_ttl_seconds": args.ttl},
        gateway={"lookup_wait_seconds": args.ttl + 30},
    )
    procs = Processes(etcd_url, config, store, work / "logs-moves")
    admin = AdminClient(store)
    names = [f"/default/mv-{i}" for i in range(args.topics)]
    traffic: LiveTraffic | None = None
    try:
        await procs.start_broker("leader")  # started first: it leads
        for n in range(2):
            await procs.start_broker(f"w{n}")
        for i, name in enumerate(names):
            await admin.create_topic(name, hint=f"w{i % 2}", meta={"dispatch_strategy": "reliable"})
        gateway = await procs.start_gateway()
        traffic = LiveTraffic(gateway, names, rate=args.rate)
        await traffic.start()
        await asyncio.sleep(2.0)
        live = traffic
        assert all(t.delivered for t in live.topics.values()), "traffic did not start"

        directory = Directory(store, SystemClock())

        async def owner(topic: str) -> str | None:
            # The topic's ownership record, not the cluster view: listing and decoding the
            # whole cluster blocked this process (the clients') for up to 28 ms, right in
            # the window whose pause is measured here (the slowest moves of a run).
            found = await directory.owner(TopicName.parse(topic))
            return found.broker_id if found is not None else None

        brokers = ["leader", *(f"w{n}" for n in range(2))]

        async def destination(source: str | None) -> str:
            # As the rebalancer does, a move names its destination: here the other broker
            # owning the fewest of these topics (ties in order).
            owners = [await owner(t) for t in names]
            return min((b for b in brokers if b != source), key=owners.count)

        async def pauses(count: int, named: bool) -> tuple[list[float], list[float]]:
            producer: list[float] = []
            consumer: list[float] = []
            for move in range(count):
                topic = names[move % len(names)]
                state = live.topics[topic]
                source = await owner(topic)
                target = await destination(source) if named else None
                live.reset_pauses()
                await asyncio.sleep(0.3)
                await admin.unload_topic(topic, target)

                async def moved(topic: str = topic, source: str | None = source) -> bool:
                    return await owner(topic) not in (None, source)

                await _until(moved, 30, f"{topic} to move")
                await asyncio.sleep(1.0)  # flowing from the new owner
                producer.append(state.producer_pause)
                consumer.append(state.consumer_pause)
            return producer, consumer

        producer_pauses, consumer_pauses = await pauses(args.moves, named=True)
        # Unloads without a destination: the leader places each (one round through it).
        unload_producer, unload_consumer = await pauses(args.unloads, named=False)

        flowing: list[float] = []
        for kill in range(args.kills):
            view = await admin.view()
            # The owner of some topic, the leader only if it owns them all (the moves
            # spread them over every broker).
            owners = [view.owner(t) for t in names]
            victim = next((b for b in owners if b not in (None, "leader")), owners[0])
            assert victim is not None, "a topic without an owner"
            owned = [t for t in names if view.owner(t) == victim]
            await procs.start_broker(f"r{kill}")  # the heir-to-be (keeps two workers)
            killed = time.monotonic()
            await procs.kill(victim)
            reassigned: dict[str, float] = {}
            back: dict[str, float] = {}
            deadline = killed + args.ttl + 60
            while len(back) < len(owned) and time.monotonic() < deadline:
                now = time.monotonic()
                view = await admin.view()
                for t in owned:
                    if t not in reassigned and view.owner(t) not in (None, victim):
                        reassigned[t] = now
                    state = live.topics[t]
                    if t in reassigned and t not in back:
                        acked = [w for w in state.acked.values() if w > killed]
                        if acked and (state.last_delivery or 0) > killed:
                            back[t] = max(min(acked), state.last_delivery or now)
                await asyncio.sleep(0.02)
            flowing.extend(max(0.0, back[t] - reassigned[t]) for t in back)
            await asyncio.sleep(1.0)
        await traffic.stop_producing(settle=60)
        verdict = await traffic.verdict(store)
        produced = max(1, verdict.produced)
        return {
            "topics": args.topics,
            "rate_per_topic": args.rate,
            "moves": args.moves,
            "kills": args.kills,
            "registration_ttl_seconds": args.ttl,
            "move_producer_pause_s": spread(producer_pauses),
            "move_consumer_pause_s": spread(consumer_pauses),
            "failover_flowing_after_reassignment_s": spread(flowing),
            # Each move's pauses in the order of the moves (where the tail comes from).
            "move_pauses_s": [
                [round(p, 3), round(c, 3)]
                for p, c in zip(producer_pauses, consumer_pauses, strict=True)
            ],
            "move_producer_pause_p99_s": round(pct(producer_pauses, 0.99), 3),
            "move_consumer_pause_p99_s": round(pct(consumer_pauses, 0.99), 3),
            "unloads": args.unloads,
            "unload_pauses_s": [
                [round(p, 3), round(c, 3)]
                for p, c in zip(unload_producer, unload_consumer, strict=True)
            ],
            "unload_producer_pause_p99_s": round(pct(unload_producer, 0.99), 3),
            "unload_consumer_pause_p99_s": round(pct(unload_consumer, 0.99), 3),
            "failover_flowing_after_reassignment_p99_s": round(pct(flowing, 0.99), 3),
            "duplicates_per_1000": round(1000 * verdict.duplicates / produced, 2),
            "lost": verdict.lost,
            "traffic": verdict.to_dict(),
        }
    finally:
        if traffic is not None:
            await traffic.close()
        await procs.close()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("danube").setLevel(logging.ERROR)
    result: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_1m": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # Each part on its own etcd: a broker of the second must not meet the first's.
        moved: dict[str, Any] = {}
        if not args.only_overhead:
            with EtcdServer() as server:
                async with EtcdStore(server.client_url) as store:
                    moved = await moves_and_kills(store, server.client_url, work, args)
        cost: dict[str, Any] = {}
        if not args.no_overhead:
            with EtcdServer() as server:
                async with EtcdStore(server.client_url) as store:
                    cost = await overhead(
                        store, server.client_url, work, 8, args.duration, args.rounds
                    )
    result.update(
        {k: v for k, v in moved.items() if k.endswith(("_p99_s", "_1000")) or k == "lost"}
    )
    result["gateway_overhead_percent"] = cost.get("overhead_msg_per_s_percent")
    result["gateway_overhead_unary_percent"] = cost.get("overhead_unary_msg_per_s_percent")
    # For comparison: a grpc.aio forwarder that keeps no sessions (benchmarks/relay.py).
    result["relay_link_overhead_percent"] = cost.get("relay_link_overhead_percent")
    result["relay_unary_overhead_percent"] = cost.get("relay_unary_overhead_percent")
    result["details"] = {"moves_and_kills": moved, "gateway_overhead": cost}
    result["loadavg_1m_after"] = os.getloadavg()[0]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=4, help="live reliable topics")
    parser.add_argument("--rate", type=float, default=50.0, help="msg/s per topic")
    parser.add_argument(
        "--moves", type=int, default=20, help="moves naming their destination (unload --to)"
    )
    parser.add_argument(
        "--unloads", type=int, default=10, help="unloads the leader places (no destination)"
    )
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=5.0, help="registration TTL (s)")
    parser.add_argument("--duration", type=float, default=5.0, help="overhead run (s)")
    parser.add_argument("--rounds", type=int, default=2, help="overhead runs per mode")
    parser.add_argument(
        "--only-overhead", action="store_true", help="skip the moves and kills (about 30 s)"
    )
    parser.add_argument(
        "--no-overhead", action="store_true", help="skip the gateway's cost (its figures null)"
    )
    args = parse_args(
        parser,
        quick={
            "topics": 2, "rate": 20.0, "moves": 1, "unloads": 1, "kills": 1, "ttl": 2.0,
            "no_overhead": True,
        },
    )  # fmt: skip
    emit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
