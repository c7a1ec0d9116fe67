"""Many reliable topics on one broker: what an idle topic costs, how fast topics open, and
whether the commit stream's work grows with the number of topics.

One broker on etcd (a directory object store), the real `danube-client` in this process,
the broker under ``ulimit -n`` `--nofile` (1 024: the usual default). Reported:

- ``idle_before`` / ``idle_after``: the broker's CPU (% of one core) over `--idle-seconds`,
  RSS, open file descriptors, with no topic and with `--topics` reliable topics holding one
  100-byte message each; ``etcd_keys_per_topic``: keys the topics added, per topic.
- ``open``: the topics created and first-sent by `--clients` concurrent clients (one
  producer per topic, created, one send acknowledged, closed): wall time and each topic's
  create + first send p50/p99 in ms.
- ``reliable``: 32 producers on one topic and spread over 32 topics (each a sequential
  sender of 1 KiB messages), one producer alone; msg/s, p50, against the no-op ceiling of
  the same client in the same run; ``broker_cpu_us_per_message`` (broker process CPU over
  the run ÷ messages); object writes and descriptor commits (etcd transactions) per second.
- ``active_topics``: the same 32 senders cycling over 1, 32 and `--active` topics: object
  writes and commits per second must not grow with the number of topics.
- ``drain``: a second broker and a gateway start; 32 of the topics take sends through the
  gateway while the first broker is drained: how long until every topic it had is owned
  by the second, and each live topic's longest pause between acknowledgements.
- ``failover``: a third broker starts and the second, which has every topic now, is
  killed (SIGKILL; its registration TTL `--ttl`) while the 32 live topics take sends:
  when every topic was assigned to the third (``assigned_s``, from the kill) and opened
  there (``served_s``; goal: within the TTL + 10 s), and each live topic's pause.

Prints one JSON document. `--quick` (the test suite's run): 50 topics, 0.3 s runs.

    .venv/bin/python benchmarks/bench_topics.py [--topics 10000] [--clients 32] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import resource
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
from danube import DispatchStrategy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ballast.cluster import AdminClient
from ballast.metadata.etcd import EtcdStore
from benchmarks import bench_dataplane as dataplane
from benchmarks.cli import emit, parse_args
from benchmarks.processes import Processes
from tests.etcd_fixtures import free_port

PAYLOAD = b"x" * 1024
FIRST = b"y" * 100


def pct(values: list[float], q: float) -> float:
    return dataplane.pct(values, q) if values else 0.0


def scrape(metrics_url: str) -> dict[str, float]:
    """The broker's storage counters that say how much the commit stream works."""
    wanted = {
        "ballast_storage_stream_objects_total": "objects",
        "ballast_storage_descriptor_commits_total": "commits",
        "ballast_storage_wal_batches_total": "wal_batches",
    }
    out = dict.fromkeys(wanted.values(), 0.0)
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            name, _, value = line.partition(" ")
            if name in wanted:
                out[wanted[name]] = float(value)
    return out


def sample(proc: psutil.Process) -> dict[str, float]:
    times = proc.cpu_times()
    return {
        "cpu": times.user + times.system,
        "rss_mb": proc.memory_info().rss / 1e6,
        "fds": proc.num_fds(),
    }


async def idle(proc: psutil.Process, seconds: float) -> dict[str, float]:
    """The broker's CPU share of one core while nothing is sent, its RSS and descriptors."""
    first = sample(proc)
    began = time.perf_counter()
    await asyncio.sleep(seconds)
    last = sample(proc)
    return {
        "cpu_percent": round((last["cpu"] - first["cpu"]) / (time.perf_counter() - began) * 100, 2),
        "rss_mb": round(last["rss_mb"], 1),
        "open_fds": int(last["fds"]),
    }


async def count_keys(store: EtcdStore) -> int:
    listing = await store.get_prefix("/")
    return len(listing.items) + len(listing.undecodable)


async def open_topics(url: str, names: list[str], clients: int) -> dict[str, Any]:
    """Create and first-send every topic, `clients` at a time (one client each)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for name in names:
        queue.put_nowait(name)
    times: list[float] = []

    async def worker(n: int) -> None:
        client = await dataplane.client_for(url)
        while not queue.empty():
            topic = queue.get_nowait()
            start = time.perf_counter()
            producer = (
                client.new_producer()
                .with_topic(topic)
                .with_name(f"open-{n}")
                .with_dispatch_strategy(DispatchStrategy.RELIABLE)
                .build()
            )
            await producer.create()
            await producer.send(FIRST)
            times.append(time.perf_counter() - start)
            await producer.close()

    began = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(clients)))
    return {
        "topics": len(names),
        "clients": clients,
        "wall_s": round(time.perf_counter() - began, 2),
        "per_topic_p50_ms": round(pct(times, 0.5) * 1000, 1),
        "per_topic_p99_ms": round(pct(times, 0.99) * 1000, 1),
    }


async def senders(
    url: str, proc: psutil.Process, metrics: str, topics: list[str], duration: float
) -> dict[str, Any]:
    """32 sequential senders over `topics` (each sender its share, round robin)."""
    client = await dataplane.client_for(url)
    lanes: list[list[Any]] = [[] for _ in range(min(32, len(topics)) if len(topics) > 1 else 32)]
    for i, topic in enumerate(topics if len(topics) > 1 else topics * 32):
        producer = (
            client.new_producer()
            .with_topic(topic)
            .with_name(f"lane-{i}")
            .with_dispatch_strategy(DispatchStrategy.RELIABLE)
            .build()
        )
        await producer.create()
        lanes[i % len(lanes)].append(producer)
    latencies: list[float] = []
    count, measuring, stop = 0, False, False

    async def run(producers: list[Any]) -> None:
        nonlocal count
        i = 0
        while not stop:
            start = time.perf_counter()
            await producers[i % len(producers)].send(PAYLOAD)
            i += 1
            if measuring:
                latencies.append(time.perf_counter() - start)
                count += 1

    tasks = [asyncio.create_task(run(lane)) for lane in lanes]
    await asyncio.sleep(min(0.5, duration))
    # Scraped outside the window: a scrape costs the broker about 20 ms per 1 000 topics.
    counters = await asyncio.to_thread(scrape, metrics)
    before = sample(proc)
    measuring, began = True, time.perf_counter()
    await asyncio.sleep(duration)
    measuring = False
    elapsed = time.perf_counter() - began
    after = sample(proc)
    counters_after = await asyncio.to_thread(scrape, metrics)
    stop = True
    await asyncio.gather(*tasks)
    for lane in lanes:
        for producer in lane:
            await producer.close()
    return {
        "topics": len(topics),
        "msg_per_s": round(count / elapsed, 1),
        "produce_p50_ms": round(pct(latencies, 0.5) * 1000, 2),
        "broker_cpu_us_per_message": round((after["cpu"] - before["cpu"]) / max(count, 1) * 1e6),
        "object_writes_per_s": round(
            (counters_after["objects"] - counters["objects"]) / elapsed, 1
        ),
        "commits_per_s": round((counters_after["commits"] - counters["commits"]) / elapsed, 1),
        "wal_batches_per_s": round(
            (counters_after["wal_batches"] - counters["wal_batches"]) / elapsed, 1
        ),
    }


class LiveSends:
    """Sequential senders, one per live topic, through a gateway: when each send was
    acknowledged (a send the gateway gave up on is counted and tried again)."""

    def __init__(self, producers: list[Any]) -> None:
        self.producers = producers
        self.acked: list[list[float]] = [[] for _ in producers]
        self.failed = 0
        self._stop = False
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def create(cls, url: str, topics: list[str]) -> LiveSends:
        client = await dataplane.client_for(url)
        producers = []
        for topic in topics:
            producer = (
                client.new_producer()
                .with_topic(topic)
                .with_name("live")
                .with_dispatch_strategy(DispatchStrategy.RELIABLE)
                .build()
            )
            await producer.create()
            producers.append(producer)
        return cls(producers)

    async def _send(self, i: int) -> None:
        while not self._stop:
            try:
                await self.producers[i].send(PAYLOAD)
            except Exception:
                self.failed += 1
                await asyncio.sleep(0.05)
                continue
            self.acked[i].append(time.perf_counter())

    def start(self) -> None:
        self._stop = False
        self._tasks = [asyncio.create_task(self._send(i)) for i in range(len(self.producers))]

    async def stop(self) -> None:
        self._stop = True
        await asyncio.gather(*self._tasks)

    def pauses(self, since: float) -> list[float]:
        """Each topic's longest gap between acknowledgements ending after `since`."""
        return [
            max((b - a for a, b in itertools.pairwise(times) if b >= since), default=0.0)
            for times in self.acked
        ]


def pause_figures(pauses: list[float]) -> dict[str, float]:
    return {
        "pause_p50_s": round(pct(pauses, 0.5), 3),
        "pause_p99_s": round(pct(pauses, 0.99), 3),
        "pause_max_s": round(max(pauses, default=0.0), 3),
    }


def opened(metrics_url: str) -> int:
    """How many topics the broker has opened (its handover histogram's open count)."""
    # Only that series: a whole scrape lists every topic's storage series, about 20 ms of
    # the broker's event loop per 1 000 topics, inside the pauses measured.
    only = "?name[]=ballast_dataplane_topic_handover_seconds_count"
    with urllib.request.urlopen(metrics_url + only, timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith('ballast_dataplane_topic_handover_seconds_count{step="open"}'):
                return int(float(line.rsplit(" ", 1)[1]))
    return 0


async def all_opened(metrics_url: str, count: int, limit: float) -> float | None:
    """Seconds until the broker has opened `count` topics more than now (None: not within
    `limit`). Polled over HTTP in a thread: listing thousands of topics in this process
    would stall the live clients' event loop, and with it the pauses measured."""
    target = await asyncio.to_thread(opened, metrics_url) + count
    began = time.perf_counter()
    while time.perf_counter() - began < limit:
        if await asyncio.to_thread(opened, metrics_url) >= target:
            return time.perf_counter() - began
        await asyncio.sleep(0.1)
    return None


async def while_live(
    live: LiveSends,
    receiver: psutil.Process,
    metrics_url: str,
    moving: int,
    limit: float,
    act: Callable[[], Awaitable[object]],
    hold: float,
) -> tuple[float | None, dict[str, float]]:
    """`act` (a drain, a kill) while `live` topics take sends: the seconds until the
    `receiver` broker has opened `moving` topics more (None: not within `limit`); the live
    topics' pauses from `act` on, and the receiver's CPU per topic meanwhile."""
    live.start()
    await asyncio.sleep(hold)
    began = time.perf_counter()
    cpu = sum(receiver.cpu_times()[:2])
    waiting = asyncio.create_task(all_opened(metrics_url, moving, limit))
    await act()
    seconds = await waiting
    cpu = sum(receiver.cpu_times()[:2]) - cpu
    await asyncio.sleep(hold)
    await live.stop()
    figures = {
        **pause_figures(live.pauses(began)),
        "receiver_cpu_ms_per_topic": round(cpu * 1000 / max(moving, 1), 2),
    }
    return (None if seconds is None else round(seconds, 2)), figures


async def drain(
    store: EtcdStore,
    live: LiveSends,
    source: str,
    moving: int,
    target: psutil.Process,
    target_metrics: str,
    hold: float,
) -> dict[str, Any]:
    """Drain `source` (its `moving` topics) onto the other broker while `live` topics take
    sends through a gateway: the time until the other broker serves them all, and each
    live topic's longest pause. (`AdminClient.drain` writes one key; the admin CLI in a
    process of its own would add its start-up, a second of CPU on this machine's two
    cores, to the pauses measured.)"""
    drained, pauses = await while_live(
        live, target, target_metrics, moving, 300.0, lambda: AdminClient(store).drain(source), hold
    )
    return {"topics": moving, "live_topics": len(live.producers), "drain_s": drained, **pauses}


async def failover(
    more: Processes,
    live: LiveSends,
    dead: str,
    moving: int,
    heir_id: str,
    heir_metrics: str,
    ttl: float,
    hold: float,
) -> dict[str, Any]:
    """SIGKILL `dead` (its `moving` topics) while `live` topics take sends through a
    gateway: when the heir `heir_id` had opened them all (``served_s``, from the kill) and
    each live topic's pause."""

    async def kill() -> None:
        more.brokers[dead].kill()
        await more.brokers[dead].wait()

    heir = psutil.Process(more.brokers[heir_id].pid)
    served, pauses = await while_live(live, heir, heir_metrics, moving, ttl + 300.0, kill, hold)
    return {
        "topics": moving,
        "live_topics": len(live.producers),
        "registration_ttl_s": ttl,
        "served_s": served,
        "failed_sends": live.failed,
        **pauses,
    }


async def moves(
    store: EtcdStore, etcd_url: str, tmp: Path, live_topics: list[str], hold: float, ttl: float
) -> dict[str, Any]:
    """A second broker (registration TTL `ttl`) and a gateway start; the first broker is
    drained onto the second, then a third starts and the second is killed."""
    storage = {"data_dir": str(tmp / "data"), "object_store": str(tmp / "objects")}
    ports = {name: free_port() for name in ("topics-2", "topics-3")}
    configs = {
        name: dataplane.write_config(
            tmp / f"{name}.yaml",
            storage,
            broker={"registration_ttl_seconds": ttl, "leader_ttl_seconds": 10},
            metrics={"enabled": True, "port": port},
        )
        for name, port in ports.items()
    }
    metrics = {name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()}
    admin = AdminClient(store)
    more = Processes(etcd_url, configs["topics-2"], store, tmp / "logs")
    out: dict[str, Any] = {}
    try:
        await more.start_broker("topics-2")
        gateway = await more.start_gateway(dataplane.write_config(tmp / "gateway.yaml", storage))
        live = await LiveSends.create(gateway, live_topics)
        moving = len((await admin.view()).topics_of("topics-1"))
        target = psutil.Process(more.brokers["topics-2"].pid)
        out["drain"] = await drain(
            store, live, "topics-1", moving, target, metrics["topics-2"], hold
        )
        more.config = configs["topics-3"]
        await more.start_broker("topics-3")
        moving = len((await admin.view()).topics_of("topics-2"))
        out["failover"] = await failover(
            more, live, "topics-2", moving, "topics-3", metrics["topics-3"], ttl, hold
        )
    finally:
        await more.close()
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The broker inherits it: it must serve every topic under the usual default.
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(args.nofile, hard), hard))
    tmp = Path(tempfile.mkdtemp(prefix="bench-topics-"))
    procs = dataplane.Procs(tmp / "logs")
    metrics_port = free_port()
    config = dataplane.write_config(
        tmp / "broker.yaml",
        {"data_dir": str(tmp / "data"), "object_store": str(tmp / "objects")},
        metrics={"enabled": True, "port": metrics_port},
        # The default report interval: a report lists every topic, so its cost is part of
        # what an idle topic costs (about 2 points of a core at 900 topics every second).
        load_manager={"load_report_interval_seconds": 30, "assignment_strategy": "fair"},
    )
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    out: dict[str, Any] = {"nofile_limit": min(args.nofile, hard)}
    try:
        port = free_port()
        await procs.start([dataplane.__file__, "--noop-server", str(port)], "NOOP-STARTED")
        ceiling = (
            await dataplane.throughput(
                f"127.0.0.1:{port}", "/default/noop", 32, False, args.duration
            )
        )["msg_per_s"]
        out["ceiling_msg_per_s_32"] = ceiling
        async with dataplane.etcd_for(procs) as server, EtcdStore(server.client_url) as store:
            child = await dataplane.start_broker(procs, server.client_url, config, "topics-1")
            proc = psutil.Process(child.pid)
            url = await dataplane.broker_url(store, "topics-1")
            keys_before = await count_keys(store)
            out["idle_before"] = await idle(proc, args.idle_seconds)
            names = [f"/default/many-{i:06d}" for i in range(args.topics)]
            out["open"] = await open_topics(url, names, args.clients)
            await asyncio.sleep(1.0)  # the last commits and cursor writes settle
            out["idle_after"] = await idle(proc, args.idle_seconds)
            out["etcd_keys_per_topic"] = round(
                (await count_keys(store) - keys_before) / max(args.topics, 1), 2
            )
            reliable = {
                "one_topic_32": await senders(
                    url, proc, metrics, ["/default/hot-one"], args.duration
                ),
                "32_topics_32": await senders(
                    url, proc, metrics, [f"/default/hot-{i:02d}" for i in range(32)], args.duration
                ),
            }
            single = await dataplane.throughput(url, "/default/alone", 1, True, args.duration)
            reliable["one_producer"] = single
            for key in ("one_topic_32", "32_topics_32"):
                reliable[key]["share_of_ceiling"] = round(reliable[key]["msg_per_s"] / ceiling, 3)
            out["reliable"] = reliable
            active = min(args.active, args.topics)
            out["active_topics"] = {
                str(n): await senders(url, proc, metrics, names[:n], args.duration)
                for n in sorted({1, 32, active})
            }
            out["broker_alive"] = child.returncode is None
            if args.drain:
                live = [f"/default/hot-{i:02d}" for i in range(32)]
                out.update(
                    await moves(
                        store, server.client_url, tmp, live, max(args.duration, 1), args.ttl
                    )
                )
    finally:
        await procs.close()
    out["load_average"] = [round(x, 1) for x in os.getloadavg()]
    out["goals"] = {
        "idle_cpu_percent": out["idle_after"]["cpu_percent"],
        "idle_open_fds": out["idle_after"]["open_fds"],
        "etcd_keys_per_topic": out["etcd_keys_per_topic"],
        "open_wall_s": out["open"]["wall_s"],
        "open_p99_ms": out["open"]["per_topic_p99_ms"],
        "one_producer_p50_ms": out["reliable"]["one_producer"]["produce_p50_ms"],
        "broker_cpu_us_per_message_32": max(
            out["reliable"][k]["broker_cpu_us_per_message"]
            for k in ("one_topic_32", "32_topics_32")
        ),
    }
    if args.drain:
        out["goals"]["drain_s"] = out["drain"]["drain_s"]
        out["goals"]["drain_pause_p99_s"] = out["drain"]["pause_p99_s"]
        out["goals"]["failover_served_s"] = out["failover"]["served_s"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=10_000, help="idle reliable topics")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients opening them")
    parser.add_argument("--active", type=int, default=1000, help="topics the senders cycle over")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per send run")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="idle CPU window")
    parser.add_argument("--nofile", type=int, default=1024, help="the broker's ulimit -n")
    parser.add_argument(
        "--ttl", type=float, default=10.0, help="the killed broker's registration TTL (s)"
    )
    parser.add_argument(
        "--no-drain",
        dest="drain",
        action="store_false",
        help="skip the drain onto a second broker and its failover onto a third",
    )
    args = parse_args(
        parser,
        quick={
            "topics": 50,
            "clients": 8,
            "active": 50,
            "duration": 0.3,
            "idle_seconds": 1.0,
            "ttl": 2.0,
        },
    )
    emit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
