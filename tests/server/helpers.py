"""Brokers with a data plane, in this process, on a real etcd; and the real client.

`DataCluster` starts brokers the way ``ballast broker`` does (BrokerNode, election and
leader, plus a `DataPlaneServer` on a free port) in this event loop; tests drive them
with the published `danube-client`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from danube import DanubeClientBuilder, DispatchStrategy, SubType

from ballast.broker import DataPlaneHost, DataPlaneServer
from ballast.broker.metrics import DataPlaneMetrics
from ballast.clock import SystemClock
from ballast.cluster.cluster import BrokerProcess, build_broker
from ballast.cluster.metrics import ClusterMetrics
from ballast.config import BallastConfig, parse_config
from ballast.metadata import MetadataStore, keys
from ballast.metadata.directory import DEFAULT_NAMESPACE
from ballast.storage import FsspecObjectStore, ObjectStore
from ballast.storage.objects import StoredObject

__all__ = [
    "DataBroker",
    "DataCluster",
    "DispatchStrategy",
    "SubType",
    "data_config",
    "new_client",
    "wait_until",
    "wipe",
]


async def wipe(store: MetadataStore) -> None:
    """Remove every key the cluster and the data plane use."""
    for prefix in (
        keys.CLUSTER_PREFIX,
        keys.TOPICS_PREFIX,
        keys.STORAGE_PREFIX,
        keys.NAMESPACES_PREFIX,
        keys.SCHEMAS_PREFIX,
        keys.POLICIES_PREFIX,
        keys.PRESSURE_PREFIX,
    ):
        await store.delete_prefix(prefix)
    await store.delete(keys.OBJECT_STORE)  # each test has its own object store


def data_config(
    data_dir: Path,
    *,
    rebalancing: Mapping[str, Any] | None = None,
    data_plane: Mapping[str, Any] | None = None,
    ttl: float = 10.0,
) -> BallastConfig:
    """Short intervals; storage under `data_dir`; brokers on free ports."""
    return parse_config(
        {
            "load_manager": {
                "load_report_interval_seconds": 0.5,
                "assignment_strategy": "fair",
                "rebalancing": dict(rebalancing or {"enabled": False}),
            },
            "broker": {
                "registration_ttl_seconds": ttl,
                "leader_ttl_seconds": ttl,
                "broker_url": "127.0.0.1:0",
            },
            "history": {"enabled": False},
            "metrics": {"enabled": False},
            "storage": {"data_dir": str(data_dir), "upload_interval_seconds": 1.0},
            "data_plane": dict(data_plane or {}),
        }
    )


async def wait_until(
    check: Callable[[], Awaitable[bool]], timeout: float, what: str, interval: float = 0.05
) -> float:
    """Poll `check` until true; the seconds it took. Fails naming `what` on timeout."""
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
    return time.monotonic() - start


@dataclass
class DataBroker:
    """One broker of a `DataCluster`."""

    broker_id: str
    host: DataPlaneHost
    server: DataPlaneServer
    process: BrokerProcess
    task: asyncio.Task[None]

    @property
    def url(self) -> str:
        return self.server.url


def relays(broker: DataBroker) -> float:
    """Consumers `broker` relayed from the new owner of a topic that moved away."""
    registry = broker.host.counters.registry
    return registry.get_sample_value("ballast_dataplane_consumer_relays_total") or 0.0


def handovers(broker: DataBroker, step: str) -> tuple[float, float]:
    """(count, seconds in all) of `broker`'s move steps: ``seal`` or ``open``."""
    registry = broker.host.counters.registry
    name, labels = "ballast_dataplane_topic_handover_seconds", {"step": step}
    count = registry.get_sample_value(f"{name}_count", labels) or 0.0
    return count, registry.get_sample_value(f"{name}_sum", labels) or 0.0


class DataCluster:
    """Brokers with a data plane in this event loop, over one store."""

    def __init__(
        self, store: MetadataStore, config: BallastConfig, objects: ObjectStore | None = None
    ) -> None:
        self.store = store
        self.config = config
        self.objects = objects  # the brokers' shared object store (default: the config's)
        self.clock = SystemClock()
        self.brokers: dict[str, DataBroker] = {}

    async def start_broker(self, broker_id: str) -> DataBroker:
        metrics = ClusterMetrics(broker_id)
        host = DataPlaneHost(
            broker_id,
            self.store,
            self.clock,
            self.config,
            metrics=DataPlaneMetrics(metrics.registry),
            objects=self.objects,
        )
        server = DataPlaneServer(host, self.config, self.config.broker.broker_url, grace=0.2)
        url = await server.start()
        config = self.config.model_copy(
            update={"broker": self.config.broker.model_copy(update={"broker_url": url})}
        )
        await host.directory.ensure_namespace(DEFAULT_NAMESPACE)
        process = build_broker(self.store, self.clock, config, broker_id, host, metrics=metrics)
        task = asyncio.create_task(process.run(), name=f"test/{broker_id}")
        async with asyncio.timeout(15):
            await process.started.wait()
        broker = DataBroker(broker_id, host, server, process, task)
        self.brokers[broker_id] = broker
        return broker

    async def stop_broker(self, broker_id: str) -> None:
        broker = self.brokers.pop(broker_id)
        broker.process.stop.set()
        await broker.task
        await broker.server.stop()

    def owner(self, topic: str) -> DataBroker | None:
        for broker in self.brokers.values():
            if topic in broker.host.topics:
                return broker
        return None

    async def wait_served(self, topic: str, timeout: float = 15) -> DataBroker:
        async def served() -> bool:
            return self.owner(topic) is not None

        await wait_until(served, timeout, f"{topic} to be served")
        owner = self.owner(topic)
        assert owner is not None
        return owner

    async def wait_moved(self, topic: str, source: DataBroker, timeout: float = 15) -> DataBroker:
        """The broker serving `topic` once it is served by another than `source` (a send
        right after an unload may still reach the source: the move is not done then)."""

        async def moved() -> bool:
            return self.owner(topic) not in (None, source)

        await wait_until(moved, timeout, f"{topic} to move off {source.broker_id}")
        owner = self.owner(topic)
        assert owner is not None
        return owner

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for broker_id in list(self.brokers):
            await self.stop_broker(broker_id)


async def new_client(url: str) -> Any:
    """A real `danube-client` seeded with `url`."""
    return await DanubeClientBuilder().service_url(f"http://{url}").build()


class GatedObjects:
    """An object store whose writes wait while `gate` is closed (a stalled upload)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.gate.set()

    @classmethod
    def of(cls, config: BallastConfig) -> GatedObjects:
        """Over the object store `config` names (the one its brokers would use)."""
        storage = config.storage
        return cls(
            FsspecObjectStore(storage.object_store_url(), dict(storage.object_store_options))
        )

    @property
    def url(self) -> str:
        return self.inner.url

    async def put(self, name: str, data: bytes) -> None:
        await self.gate.wait()
        await self.inner.put(name, data)

    async def get(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        return await self.inner.get(name, start, end)

    async def delete(self, name: str) -> None:
        await self.inner.delete(name)

    async def list(self, prefix: str) -> list[StoredObject]:
        return await self.inner.list(prefix)
