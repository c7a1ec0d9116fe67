"""Data-plane benchmark: the real `danube-client` against real broker processes over loopback.

- throughput: 1, 8 and 32 concurrent producers (`--producers`; one `Producer` each,
  sequential sends, 1 KiB payloads) to one topic, non-reliable and reliable (fsync per
  batch), on one broker process; messages/s and produce latency p50/p99;
- ceiling: the same client against a gRPC server (its own process) that answers
  SendMessage without doing anything;
- end-to-end latency: one producer at a steady rate, one consumer, p50/p99 from send to
  receipt (both ends in this process, one clock);
- schema validation: 32 producers of ~1 KiB JSON documents to a non-reliable topic without
  a schema and to one whose topic enforces a JSON Schema (every payload validated before
  it is published), measured alternately, side by side (goal: validation costs <= 15 %);
- ack modes: reliable produce at the same producer counts with `storage.ack` durable and
  local, the object store a local directory and moto's S3 server (its own process), one
  fresh broker per setting: messages/s, produce p50/p99 and object writes per second;
- moves: a live reliable topic moved `--moves` times between two broker processes while a
  producer and a consumer run; per move, the longest pause each side sees (p50/p99/max),
  and whether every acknowledged send was consumed;
- slow consumer (``--slow-consumer``, run alone): 32 producers of 1 KiB to a non-reliable
  topic with one reading subscription, for `--duration` seconds, without and then with a
  second subscription that never reads; the broker's resident memory (peak, sampled every
  0.2 s) against its `subscription_buffer_bytes`, and the reading subscription's rate in
  both runs (goal: within 10 %).

Client and brokers share the machine. Prints one JSON document. `--quick` (the test suite's
run): every part but the slow consumer at 32 producers only, 0.2 s per measurement, one
schema round, one move.

    .venv/bin/python benchmarks/bench_dataplane.py [--duration 3] [--moves 20] [--only-schemas]
        [--only-ack-modes] [--quick]
    .venv/bin/python benchmarks/bench_dataplane.py --slow-consumer [--duration 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import yaml
from danube import DanubeClientBuilder, DispatchStrategy, SubType
from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeApi_pb2_grpc as pb_grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ballast.cluster import AdminClient
from ballast.metadata import keys
from ballast.metadata.etcd import EtcdStore
from benchmarks.bench_failover import cpu_seconds
from benchmarks.cli import emit, parse_args
from benchmarks.processes import tail
from tests.etcd_fixtures import EtcdServer, free_port

PAYLOAD = b"x" * 1024
COUNTS = (1, 8, 32)  # concurrent producers (`--producers`); the goals compare at 32


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of `values` (nearest rank); 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the no-op server (the ceiling) --------------------------------------------------------


class NoopServer(pb_grpc.DiscoveryServicer, pb_grpc.ProducerServiceServicer,
                 pb_grpc.HealthCheckServicer):  # fmt: skip
    """Answers every call the producer makes, doing nothing else."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def TopicLookup(self, request: Any, context: Any) -> Any:
        return pb.TopicLookupResponse(
            request_id=request.request_id,
            response_type=pb.TopicLookupResponse.Connect,
            connect_url=self.url,
            broker_url=self.url,
        )

    async def CreateProducer(self, request: Any, context: Any) -> Any:
        return pb.ProducerResponse(request_id=request.request_id, producer_id=1)

    async def SendMessage(self, request: Any, context: Any) -> Any:
        return pb.MessageResponse(request_id=request.request_id)

    async def HealthCheck(self, request: Any, context: Any) -> Any:
        return pb.HealthCheckResponse(status=pb.HealthCheckResponse.OK)


async def run_noop_server(port: int) -> None:
    url = f"127.0.0.1:{port}"
    server = grpc.aio.server()
    service = NoopServer(url)
    pb_grpc.add_DiscoveryServicer_to_server(service, server)
    pb_grpc.add_ProducerServiceServicer_to_server(service, server)
    pb_grpc.add_HealthCheckServicer_to_server(service, server)
    server.add_insecure_port(url)
    await server.start()
    print("NOOP-STARTED", flush=True)
    await server.wait_for_termination()


# -- processes -----------------------------------------------------------------------------


class Procs:
    """Child processes of the benchmark (terminated at the end); each one's stderr is a
    file in `logs`, whose tail a child that exits before it starts fails with."""

    def __init__(self, logs: Path) -> None:
        self.procs: list[asyncio.subprocess.Process] = []
        self.ready: dict[int, str] = {}  # pid -> the line it announced itself with
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)

    async def start(self, args: list[str], ready: str) -> asyncio.subprocess.Process:
        log = self.logs / f"{len(self.procs)}-{ready.split()[-1].lower()}.log"
        with log.open("ab") as stderr:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=stderr,
                env=self.env,
            )  # fmt: skip
        self.procs.append(proc)
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            while True:
                line = await proc.stdout.readline()
                if not line:
                    await proc.wait()
                    raise RuntimeError(
                        f"{args} exited before starting (exit code {proc.returncode}); "
                        f"its stderr ({log}) ends:\n{tail(log)}"
                    )
                if line.decode().strip().startswith(ready):
                    self.ready[proc.pid] = line.decode().strip()
                    return proc

    async def close(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in self.procs:
            try:
                async with asyncio.timeout(20):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


@contextlib.asynccontextmanager
async def etcd_for(procs: Procs) -> AsyncIterator[EtcdServer]:
    """An etcd whose brokers (every child in `procs`) are stopped before it: a broker leaves
    gracefully through its etcd, and with the etcd gone first each one used up `close`'s
    20 s before it was killed."""
    with EtcdServer() as server:
        try:
            yield server
        finally:
            await procs.close()


def write_config(path: Path, storage: dict[str, Any], **sections: Any) -> Path:
    """A benchmark broker's config file: quick reports, no history; `sections` override."""
    path.write_text(yaml.safe_dump({
        "load_manager": {"load_report_interval_seconds": 1, "assignment_strategy": "fair"},
        "broker": {"registration_ttl_seconds": 10, "leader_ttl_seconds": 10},
        "history": {"enabled": False},
        "metrics": {"enabled": False},
        "storage": storage,
        **sections,
    }))  # fmt: skip
    return path


async def start_broker(
    procs: Procs, etcd: str, config: Path, broker_id: str
) -> asyncio.subprocess.Process:
    return await procs.start(
        ["-m", "ballast.cluster.run", "--etcd", etcd, "--config", str(config), "--id",
         broker_id, "--broker-url", "127.0.0.1:0", "--log-level", "ERROR"],
        f"BROKER-STARTED {broker_id}",
    )  # fmt: skip


async def broker_url(store: EtcdStore, broker_id: str) -> str:
    kv = await store.get(keys.register(broker_id))
    assert kv is not None
    return str(kv.value["broker_url"])


# -- measurements --------------------------------------------------------------------------


async def client_for(url: str) -> Any:
    return await DanubeClientBuilder().service_url(f"http://{url}").build()


async def throughput(url: str, topic: str, producers: int, reliable: bool, duration: float,
                     payload: bytes = PAYLOAD, subject: str | None = None,
                     watch: dict[str, psutil.Process] | None = None,
                     ) -> dict[str, float]:  # fmt: skip
    """Messages/s and produce latency of `producers` concurrent sequential senders; with
    `watch`, each watched process's CPU time over the measured part per message sent
    (``<name>_cpu_us_per_message``)."""
    client = await client_for(url)
    made = []
    for i in range(producers):
        builder = client.new_producer().with_topic(topic).with_name(f"bench-{producers}-{i}")
        if reliable:
            builder = builder.with_dispatch_strategy(DispatchStrategy.RELIABLE)
        if subject is not None:
            builder = builder.with_schema_subject(subject)
        producer = builder.build()
        await producer.create()
        made.append(producer)
    latencies: list[float] = []
    count = 0
    measuring = False
    stop = False

    async def run(producer: Any) -> None:
        nonlocal count
        while not stop:
            start = time.perf_counter()
            await producer.send(payload)
            if measuring:
                latencies.append(time.perf_counter() - start)
                count += 1

    tasks = [asyncio.create_task(run(p)) for p in made]
    await asyncio.sleep(min(0.5, duration))  # warm-up
    watched = watch or {}
    cpu_before = {name: cpu_seconds(proc) for name, proc in watched.items()}
    measuring = True
    began = time.perf_counter()
    await asyncio.sleep(duration)
    measuring = False
    elapsed = time.perf_counter() - began
    spent = {name: cpu_seconds(proc) - cpu_before[name] for name, proc in watched.items()}
    stop = True
    await asyncio.gather(*tasks)
    for producer in made:
        await producer.close()
    out = {
        "msg_per_s": round(count / elapsed, 1),
        "produce_p50_ms": round(pct(latencies, 0.5) * 1000, 2),
        "produce_p99_ms": round(pct(latencies, 0.99) * 1000, 2),
    }
    for name, cpu in spent.items():
        out[f"{name}_cpu_us_per_message"] = round(cpu / max(1, count) * 1e6, 1)
    return out


async def cpu_per_message(
    procs: Procs, etcd: str, config: Path, url: str, broker: asyncio.subprocess.Process,
    duration: float, producers: int = 32,
) -> dict[str, Any]:  # fmt: skip
    """CPU per non-reliable 1 KiB message of the broker reached directly and of a gateway
    in front of it (process CPU over the measured run ÷ messages; the clients run here, in
    another process)."""
    gateway = await procs.start(
        ["-m", "ballast.cli.main", "gateway", "--etcd", etcd, "--config", str(config),
         "--listen", "127.0.0.1:0", "--log-level", "ERROR"],
        "GATEWAY-STARTED",
    )  # fmt: skip
    address = procs.ready[gateway.pid].split()[1]
    broker_proc, gateway_proc = psutil.Process(broker.pid), psutil.Process(gateway.pid)
    direct = await throughput(
        url, "/default/cpu-direct", producers, False, duration, watch={"broker": broker_proc}
    )
    through = await throughput(
        address, "/default/cpu-gateway", producers, False, duration,
        watch={"broker": broker_proc, "gateway": gateway_proc},
    )  # fmt: skip
    return {
        "producers": producers,
        "broker_cpu_us_per_message": direct["broker_cpu_us_per_message"],
        "gateway_cpu_us_per_message": through["gateway_cpu_us_per_message"],
        "direct": direct,
        "through_gateway": through,
    }


JSON_DOC = json.dumps(
    {"id": 12345, "name": "order", "tags": ["a", "b", "c"], "amount": 9.5, "note": "x" * 900}
).encode()
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "name": {"type": "string", "maxLength": 64},
        "tags": {"type": "array", "items": {"type": "string"}},
        "amount": {"type": "number"},
        "note": {"type": "string", "maxLength": 4096},
    },
    "required": ["id", "name"],
}


async def check_cost_us(n: int = 20_000) -> float:
    """The broker's schema check of one message (enforce, cached binding), in µs: what
    validation adds to each send, measured in this process without the network's noise."""
    from ballast.broker.metrics import DataPlaneMetrics
    from ballast.clock import SystemClock
    from ballast.metadata.memory import MemoryStore
    from ballast.model import TopicName
    from ballast.registry.service import SchemaStore, TopicSchemas, send_check

    clock = SystemClock()
    schemas = SchemaStore(MemoryStore(), clock)
    await schemas.register("bench", "json_schema", json.dumps(JSON_SCHEMA).encode())
    await schemas.configure_topic(TopicName.parse("/default/t"), "bench", "enforce", True)
    topics, metrics = TopicSchemas(schemas, clock), DataPlaneMetrics()
    message = pb.StreamMessage(payload=JSON_DOC, schema_id=1, schema_version=1)
    await send_check(topics, "/default/t", message, metrics)
    start = time.perf_counter()
    for _ in range(n):
        await send_check(topics, "/default/t", message, metrics)
    return round((time.perf_counter() - start) / n * 1e6, 2)


async def schema_cost(url: str, duration: float, rounds: int = 4) -> dict[str, Any]:
    """32 producers of JSON documents: no schema vs an enforced JSON Schema, alternately."""
    from danube import SchemaType

    client = await client_for(url)
    schema = client.schema()
    await (
        schema.register_schema("bench-orders")
        .with_type(SchemaType.JSON_SCHEMA)
        .with_schema_data(json.dumps(JSON_SCHEMA).encode())
        .execute()
    )
    await schema.configure_topic_schema("/default/bench-enforced", "bench-orders", "enforce")
    plain: list[float] = []
    enforced: list[float] = []
    for _ in range(rounds):
        plain.append((await throughput(url, "/default/bench-plain", 32, False, duration,
                                       JSON_DOC))["msg_per_s"])  # fmt: skip
        enforced.append((await throughput(url, "/default/bench-enforced", 32, False, duration,
                                          JSON_DOC, "bench-orders"))["msg_per_s"])  # fmt: skip
    no_schema, with_schema = statistics.median(plain), statistics.median(enforced)
    return {
        "producers": 32,
        "payload_bytes": len(JSON_DOC),
        "no_schema_msg_per_s": round(no_schema, 1),
        "enforced_json_schema_msg_per_s": round(with_schema, 1),
        "rounds": {"no_schema": plain, "enforced": enforced},
        # Medians of alternating rounds (a shared machine: single rounds vary a lot), and
        # the best round of each side.
        "validation_cost": round(1 - with_schema / no_schema, 3),
        "validation_cost_best_rounds": round(1 - max(enforced) / max(plain), 3),
        "broker_check_us_per_message": await check_cost_us(),
        "goal_cost_at_most": 0.15,
    }


async def end_to_end(url: str, topic: str, reliable: bool, rate: float, duration: float
                     ) -> dict[str, float]:  # fmt: skip
    """Send-to-receipt latency of a steady stream (one producer, one consumer)."""
    client = await client_for(url)
    builder = client.new_producer().with_topic(topic).with_name("e2e-p")
    if reliable:
        builder = builder.with_dispatch_strategy(DispatchStrategy.RELIABLE)
    producer = builder.build()
    await producer.create()
    consumer = (
        client.new_consumer().with_topic(topic).with_consumer_name("e2e-c")
        .with_subscription("e2e").with_subscription_type(SubType.EXCLUSIVE).build()
    )  # fmt: skip
    await consumer.subscribe()
    queue = await consumer.receive()
    latencies: list[float] = []
    total = int(rate * duration)

    async def receive() -> None:
        for _ in range(total):
            m = await queue.get()
            latencies.append(time.perf_counter() - float(m.attributes["t"]))
            await consumer.ack(m)

    receiver = asyncio.create_task(receive())
    start = time.perf_counter()
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await producer.send(PAYLOAD, {"t": repr(time.perf_counter())})
    async with asyncio.timeout(30):
        await receiver
    await consumer.close()
    await producer.close()
    return {
        "p50_ms": round(pct(latencies, 0.5) * 1000, 2),
        "p99_ms": round(pct(latencies, 0.99) * 1000, 2),
    }


async def moves(store: EtcdStore, url: str, count: int) -> dict[str, Any]:
    """Move a live reliable topic `count` times; the pauses producer and consumer see."""
    topic = "/default/bench-moves"
    admin = AdminClient(store)
    client = await client_for(url)
    producer = (
        client.new_producer().with_topic(topic).with_name("mv-p")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE).build()
    )  # fmt: skip
    await producer.create()
    consumer = (
        client.new_consumer().with_topic(topic).with_consumer_name("mv-c")
        .with_subscription("mv").with_subscription_type(SubType.EXCLUSIVE).build()
    )  # fmt: skip
    await consumer.subscribe()
    queue = await consumer.receive()
    sent_at: list[float] = []
    received_at: list[float] = []
    acked: set[int] = set()
    received: set[int] = set()
    stop = asyncio.Event()

    send_errors: list[str] = []

    async def produce() -> None:
        i = 0
        while not stop.is_set():
            try:
                await producer.send(str(i).encode())
            except grpc.aio.AioRpcError as exc:  # reaches the app: not acknowledged
                send_errors.append(f"{exc.code().name}: {exc.details()}")
                await asyncio.sleep(0.5)
            else:
                acked.add(i)
                sent_at.append(time.perf_counter())
            i += 1
            await asyncio.sleep(0.01)

    async def consume() -> None:
        while True:
            m = await queue.get()
            received.add(int(m.payload))
            received_at.append(time.perf_counter())
            await consumer.ack(m)

    def longest_gap(times: list[float], since: float) -> float:
        points = [since, *[t for t in times if t >= since]]
        return max((b - a for a, b in itertools.pairwise(points)), default=0.0)

    tasks = [asyncio.create_task(produce()), asyncio.create_task(consume())]
    producer_pauses: list[float] = []
    consumer_pauses: list[float] = []
    await asyncio.sleep(1.0)
    timeouts = 0
    for _ in range(count):
        view = await admin.view()
        owner = view.owner(topic)
        if owner is None:
            await asyncio.sleep(1.0)
            continue
        t0 = time.perf_counter()
        await admin.unload_topic(topic)
        # Wait until both sides made progress on the new owner.
        try:
            async with asyncio.timeout(60):
                while True:
                    await asyncio.sleep(0.05)
                    new = (await admin.view()).owner(topic)
                    if new is not None and new != owner:
                        break
                t_assigned = time.perf_counter()
                while not (
                    any(t > t_assigned for t in sent_at)
                    and any(t > t_assigned for t in received_at)
                ):
                    await asyncio.sleep(0.05)
        except TimeoutError:
            timeouts += 1
        await asyncio.sleep(0.5)
        producer_pauses.append(longest_gap(sent_at, t0))
        consumer_pauses.append(longest_gap(received_at, t0))
    stop.set()
    await tasks[0]
    deadline = time.perf_counter() + 20
    while not acked <= received and time.perf_counter() < deadline:
        await asyncio.sleep(0.1)
    tasks[1].cancel()
    await consumer.close()
    await producer.close()

    def summary(pauses: list[float]) -> dict[str, float]:
        return {
            "p50_s": round(pct(pauses, 0.5), 3),
            "p99_s": round(pct(pauses, 0.99), 3),
            "max_s": round(max(pauses, default=0.0), 3),
        }

    return {
        "moves": count,
        "producer_pause": summary(producer_pauses),
        "consumer_pause": summary(consumer_pauses),
        "acknowledged_sends": len(acked),
        "lost": len(acked - received),
        "send_errors": len(send_errors),
        "first_send_errors": send_errors[:3],
        "moves_timed_out": timeouts,
    }


# -- acknowledgement modes -----------------------------------------------------------------


async def start_moto() -> tuple[asyncio.subprocess.Process, str]:
    """moto's S3 server in its own process (a real HTTP endpoint) with one bucket."""
    import boto3

    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="bench", aws_secret_access_key="bench",
    )  # fmt: skip
    async with asyncio.timeout(60):
        while True:
            try:
                await asyncio.to_thread(client.create_bucket, Bucket="bench")
                return proc, endpoint
            except Exception:  # not listening yet
                await asyncio.sleep(0.2)


def object_writes(metrics_url: str) -> float:
    """The broker's count of objects written to the object store so far."""
    import urllib.request

    with urllib.request.urlopen(metrics_url, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("ballast_storage_objects_uploaded_total "):
                return float(line.split()[1])
    return 0.0


async def ack_modes(
    procs: Procs, tmp: Path, duration: float, counts: tuple[int, ...] = COUNTS
) -> dict[str, Any]:
    """Reliable produce with `storage.ack` durable and local, side by side, with the object
    store a local directory and moto's S3 server: one fresh broker (and etcd) per setting."""
    moto, endpoint = await start_moto()
    procs.procs.append(moto)
    s3_options = {
        "key": "bench",
        "secret": "bench",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }
    stores: dict[str, dict[str, Any]] = {
        "directory": {"object_store": str(tmp / "ack-objects")},
        "s3": {"object_store": "s3://bench/objects", "object_store_options": s3_options},
    }
    out: dict[str, Any] = {}
    for backend, storage in stores.items():
        for mode in ("durable", "local"):
            broker_id = f"ack-{backend}-{mode}"
            metrics_port = free_port()
            config = write_config(
                tmp / f"{broker_id}.yaml",
                {"data_dir": str(tmp / broker_id), "ack": mode, **storage},
                metrics={"enabled": True, "port": metrics_port},
            )
            with EtcdServer() as server:
                async with EtcdStore(server.client_url) as store:
                    proc = await start_broker(procs, server.client_url, config, broker_id)
                    url = await broker_url(store, broker_id)
                    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
                    results: dict[str, Any] = {}
                    for n in counts:
                        written = await asyncio.to_thread(object_writes, metrics)
                        began = time.perf_counter()
                        result = await throughput(
                            url, f"/default/ack-{mode}-{n}", n, True, duration
                        )
                        elapsed = time.perf_counter() - began
                        written = await asyncio.to_thread(object_writes, metrics) - written
                        result["object_writes_per_s"] = round(written / elapsed, 1)
                        results[str(n)] = result
                    out.setdefault(backend, {})[mode] = results
                    proc.terminate()
                    await proc.wait()
        durable, local = out[backend]["durable"]["32"], out[backend]["local"]["32"]
        out[backend]["durable_share_of_local_32"] = round(
            durable["msg_per_s"] / local["msg_per_s"], 3
        )
    return out


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def slow_consumer_run(url: str, pid: int, topic: str, idle: bool, duration: float
                            ) -> dict[str, float]:  # fmt: skip
    """32 producers; one reading subscription; with `idle`, one that never reads."""
    client = await client_for(url)
    await client.new_producer().with_topic(topic).with_name("seed").build().create()
    consumer = (
        client.new_consumer().with_topic(topic).with_consumer_name("reader")
        .with_subscription("reads").with_subscription_type(SubType.EXCLUSIVE).build()
    )  # fmt: skip
    await consumer.subscribe()
    queue = await consumer.receive()
    if idle:
        async with grpc.aio.insecure_channel(url) as channel:
            await pb_grpc.ConsumerServiceStub(channel).Subscribe(
                pb.ConsumerRequest(topic_name=topic, consumer_name="idle",
                                   subscription="never", subscription_type=0)
            )  # fmt: skip
    received = 0
    peak = rss_bytes(pid)
    done = False

    async def drain() -> None:
        nonlocal received
        while True:
            await queue.get()
            received += 1

    async def sample() -> None:
        nonlocal peak
        while not done:
            peak = max(peak, rss_bytes(pid))
            await asyncio.sleep(0.2)

    tasks = [asyncio.create_task(drain()), asyncio.create_task(sample())]
    began = time.perf_counter()
    sent = await throughput(url, topic, 32, False, duration)
    elapsed = time.perf_counter() - began
    done = True
    for task in tasks:
        task.cancel()
    await consumer.close()
    return {
        "sent_msg_per_s": sent["msg_per_s"],
        "received_msg_per_s": round(received / elapsed, 1),
        "rss_peak_mib": round(peak / 2**20, 1),
    }


async def slow_consumer(args: argparse.Namespace) -> dict[str, Any]:
    budget = 16 * 1024 * 1024
    tmp = Path(tempfile.mkdtemp(prefix="bench-slow-"))
    procs = Procs(tmp / "logs")
    config = write_config(
        tmp / "broker.yaml",
        {"data_dir": str(tmp / "data")},
        data_plane={"subscription_buffer_bytes": budget},
    )
    out: dict[str, Any] = {"payload_bytes": len(PAYLOAD), "duration_s": args.duration,
                           "subscription_buffer_bytes": budget}  # fmt: skip
    try:
        async with etcd_for(procs) as server, EtcdStore(server.client_url) as store:
            proc = await start_broker(procs, server.client_url, config, "slow-1")
            url = await broker_url(store, "slow-1")
            out["rss_start_mib"] = round(rss_bytes(proc.pid) / 2**20, 1)
            out["without_idle_subscription"] = await slow_consumer_run(
                url, proc.pid, "/default/slow-a", False, args.duration
            )
            out["with_idle_subscription"] = await slow_consumer_run(
                url, proc.pid, "/default/slow-b", True, args.duration
            )
    finally:
        await procs.close()
    without = out["without_idle_subscription"]["received_msg_per_s"]
    with_idle = out["with_idle_subscription"]["received_msg_per_s"]
    out["reader_rate_ratio"] = round(with_idle / without, 3) if without else 0.0
    out["rss_growth_with_idle_mib"] = round(
        out["with_idle_subscription"]["rss_peak_mib"]
        - out["without_idle_subscription"]["rss_peak_mib"], 1
    )  # fmt: skip
    out["load_average"] = [round(x, 1) for x in os.getloadavg()]
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"payload_bytes": len(PAYLOAD), "duration_s": args.duration}
    tmp = Path(tempfile.mkdtemp(prefix="bench-dataplane-"))
    procs = Procs(tmp / "logs")
    config = write_config(tmp / "broker.yaml", {"data_dir": str(tmp / "data")})
    try:
        if args.only_ack_modes:
            out["ack_modes"] = await ack_modes(procs, tmp, args.duration, args.producers)
            return out
        # The ceiling: the same client against a server that does nothing.
        if not args.only_cpu:
            port = free_port()
            await procs.start([__file__, "--noop-server", str(port)], "NOOP-STARTED")
            noop = f"127.0.0.1:{port}"
            out["ceiling_msg_per_s"] = {
                str(n): (await throughput(noop, "/default/noop", n, False, args.duration))[
                    "msg_per_s"
                ]
                for n in (args.producers if not args.only_schemas else (32,))
            }
        async with etcd_for(procs) as server, EtcdStore(server.client_url) as store:
            broker = await start_broker(procs, server.client_url, config, "bench-1")
            url = await broker_url(store, "bench-1")
            if args.only_cpu or not args.only_schemas:
                cpu = await cpu_per_message(
                    procs, server.client_url, config, url, broker, args.duration
                )
                out["broker_cpu_us_per_message"] = cpu["broker_cpu_us_per_message"]
                out["gateway_cpu_us_per_message"] = cpu["gateway_cpu_us_per_message"]
                out["cpu_per_message"] = cpu
                if args.only_cpu:
                    return out
            out["schema_validation_32_producers"] = await schema_cost(
                url, args.duration, args.schema_rounds
            )
            if not args.only_schemas:
                for reliable in (False, True):
                    key = "reliable" if reliable else "non_reliable"
                    out[key] = {}
                    for n in args.producers:
                        topic = f"/default/bench-{key.replace('_', '-')}-{n}"
                        out[key][str(n)] = await throughput(url, topic, n, reliable, args.duration)
                out["end_to_end"] = {
                    key: await end_to_end(
                        url,
                        f"/default/e2e-{key.replace('_', '-')}",
                        key == "reliable",
                        200,
                        args.e2e_seconds,
                    )
                    for key in ("non_reliable", "reliable")
                }
                out["ack_modes"] = await ack_modes(procs, tmp, args.duration, args.producers)
                if args.moves:
                    await start_broker(procs, server.client_url, config, "bench-2")
                    out["moves"] = await moves(store, url, args.moves)
    finally:
        await procs.close()
    out["load_average"] = [round(x, 1) for x in os.getloadavg()]  # a shared machine
    if args.only_schemas or args.only_cpu:
        return out
    ceiling = out["ceiling_msg_per_s"]["32"]
    out["goals_32_producers"] = {
        "non_reliable_share_of_ceiling": round(out["non_reliable"]["32"]["msg_per_s"] / ceiling, 3),
        "reliable_share_of_ceiling": round(out["reliable"]["32"]["msg_per_s"] / ceiling, 3),
    }
    return out


def counts(text: str) -> tuple[int, ...]:
    """`--producers`: comma-separated counts, 32 among them (the goals compare at 32)."""
    found = tuple(sorted({int(n) for n in text.split(",") if n.strip()}))
    if 32 not in found or min(found) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: positive counts, 32 among them")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--moves", type=int, default=20, help="moves of a live topic (0: skip)")
    parser.add_argument(
        "--producers",
        type=counts,
        default=COUNTS,
        help="comma-separated producer counts of the throughput runs (32 among them)",
    )
    parser.add_argument("--schema-rounds", type=int, default=4, help="rounds of each side")
    parser.add_argument(
        "--e2e-seconds", type=float, default=3.0, help="end-to-end stream (at 200 msg/s)"
    )
    parser.add_argument(
        "--only-schemas",
        action="store_true",
        help="only the schema-validation comparison (and the ceiling)",
    )
    parser.add_argument(
        "--only-ack-modes",
        action="store_true",
        help="only reliable produce in both storage.ack modes (directory and S3 object store)",
    )
    parser.add_argument(
        "--only-cpu",
        action="store_true",
        help="only the CPU per non-reliable message of a broker and of a gateway",
    )
    parser.add_argument(
        "--slow-consumer",
        action="store_true",
        help="only the slow-consumer run: broker memory and the other subscription's rate",
    )
    parser.add_argument("--noop-server", type=int, default=None, help=argparse.SUPPRESS)
    args = parse_args(
        parser,
        quick={
            "duration": 0.2, "producers": (32,), "moves": 1, "schema_rounds": 1,
            "e2e_seconds": 0.3,
        },
    )  # fmt: skip
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("danube").setLevel(logging.CRITICAL)
    if args.noop_server is not None:
        asyncio.run(run_noop_server(args.noop_server))
        return
    run = slow_consumer if args.slow_consumer else main_async
    emit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
