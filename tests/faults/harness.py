"""Fault injection against a real cluster, with a history of every acknowledged send.

One `FaultRun` is: a fresh etcd; broker processes (``python -m ballast.cluster.run``),
each with **its own data directory** (as on its own host) and every one of them behind
its own TCP proxy to etcd (so one broker can be cut off from etcd alone); one shared
object store (a directory, or moto's S3 server behind a proxy that can be cut); a
gateway; and real `danube-client` producers and consumers through the gateway, on
reliable topics owned by the broker the fault will hit (the *victim*).

Before any traffic, every topic gets an ``audit`` subscription that nobody reads until
the end: afterwards it must deliver every acknowledged send. A ``live`` consumer reads
throughout (its pauses are measured). The checker:

- lost: acknowledged payloads the audit subscription does not deliver;
- conflicts: an offset delivered with two different payloads (must be 0);
- reordered: the audit stream's offsets not strictly increasing (must be 0);
- duplicates: payloads delivered at more than one offset (a retried send; allowed);
- pauses: the longest gap between acknowledgements (producers) and deliveries (live).

Faults (`CASES`): SIGKILL of the owner with its disk (a lost host, a replacement broker
starts empty); SIGSTOP below the registration TTL (a stall) and above it (a zombie that
wakes up after its topics failed over); an unload and a rebalancing move while the owner
is stalled (the leader forces them after `seal_timeout_seconds`); a drain of a broker with
many busy topics; etcd stopped and restarted; the object store (moto S3) cut off and back;
a partition between the owner and etcd; a crash between an object's write and its commit
(the owner, cut off from etcd, keeps writing objects it cannot commit; then its host is
lost). The partition is made with a TCP proxy on the broker's etcd connection, not a
network namespace: it cuts exactly that path (the broker still serves its clients and
reaches the object store) and needs no privileges.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from danube import DanubeClientBuilder, DispatchStrategy, SubType

from ballast.clock import SystemClock
from ballast.cluster import AdminClient
from ballast.metadata.etcd import EtcdStore
from ballast.model import Move, TopicName
from ballast.storage import FsspecObjectStore, load_catalog
from ballast.storage.stream import SHARED_PREFIX
from tests.etcd_fixtures import EtcdServer, TcpProxy, free_port
from tests.faults.netns import Host, Topology
from tests.server.procs import started

SRC = str(Path(__file__).resolve().parents[2] / "src")
TTL = 3  # registration and leader TTL of the brokers (seconds)
NETNS_TTL = 5  # the same in the network-namespace cases
SEAL_TIMEOUT = 2


@dataclass
class Outcome:
    """What one run of one case measured."""

    case: str
    acknowledged: int = 0
    lost: int = 0
    conflicts: int = 0
    reordered: int = 0
    duplicates: int = 0
    producer_pause_s: float = 0.0
    consumer_pause_s: float = 0.0
    send_errors: int = 0
    lost_examples: list[str] = field(default_factory=list)
    failover_s: float = 0.0  # a host loss: until every topic had a new owner
    # From the fault's reference instant (its start, or the end of an outage) until every
    # topic's producers flow again: acknowledged sends with no pause over `FLOWING_GAP`.
    flowing_s: float = 0.0
    measures: dict[str, float] = field(default_factory=dict)  # case-specific figures

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.conflicts == 0 and self.reordered == 0


@dataclass
class TopicTraffic:
    """Sends and deliveries of one topic."""

    topic: str
    acked: dict[str, float] = field(default_factory=dict)  # payload -> when acknowledged
    live: list[tuple[int, str, float]] = field(default_factory=list)  # (offset, payload, t)
    audit: list[tuple[int, str]] = field(default_factory=list)
    errors: int = 0


class S3:
    """moto's S3 server (a real HTTP endpoint) behind a proxy that a test can cut."""

    BUCKET = "ballast-faults"

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
        self.proxy: TcpProxy | None = None

    async def start(self) -> None:
        import boto3

        self.server.start()
        host, port = self.server.get_host_and_port()
        boto3.client(
            "s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        ).create_bucket(Bucket=self.BUCKET)  # fmt: skip
        self.proxy = TcpProxy(port)
        await self.proxy.start()

    def options(self) -> dict[str, Any]:
        assert self.proxy is not None
        return {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.proxy.url, "region_name": "us-east-1"},
            "config_kwargs": {
                "connect_timeout": 1,
                "read_timeout": 2,
                "retries": {"max_attempts": 1},
            },
        }

    async def close(self) -> None:
        if self.proxy is not None:
            await self.proxy.cut()
        self.server.stop()


class FaultRun:
    """One cluster for one run of one case (see the module docstring)."""

    def __init__(
        self,
        case: str,
        root: Path,
        *,
        s3: bool = False,
        storage: dict[str, Any] | None = None,
        ttl: float = TTL,
    ) -> None:
        self.ttl = ttl
        self.case = case
        self.root = root
        self.use_s3 = s3
        self.storage = storage or {}  # the case's storage settings
        self.failover_s = 0.0  # set by a fault that measures it
        self.flowing_from: float | None = None  # set by a fault with a time-to-flowing bound
        self.measures: dict[str, float] = {}  # case-specific figures a fault records
        self.etcd = EtcdServer()
        self.s3: S3 | None = None
        self.store: EtcdStore | None = None
        self.brokers: dict[str, asyncio.subprocess.Process] = {}
        self.proxies: dict[str, TcpProxy] = {}
        self.gateway_proc: asyncio.subprocess.Process | None = None
        self.gateway = ""
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
        }

    # -- the cluster -----------------------------------------------------------------------

    def _config(self, name: str, data_dir: Path) -> Path:
        storage: dict[str, Any] = {
            "data_dir": str(data_dir),
            "upload_interval_seconds": 2.0,
            **self.storage,
        }
        if self.s3 is not None:
            storage["object_store"] = f"s3://{S3.BUCKET}/{self.case}"
            storage["object_store_options"] = self.s3.options()
        else:
            storage["object_store"] = str(self.root / "objects")  # shared by every broker
        config = {
            "load_manager": {
                "load_report_interval_seconds": 0.5,
                "assignment_strategy": "fair",
                "rebalancing": {"enabled": False, "seal_timeout_seconds": SEAL_TIMEOUT},
            },
            "broker": {"registration_ttl_seconds": self.ttl, "leader_ttl_seconds": self.ttl},
            "history": {"enabled": False},
            "metrics": {"enabled": False},
            "storage": storage,
            "gateway": {"lookup_wait_seconds": 30},
        }
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    async def start(self, brokers: tuple[str, ...] = ("b1", "b2")) -> None:
        await asyncio.to_thread(self.etcd.start)
        if self.use_s3:
            self.s3 = S3()
            await self.s3.start()
        self.store = EtcdStore(self.etcd.client_url)
        await self.store.__aenter__()
        for broker in brokers:  # the first one becomes the leader
            await self.start_broker(broker)
        await self.start_gateway()

    async def start_broker(self, broker: str) -> None:
        """Start `broker` with its own data directory, reaching etcd through its proxy."""
        proxy = self.proxies.get(broker)
        if proxy is None:
            proxy = self.proxies[broker] = TcpProxy(self.etcd.client_port)
            await proxy.start()
        await self._spawn_broker(broker, [], proxy.url, "127.0.0.1:0")

    async def _spawn_broker(
        self, broker: str, prefix: list[str], etcd_url: str, broker_url: str
    ) -> None:
        data_dir = self.root / broker
        config = self._config(broker, data_dir)
        proc = await asyncio.create_subprocess_exec(
            *prefix, sys.executable, "-m", "ballast.cluster.run", "--etcd", etcd_url,
            "--config", str(config), "--id", broker, "--broker-url", broker_url,
            "--log-level", os.environ.get("BALLAST_FAULTS_LOG", "ERROR"),
            stdout=asyncio.subprocess.PIPE, stderr=self._log(broker), env=self.env,
            cwd=str(self.root),
        )  # fmt: skip
        self.brokers[broker] = proc
        await started(proc, f"BROKER-STARTED {broker}", f"broker {broker}", 60)

    async def start_gateway(self) -> None:
        """Start the gateway, reaching etcd through its own proxy (`proxies["gateway"]`)."""
        proxy = self.proxies.get("gateway")
        if proxy is None:
            proxy = self.proxies["gateway"] = TcpProxy(self.etcd.client_port)
            await proxy.start()
        await self._spawn_gateway([], proxy.url, "127.0.0.1:0")

    async def _spawn_gateway(self, prefix: list[str], etcd_url: str, listen: str) -> None:
        config = self._config("gateway", self.root / "gateway")
        proc = await asyncio.create_subprocess_exec(
            *prefix, sys.executable, "-m", "ballast.cli.main", "gateway", "--etcd", etcd_url,
            "--config", str(config), "--listen", listen,
            "--log-level", os.environ.get("BALLAST_FAULTS_LOG", "ERROR"),
            stdout=asyncio.subprocess.PIPE, stderr=self._log("gateway"), env=self.env,
        )  # fmt: skip
        self.gateway_proc = proc
        self.gateway = await started(proc, "GATEWAY-STARTED", "gateway", 60)

    def _log(self, name: str) -> Any:
        return open(self.root / f"{name}.log", "ab")

    def signal(self, broker: str, sig: signal.Signals) -> None:
        self.brokers[broker].send_signal(sig)

    async def kill_host(self, broker: str) -> None:
        """SIGKILL `broker` and delete its data directory: the host is gone."""
        self.signal(broker, signal.SIGKILL)
        await self.brokers[broker].wait()
        shutil.rmtree(self.root / broker, ignore_errors=True)

    @property
    def admin(self) -> AdminClient:
        assert self.store is not None
        return AdminClient(self.store, SystemClock())

    async def owner(self, topic: str) -> str | None:
        return (await self.admin.view()).owner(topic)

    async def close(self) -> None:
        procs = [*self.brokers.values(), *([self.gateway_proc] if self.gateway_proc else [])]
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                    proc.terminate()
        for proc in procs:
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for proxy in self.proxies.values():
            await proxy.cut()
        if self.store is not None:
            await self.store.__aexit__(None, None, None)
        if self.s3 is not None:
            await self.s3.close()
        await asyncio.to_thread(self.etcd.close)

    # -- traffic ---------------------------------------------------------------------------

    async def create_topics(self, names: list[str], owner: str) -> None:
        admin = self.admin
        for start in range(0, len(names), 50):  # a thousand topics in a few seconds
            await asyncio.gather(
                *(
                    admin.create_topic(name, hint=owner, meta={"dispatch_strategy": "reliable"})
                    for name in names[start : start + 50]
                )
            )
        deadline = time.monotonic() + 30 + len(names) / 20
        while time.monotonic() < deadline:
            view = await admin.view()
            if all(view.owner(n) == owner for n in names):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"topics not placed on {owner}")


class NetnsEtcd(EtcdServer):
    """etcd on a host of a `Topology`, on its ``cluster`` address."""

    def __init__(self, host: Host) -> None:
        self.host = host
        super().__init__()

    @property
    def client_url(self) -> str:
        return f"http://{self.host.address('cluster')}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host.address('cluster')}:{self.peer_port}"

    def command(self) -> list[str]:
        return self.host.command(*super().command())


class NetnsRun(FaultRun):
    """A `FaultRun` whose etcd, brokers and gateway are hosts of a `Topology` (network
    namespaces): their connections cross a bridge, and a fault can make any of them drop
    packets silently (`Topology.blackhole`). Brokers and the gateway serve on their
    ``front`` address and reach etcd on the ``cluster`` network, so the data plane (gateway
    to broker, broker to broker) and the control plane can be cut apart. The test process
    (clients, admin) sits in the root namespace, on both bridges."""

    def __init__(self, case: str, root: Path, **kwargs: Any) -> None:
        super().__init__(case, root, **kwargs)
        self.etcd.close()  # replaced by one inside the topology, in `start`
        self._topology: Topology | None = None

    @property
    def topology(self) -> Topology:
        assert self._topology is not None
        return self._topology

    async def start(self, brokers: tuple[str, ...] = ("b1", "b2")) -> None:
        self._topology = Topology()
        etcd_host = self.topology.add_host("etcd", ("cluster",))
        for broker in brokers:
            self.topology.add_host(broker)
        self.topology.add_host("gateway")
        self.etcd = NetnsEtcd(etcd_host)
        await super().start(brokers)

    async def start_broker(self, broker: str) -> None:
        host = self.topology.hosts.get(broker) or self.topology.add_host(broker)
        await self._spawn_broker(
            broker, host.command(), self.etcd.client_url, f"{host.address('front')}:0"
        )

    async def start_gateway(self) -> None:
        host = self.topology.hosts["gateway"]
        await self._spawn_gateway(
            host.command(), self.etcd.client_url, f"{host.address('front')}:0"
        )

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            if self._topology is not None:
                self._topology.close()


class Workload:
    """Producers, a live consumer and an unread audit subscription per topic."""

    def __init__(self, gateway: str, topics: list[str], producers_per_topic: int = 2) -> None:
        self.gateway = gateway
        self.traffic = {t: TopicTraffic(t) for t in topics}
        self.producers_per_topic = producers_per_topic
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.client: Any = None

    async def start(self) -> None:
        self.client = await DanubeClientBuilder().service_url(f"http://{self.gateway}").build()
        for topic in self.traffic:
            # The audit subscription exists before the traffic and is read only at the end.
            audit = self._consumer(topic, "audit", "auditor")
            await audit.subscribe()
            await audit.close()
        for topic, traffic in self.traffic.items():
            live = self._consumer(topic, "live", "live")
            await live.subscribe()
            queue = await live.receive()
            self.tasks.append(asyncio.create_task(self._consume(live, queue, traffic)))
            for n in range(self.producers_per_topic):
                producer = (
                    self.client.new_producer().with_topic(topic).with_name(f"p{n}")
                    .with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
                )  # fmt: skip
                await producer.create()
                self.tasks.append(asyncio.create_task(self._produce(producer, n, traffic)))

    def _consumer(self, topic: str, subscription: str, name: str) -> Any:
        return (
            self.client.new_consumer().with_topic(topic).with_consumer_name(name)
            .with_subscription(subscription).with_subscription_type(SubType.EXCLUSIVE).build()
        )  # fmt: skip

    async def _produce(self, producer: Any, n: int, traffic: TopicTraffic) -> None:
        seq = 0
        try:
            while not self.stop.is_set():
                payload = f"{traffic.topic}|p{n}|{seq}"
                try:
                    async with asyncio.timeout(60):
                        await producer.send(payload.encode())
                    traffic.acked[payload] = time.monotonic()
                except Exception:  # not acknowledged: the checker does not expect it
                    traffic.errors += 1
                    await asyncio.sleep(0.2)
                seq += 1
                await asyncio.sleep(0.01)
        finally:
            with contextlib.suppress(Exception):
                await producer.close()

    async def _consume(self, consumer: Any, queue: asyncio.Queue[Any], t: TopicTraffic) -> None:
        try:
            while True:
                msg = await queue.get()
                t.live.append((msg.msg_id.topic_offset, msg.payload.decode(), time.monotonic()))
                with contextlib.suppress(Exception):
                    await consumer.ack(msg)
        finally:
            with contextlib.suppress(Exception):
                await consumer.close()

    async def finish(self) -> None:
        """Stop producing; stop the live consumers a moment later."""
        self.stop.set()
        await asyncio.sleep(0.5)
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def read_audit(self, quiet: float = 4.0, limit: float = 60.0) -> None:
        """Read every audit subscription until nothing more arrives for `quiet` seconds."""
        for topic, traffic in self.traffic.items():
            consumer = self._consumer(topic, "audit", "auditor")
            await consumer.subscribe()
            queue = await consumer.receive()
            expected = set(traffic.acked)
            seen: set[str] = set()
            deadline = time.monotonic() + limit
            while time.monotonic() < deadline:
                wait = 1.0 if expected <= seen else quiet
                try:
                    msg = await asyncio.wait_for(queue.get(), wait)
                except TimeoutError:
                    break
                payload = msg.payload.decode()
                traffic.audit.append((msg.msg_id.topic_offset, payload))
                seen.add(payload)
                with contextlib.suppress(Exception):
                    await consumer.ack(msg)
            with contextlib.suppress(Exception):
                await consumer.close()

    def check(
        self, case: str, fault_window: tuple[float, float], flowing_from: float | None = None
    ) -> Outcome:
        """Compare the acknowledged sends with what was delivered (see module docstring)."""
        out = Outcome(case)
        if flowing_from is not None:
            out.flowing_s = max(
                _flowing_after(sorted(t.acked.values()), fault_window, flowing_from)
                for t in self.traffic.values()
            )
        for traffic in self.traffic.values():
            out.acknowledged += len(traffic.acked)
            out.send_errors += traffic.errors
            delivered = {payload for _, payload in traffic.audit}
            missing = sorted(set(traffic.acked) - delivered)
            out.lost += len(missing)
            out.lost_examples += missing[:3]
            by_offset: dict[int, str] = {}
            for offset, payload, _ in traffic.live:
                by_offset.setdefault(offset, payload)
            offsets_of: dict[str, set[int]] = {}
            for offset, payload in [*((o, p) for o, p, _ in traffic.live), *traffic.audit]:
                if by_offset.setdefault(offset, payload) != payload:
                    out.conflicts += 1
                offsets_of.setdefault(payload, set()).add(offset)
            out.duplicates += sum(len(o) - 1 for o in offsets_of.values())
            audit_offsets = [offset for offset, _ in traffic.audit]
            out.reordered += sum(1 for a, b in itertools.pairwise(audit_offsets) if b <= a)
            out.producer_pause_s = max(
                out.producer_pause_s, _longest_gap(sorted(traffic.acked.values()), fault_window)
            )
            out.consumer_pause_s = max(
                out.consumer_pause_s, _longest_gap([t for _, _, t in traffic.live], fault_window)
            )
        return out


def _longest_gap(times: list[float], window: tuple[float, float]) -> float:
    """The longest time without an event, around the fault window."""
    start, end = window
    points = [start, *(t for t in times if start <= t <= end), end]
    return round(max(b - a for a, b in itertools.pairwise(points)), 2)


FLOWING_GAP = 1.5  # a pause longer than this is not "flowing"


def _flowing_after(times: list[float], window: tuple[float, float], since: float) -> float:
    """Seconds from `since` until acknowledgements flow for good: the end of the last pause
    over `FLOWING_GAP` in the window (0 if it ended before `since`, or none was that long).
    Without any acknowledgement after `since`, the whole rest of the window."""
    start, end = window
    points = [start, *(t for t in times if start <= t <= end), end]
    if points[-2] < since:
        return round(end - since, 2)
    last = start
    for a, b in itertools.pairwise(points[:-1]):
        if b - a > FLOWING_GAP:
            last = b
    return round(max(0.0, last - since), 2)


# -- the cases ---------------------------------------------------------------------------

Fault = Callable[[FaultRun, list[str]], Awaitable[None]]


async def _wait(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


async def _all_moved(run: FaultRun, topics: list[str], away_from: str) -> bool:
    view = await run.admin.view()
    return all(view.owner(t) not in (None, away_from) for t in topics)


async def fault_kill(run: FaultRun, topics: list[str]) -> None:
    """The owner's host is lost (SIGKILL, disk gone); a replacement starts empty."""
    await run.kill_host("b2")
    await run.start_broker("b3")
    await _wait(lambda: _all_moved(run, topics, "b2"), 30, "failover")


async def fault_stall(run: FaultRun, topics: list[str]) -> None:
    """The owner stalls for less than its registration TTL."""
    run.signal("b2", signal.SIGSTOP)
    await asyncio.sleep(TTL * 0.6)
    run.signal("b2", signal.SIGCONT)
    await asyncio.sleep(2)


async def fault_zombie(run: FaultRun, topics: list[str]) -> None:
    """The owner stalls past its TTL (its topics fail over), then wakes up."""
    run.signal("b2", signal.SIGSTOP)
    await _wait(lambda: _all_moved(run, topics, "b2"), 30, "failover of the stalled owner")
    await asyncio.sleep(1)
    run.signal("b2", signal.SIGCONT)
    await asyncio.sleep(3)


async def fault_unload_stalled(run: FaultRun, topics: list[str]) -> None:
    """Unload the topics of a stalled owner: the leader forces the moves."""
    run.signal("b2", signal.SIGSTOP)
    for topic in topics:
        await run.admin.unload_topic(topic)
    await _wait(lambda: _all_moved(run, topics, "b2"), 30, "forced moves")
    await asyncio.sleep(1)
    run.signal("b2", signal.SIGCONT)
    await asyncio.sleep(3)


async def fault_move_stalled(run: FaultRun, topics: list[str]) -> None:
    """A rebalancing move of a stalled owner's topics (a reviewed plan applied)."""
    run.signal("b2", signal.SIGSTOP)
    moves = [Move(t, "b2", "b1", "LoadImbalance").to_dict() for t in topics]
    outcomes = await run.admin.apply_plan({"moves": moves})
    assert all(o.applied for o in outcomes), outcomes
    await _wait(lambda: _all_moved(run, topics, "b2"), 30, "forced moves")
    await asyncio.sleep(1)
    run.signal("b2", signal.SIGCONT)
    await asyncio.sleep(3)


async def fault_drain(run: FaultRun, topics: list[str]) -> None:
    """Drain the owner of many busy topics."""
    await run.admin.drain("b2")
    await _wait(lambda: _all_moved(run, topics, "b2"), 60, "the drain")
    await asyncio.sleep(2)


async def fault_etcd_restart(run: FaultRun, topics: list[str]) -> None:
    """etcd stops for longer than the brokers' TTL, then restarts with its data."""
    await asyncio.to_thread(run.etcd.stop)
    await asyncio.sleep(TTL + 3)
    await asyncio.to_thread(run.etcd.start)
    await asyncio.sleep(TTL + 3)


async def fault_object_store(run: FaultRun, topics: list[str]) -> None:
    """The object store (moto S3) is unreachable for a while, then back."""
    assert run.s3 is not None and run.s3.proxy is not None
    await run.s3.proxy.cut()
    await asyncio.sleep(6)
    await run.s3.proxy.restore()
    await asyncio.sleep(4)


async def fault_partition(run: FaultRun, topics: list[str]) -> None:
    """The owner loses etcd (past its TTL) while clients and storage still reach it."""
    proxy = run.proxies["b2"]
    await proxy.cut()
    await _wait(lambda: _all_moved(run, topics, "b2"), 30, "failover of the partitioned owner")
    await asyncio.sleep(2)
    await proxy.restore()
    await asyncio.sleep(3)


async def _uncommitted_objects(run: FaultRun, topics: list[str], shared: bool = False) -> int:
    """Message objects in the shared store that no committed descriptor names (`shared`:
    only objects of the broker's commit stream holding several topics' parts)."""
    assert run.store is not None
    root = run.root / "objects"
    objects = FsspecObjectStore(str(root))
    named: set[str] = set()
    for topic in topics:
        catalog = await load_catalog(run.store, TopicName.parse(topic), objects=objects)
        named.update(d.object_id for d in catalog.objects)
    found = [p.relative_to(root).as_posix() for p in root.rglob("*.bobj")]
    return sum(
        1
        for name in found
        if name not in named and (not shared or name.startswith(f"{SHARED_PREFIX}/"))
    )


async def fault_crash_before_commit(run: FaultRun, topics: list[str]) -> None:
    """The owner writes objects it cannot commit (etcd is cut off from it), then its host
    is lost: those objects are orphans, their sends were never acknowledged."""
    await run.proxies["b2"].cut()
    await asyncio.sleep(1.5)  # sends keep arriving: objects written, their commits wait
    # Counted against what etcd holds: the object whose commit the cut caught counts too
    # (when every producer waits on that commit, no later object is written).
    orphans = await _uncommitted_objects(run, topics)
    assert orphans > 0, "no object was written while the owner could not commit"
    await run.kill_host("b2")
    await run.start_broker("b3")
    await _wait(lambda: _all_moved(run, topics, "b2"), 30, "failover")


async def fault_crash_before_shared_commit(run: FaultRun, topics: list[str]) -> None:
    """Many busy topics: the owner writes objects shared by several of them (its writes are
    paced, so each carries every topic's part) that it cannot commit (etcd is cut off from
    it); then its host is lost. Each topic's part is an orphan, nothing was acknowledged."""
    await run.proxies["b2"].cut()
    shared = 0
    deadline = time.monotonic() + 5
    while shared == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        shared = await _uncommitted_objects(run, topics, shared=True)
    assert shared > 0, "no shared object was written while the owner could not commit"
    await run.kill_host("b2")
    await run.start_broker("b3")
    await _wait(lambda: _all_moved(run, topics, "b2"), 30, "failover")


async def fault_fenced_in_shared_commit(run: FaultRun, topics: list[str]) -> None:
    """The owner stalls; one of its busy topics is moved away meanwhile (forced after the
    seal timeout); the owner wakes up with sends of every topic waiting for one shared
    commit: the moved topic fails alone (fenced), the others commit and go on here."""
    run.signal("b2", signal.SIGSTOP)
    moved, stays = topics[0], topics[1:]
    outcomes = await run.admin.apply_plan(
        {"moves": [Move(moved, "b2", "b1", "LoadImbalance").to_dict()]}
    )
    assert all(o.applied for o in outcomes), outcomes
    await _wait(lambda: _all_moved(run, [moved], "b2"), 30, "the forced move")
    run.signal("b2", signal.SIGCONT)
    await asyncio.sleep(3)
    view = await run.admin.view()
    assert all(view.owner(t) == "b2" for t in stays), "the other topics left the owner"


async def fault_kill_many(run: FaultRun, topics: list[str]) -> None:
    """The host of a thousand topics is lost (four of them busy); the survivors take every
    one over within the registration TTL and a few seconds."""
    idle = [f"/default/idle-{i:04d}" for i in range(MANY_TOPICS)]
    began = time.monotonic()
    await run.kill_host("b2")
    await _wait(lambda: _all_moved(run, [*topics, *idle], "b2"), TTL + 60, "failover")
    run.failover_s = time.monotonic() - began


async def _blackhole_for(
    run: NetnsRun, host: str, seconds: float, networks: tuple[str, ...] | None = None
) -> None:
    run.topology.blackhole(host, networks)
    try:
        await asyncio.sleep(seconds)
    finally:
        run.topology.restore(host, networks)


BLACKHOLE_S = NETNS_TTL + 15  # an owner or a path silent for this long (past the TTL)


async def fault_blackhole_owner(run: FaultRun, topics: list[str]) -> None:
    """The owner of the live topics drops every packet (a hung host, a dead switch port)
    for longer than its registration TTL, then comes back: its topics fail over; clients
    flow again within the TTL and a few seconds; the owner comes back fenced."""
    assert isinstance(run, NetnsRun)
    run.flowing_from = time.monotonic()
    await _blackhole_for(run, "b2", BLACKHOLE_S)
    await asyncio.sleep(3)


async def fault_blackhole_gateway_path(run: FaultRun, topics: list[str]) -> None:
    """Only the data plane of the owner is cut (gateway to owner, and broker to broker):
    the owner still reaches etcd, keeps its registration and owns its topics."""
    assert isinstance(run, NetnsRun)
    run.flowing_from = time.monotonic()
    await _blackhole_for(run, "b2", BLACKHOLE_S, ("front",))
    await asyncio.sleep(3)


async def fault_blackhole_etcd(run: FaultRun, topics: list[str]) -> None:
    """etcd drops every packet for every process for 10 s (longer than the TTL), then
    answers again; clients flow within a few seconds of its return."""
    assert isinstance(run, NetnsRun)
    await _blackhole_for(run, "etcd", 10)
    run.flowing_from = time.monotonic()
    await asyncio.sleep(NETNS_TTL + 3)


async def fault_blackhole_leader(run: FaultRun, topics: list[str]) -> None:
    """The leader (not the owner) drops every packet for 20 s: another broker leads within
    the TTL and a few seconds, and clients of the owner's topics never wait."""
    assert isinstance(run, NetnsRun)
    run.flowing_from = began = time.monotonic()
    run.topology.blackhole("b1")
    try:

        async def new_leader() -> bool:
            leader = await run.admin.leader()
            return leader is not None and leader.get("broker_id") != "b1"

        await _wait(new_leader, 20, "a new leader")
        run.measures["new_leader_s"] = round(time.monotonic() - began, 2)
        await asyncio.sleep(max(0.0, 20 - (time.monotonic() - began)))
    finally:
        run.topology.restore("b1")
    await asyncio.sleep(3)


async def fault_etcd_connection_frozen(run: FaultRun, topics: list[str]) -> None:
    """The gateway's connection to etcd freezes (open, nothing forwarded; new connections
    work) and the topics move meanwhile: the gateway learns their new owner only once its
    keepalive drops the frozen connection and the routing watch resumes on a new one."""
    proxy = run.proxies["gateway"]
    assert proxy.freeze() >= 1, "the gateway had no open connection to etcd"
    run.flowing_from = time.monotonic()
    for topic in topics:
        await run.admin.unload_topic(topic)
    await _wait(lambda: _all_moved(run, topics, "b2"), 30, "the moves")
    await asyncio.sleep(15)


@dataclass(frozen=True)
class Case:
    fault: Fault
    topics: int = 2
    s3: bool = False
    storage: dict[str, Any] = field(default_factory=dict)  # broker storage settings
    ttl: float = TTL  # the brokers' registration TTL
    idle_topics: int = 0  # on the victim besides the busy ones, without traffic
    netns: bool = False  # hosts in network namespaces (`NetnsRun`)
    brokers: tuple[str, ...] = ("b1", "b2")  # b1 leads, b2 owns the topics
    # Clients must flow again within this many seconds of the fault's reference instant.
    flowing_bound_s: float | None = None


# Object writes paced so that each round carries every busy topic's part (a shared object).
_PACED = {"max_object_writes_per_second": 20.0}
MANY_TOPICS = 1000
_THREE = ("b1", "b2", "b3")


CASES: dict[str, Case] = {
    "sigkill_host_lost": Case(fault_kill),
    "stall_below_ttl": Case(fault_stall),
    "zombie_above_ttl": Case(fault_zombie),
    "unload_during_stall": Case(fault_unload_stalled),
    "move_during_stall": Case(fault_move_stalled),
    "drain_busy_broker": Case(fault_drain, topics=6),
    "etcd_restart": Case(fault_etcd_restart),
    "object_store_outage": Case(fault_object_store, s3=True),
    "partition_from_etcd": Case(fault_partition),
    "crash_before_commit": Case(fault_crash_before_commit),
    "crash_before_shared_commit": Case(fault_crash_before_shared_commit, 8, storage=_PACED),
    # A TTL well above the stall: the owner keeps its registration and its other topics.
    "fenced_in_shared_commit": Case(fault_fenced_in_shared_commit, 6, storage=_PACED, ttl=15),
    "host_lost_with_1000_topics": Case(fault_kill_many, 4, idle_topics=MANY_TOPICS),
    # Gray failures: packets vanish (network namespaces, a veth set down), no reset.
    "blackhole_owner": Case(
        fault_blackhole_owner, ttl=NETNS_TTL, netns=True, brokers=_THREE,
        flowing_bound_s=NETNS_TTL + 5,
    ),
    "blackhole_gateway_path": Case(
        fault_blackhole_gateway_path, ttl=NETNS_TTL, netns=True, brokers=_THREE,
        flowing_bound_s=NETNS_TTL + 5,
    ),
    "blackhole_etcd": Case(
        fault_blackhole_etcd, ttl=NETNS_TTL, netns=True, brokers=_THREE, flowing_bound_s=5,
    ),
    "blackhole_leader": Case(
        fault_blackhole_leader, ttl=NETNS_TTL, netns=True, brokers=_THREE, flowing_bound_s=5,
    ),
    "etcd_connection_frozen": Case(fault_etcd_connection_frozen, flowing_bound_s=15),
}  # fmt: skip


async def run_case(name: str, root: Path | None = None, warmup: float = 2.0) -> Outcome:
    """One run of one case on a fresh cluster; the outcome (asserts nothing itself)."""
    case = CASES[name]
    own_root = root is None
    root = root or Path(tempfile.mkdtemp(prefix=f"ballast-fault-{name}-"))
    kind = NetnsRun if case.netns else FaultRun
    run = kind(name, root, s3=case.s3, storage=case.storage, ttl=case.ttl)
    try:
        await run.start(case.brokers)
        topics = [f"/default/{name.replace('_', '-')}-{i}" for i in range(case.topics)]
        await run.create_topics(topics, owner="b2")
        if case.idle_topics:
            await run.create_topics(
                [f"/default/idle-{i:04d}" for i in range(case.idle_topics)], owner="b2"
            )
        workload = Workload(run.gateway, topics)
        await workload.start()
        await asyncio.sleep(warmup)
        started = time.monotonic()
        await case.fault(run, topics)
        await asyncio.sleep(2)  # traffic after the fault, on the new owners
        ended = time.monotonic()
        await workload.finish()
        await workload.read_audit()
        outcome = workload.check(name, (started, ended), run.flowing_from)
        outcome.failover_s = round(run.failover_s, 2)
        outcome.measures = run.measures
        return outcome
    finally:
        await run.close()
        if own_root:
            shutil.rmtree(root, ignore_errors=True)
