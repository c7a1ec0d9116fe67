"""Failover benchmark: clients of the real `danube-client` through a gateway, a broker killed.

- failover: `--topics` live reliable topics (one producer and one Exclusive consumer each,
  `--rate` msg/s per topic) all owned by one broker process, which is SIGKILLed; per
  topic, the time from the kill until its producer's sends succeed again and its consumer
  receives again (p50/p99/max), split into lease expiry (kill → registration gone),
  reassignment (→ the topic has a new owner) and client recovery (→ both ends flow);
  plus lost messages (acknowledged, never consumed; must be 0). Goal: every topic back
  within registration TTL + 5 s.
- gateway overhead: the same client producing to one non-reliable topic with
  `--producers` concurrent producers for `--duration` s, directly to the broker, through
  a gateway that batches sends on its link to the broker, and through one forwarding each
  send as a unary call (`gateway.batch_sends: false`): messages/s and send latency
  p50/p99. Goal (issue 20): ≤ 25 % fewer msg/s through the gateway.

Everything runs on this machine (etcd, broker and gateway processes, the clients in this
process); both parts share one etcd and one object store (a broker refuses an object store
that is not the cluster's). A child that exits before it starts fails the run with the
tail of its stderr. Prints one JSON document.

    .venv/bin/python benchmarks/bench_failover.py [--topics 100] [--ttl 5] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ballast.cluster import AdminClient
from ballast.cluster.traffic import LiveTraffic
from ballast.metadata import keys
from ballast.metadata.etcd import EtcdStore
from benchmarks.cli import emit, parse_args
from benchmarks.processes import Processes, started_or_tail
from tests.etcd_fixtures import EtcdServer
from tests.server.procs import write_config


def shared_storage(work: Path) -> dict[str, str]:
    """The `storage` settings every broker of a run shares: one object store (the cluster's),
    whatever its own data directory."""
    return {"object_store": str(work / "objects")}


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` (nearest rank); 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spread(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(pct(values, 0.5), 3),
        "p99": round(pct(values, 0.99), 3),
        "max": round(max(values, default=0.0), 3),
    }


async def failover(
    store: EtcdStore,
    etcd_url: str,
    work: Path,
    topics: int,
    rate: float,
    ttl: float,
    flowing: float = 3.0,
) -> dict[str, Any]:
    config = write_config(
        work / "failover.yaml",
        work / "data-failover",
        broker={"registration_ttl_seconds": ttl, "leader_ttl_seconds": ttl},
        load_manager={"load_report_interval_seconds": 1.0},
        gateway={"lookup_wait_seconds": ttl + 30},
        storage=shared_storage(work),
    )
    procs = Processes(etcd_url, config, store, work / "logs-failover")
    admin = AdminClient(store)
    names = [f"/default/fo-{i:03d}" for i in range(topics)]
    traffic: LiveTraffic | None = None
    try:
        await procs.start_broker("leader")  # stays up: the leader reassigns
        await procs.start_broker("victim")
        await procs.start_broker("heir")
        for name in names:
            await admin.create_topic(name, hint="victim", meta={"dispatch_strategy": "reliable"})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            view = await admin.view()
            if all(view.owner(t) == "victim" for t in names):
                break
            await asyncio.sleep(0.2)
        gateway = await procs.start_gateway()
        traffic = LiveTraffic(gateway, names, rate=rate)
        await traffic.start()
        await asyncio.sleep(flowing)
        live = traffic
        assert all(t.delivered for t in live.topics.values()), "traffic did not start"
        killed = time.monotonic()
        await procs.kill("victim")
        expired: float | None = None
        owned: dict[str, float] = {}
        producer_back: dict[str, float] = {}
        consumer_back: dict[str, float] = {}
        limit = killed + ttl + 60
        while time.monotonic() < limit and (
            len(producer_back) < topics or len(consumer_back) < topics or len(owned) < topics
        ):
            now = time.monotonic()
            if expired is None and await store.get(keys.register("victim")) is None:
                expired = now
            if len(owned) < topics:
                view = await admin.view()
                for t in names:
                    if t not in owned and view.owner(t) not in (None, "victim"):
                        owned[t] = now
            for t, state in live.topics.items():
                if t not in producer_back and any(w > killed for w in state.acked.values()):
                    producer_back[t] = min(w for w in state.acked.values() if w > killed)
                if t not in consumer_back and (state.last_delivery or 0) > killed:
                    consumer_back[t] = state.last_delivery or now
            await asyncio.sleep(0.1)
        recovered = {
            t: max(producer_back[t], consumer_back[t]) - killed
            for t in names
            if t in producer_back and t in consumer_back
        }
        expiry = (expired - killed) if expired is not None else None
        reassign = [owned[t] - (expired or killed) for t in owned]
        client = [
            max(producer_back[t], consumer_back[t]) - owned[t]
            for t in names
            if t in owned and t in producer_back and t in consumer_back
        ]
        await traffic.stop_producing(settle=60)
        verdict = await traffic.verdict(store)
        goal = ttl + 5.0
        return {
            "topics": topics,
            "rate_per_topic": rate,
            "registration_ttl_seconds": ttl,
            "recovered_topics": len(recovered),
            "kill_to_recovered_seconds": spread(list(recovered.values())),
            "kill_to_producer_back_seconds": spread([v - killed for v in producer_back.values()]),
            "kill_to_consumer_back_seconds": spread([v - killed for v in consumer_back.values()]),
            "lease_expiry_seconds": round(expiry, 3) if expiry is not None else None,
            "reassignment_seconds": spread(reassign),
            "client_recovery_seconds": spread(client),
            "goal_seconds": goal,
            "goal_met": len(recovered) == topics and max(recovered.values(), default=1e9) <= goal,
            "traffic": verdict.to_dict(),
        }
    finally:
        if traffic is not None:
            await traffic.close()
        await procs.close()


async def throughput(
    url: str, topic: str, producers: int, duration: float, pids: dict[str, int] | None = None
) -> dict[str, Any]:
    """Concurrent producers (sequential sends each) for `duration` s: msg/s, latency and
    the CPU time each process in `pids` spent per message (µs)."""
    from danube import DanubeClientBuilder

    client = await DanubeClientBuilder().service_url(f"http://{url}").build()
    made = [
        client.new_producer().with_topic(topic).with_name(f"bench-{i}").build()
        for i in range(producers)
    ]
    for producer in made:
        await producer.create()
    payload = b"x" * 1024
    latencies: list[float] = []
    stop = time.monotonic() + duration

    async def run(producer: Any) -> None:
        while time.monotonic() < stop:
            began = time.monotonic()
            await producer.send(payload)
            latencies.append(time.monotonic() - began)

    watched = {name: psutil.Process(pid) for name, pid in (pids or {}).items()}
    cpu_before = {name: cpu_seconds(proc) for name, proc in watched.items()}
    began = time.monotonic()
    await asyncio.gather(*(run(p) for p in made))
    elapsed = time.monotonic() - began
    spent = {name: cpu_seconds(proc) - cpu_before[name] for name, proc in watched.items()}
    for producer in made:
        await producer.close()
    sent = max(1, len(latencies))
    return {
        "msg_per_s": round(len(latencies) / elapsed, 1),
        "latency_ms_p50": round(pct(latencies, 0.5) * 1000, 2),
        "latency_ms_p99": round(pct(latencies, 0.99) * 1000, 2),
        "cpu_us_per_msg": {name: round(cpu / sent * 1e6) for name, cpu in spent.items()},
    }


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU seconds `proc` has used."""
    times = proc.cpu_times()
    return float(times.user + times.system)


async def overhead(
    store: EtcdStore, etcd_url: str, work: Path, producers: int, duration: float, rounds: int = 2
) -> dict[str, Any]:
    """msg/s of `producers` producers directly, through a gateway that batches sends on its
    link to the broker and through one that forwards each send as a unary call; the three
    interleaved `rounds` times (the machine's drift hits all alike), medians compared."""
    config = write_config(
        work / "overhead.yaml", work / "data-overhead", storage=shared_storage(work)
    )
    unary = write_config(
        work / "overhead-unary.yaml",
        work / "data-overhead",
        gateway={"batch_sends": False},
        storage=shared_storage(work),
    )
    procs = Processes(etcd_url, config, store, work / "logs-overhead")
    relays: list[_Relay] = []
    try:
        urls = {
            "direct": await procs.start_broker("solo"),
            "gateway": await procs.start_gateway(),
            "gateway_unary": await procs.start_gateway(unary),
        }
        broker = procs.brokers["solo"].pid
        pids: dict[str, dict[str, int]] = {"direct": {"client": os.getpid(), "broker": broker}}
        for mode, gateway in zip(("gateway", "gateway_unary"), procs.gateways, strict=True):
            pids[mode] = {"client": os.getpid(), "gateway": gateway.pid, "broker": broker}
        for relay_mode in ("link", "unary"):
            relay = await _start_relay(urls["direct"], relay_mode, procs.logs)
            relays.append(relay)
            urls[f"relay_{relay_mode}"] = relay.address
            pids[f"relay_{relay_mode}"] = {
                "client": os.getpid(), "gateway": relay.proc.pid, "broker": broker
            }  # fmt: skip
        topic = "/default/overhead"
        # Creates and places the topic; warm-up.
        await throughput(urls["gateway"], topic, 1, min(1.0, duration))
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in urls}
        for _ in range(rounds):
            for mode, url in urls.items():
                runs[mode].append(await throughput(url, topic, producers, duration, pids[mode]))
        median = {mode: _median_run(found) for mode, found in runs.items()}
        direct = median["direct"]["msg_per_s"]

        def loss(mode: str) -> float:
            return round(100 * (1 - median[mode]["msg_per_s"] / direct), 1) if direct else 0.0

        return {
            "producers": producers,
            "payload_bytes": 1024,
            "rounds": rounds,
            **median,
            "overhead_msg_per_s_percent": loss("gateway"),
            "overhead_unary_msg_per_s_percent": loss("gateway_unary"),
            "relay_link_overhead_percent": loss("relay_link"),
            "relay_unary_overhead_percent": loss("relay_unary"),
            "goal_met": loss("gateway") <= 25.0,
        }
    finally:
        for relay in relays:
            relay.proc.terminate()
            await relay.proc.wait()
        await procs.close()


@dataclass(frozen=True)
class _Relay:
    proc: asyncio.subprocess.Process
    address: str


async def _start_relay(broker: str, mode: str, logs: Path) -> _Relay:
    """`relay.py`: the cheapest forwarder (no sessions, no checks), for comparison."""
    log = logs / f"relay-{mode}.log"
    with log.open("ab") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).with_name("relay.py")), "--broker", broker,
            "--mode", mode, stdout=asyncio.subprocess.PIPE, stderr=stderr,
        )  # fmt: skip
    return _Relay(proc, await started_or_tail(proc, "RELAY-STARTED", f"relay ({mode})", log))


def _median_run(found: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(found, key=lambda run: run["msg_per_s"])
    return {**ordered[len(ordered) // 2], "msg_per_s_runs": [run["msg_per_s"] for run in found]}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("danube").setLevel(logging.ERROR)
    result: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_1m": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp, EtcdServer() as server:
        work = Path(tmp)
        async with EtcdStore(server.client_url) as store:
            if args.only in ("", "overhead"):
                result["gateway_overhead"] = await overhead(
                    store, server.client_url, work, args.producers, args.duration, args.rounds
                )
            for prefix in (keys.CLUSTER_PREFIX, keys.TOPICS_PREFIX, keys.STORAGE_PREFIX):
                await store.delete_prefix(prefix)
            if args.only in ("", "failover"):
                result["failover"] = await failover(
                    store, server.client_url, work, args.topics, args.rate, args.ttl, args.flowing
                )
    result["loadavg_1m_after"] = os.getloadavg()[0]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--rate", type=float, default=2.0, help="msg/s per topic")
    parser.add_argument("--ttl", type=float, default=5.0, help="registration TTL (s)")
    parser.add_argument(
        "--flowing", type=float, default=3.0, help="seconds of traffic before the kill"
    )
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2, help="overhead runs per mode")
    parser.add_argument("--only", choices=("", "overhead", "failover"), default="")
    args = parse_args(
        parser,
        quick={
            "topics": 4, "rate": 5.0, "ttl": 2.0, "flowing": 1.0, "producers": 2,
            "duration": 0.5, "rounds": 1,
        },
    )  # fmt: skip
    emit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
