"""Running brokers: one broker process (`serve_broker`) and an in-process cluster.

A broker process is three services sharing one metrics registry: `BrokerNode` (its topics),
`LeaderElection` (campaigning) and `LoadManager` (acting while elected). `LocalCluster`
runs several of them in one event loop over a shared store, for tests, benchmarks and the
demo; `kill_broker` abandons a broker without any clean-up, so the rest of the cluster
only learns of its death when its leases expire, as after a SIGKILL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from ballast.aio import TaskOwner
from ballast.broker.host import DataPlaneHost
from ballast.clock import Clock
from ballast.cluster.broker import BrokerNode
from ballast.cluster.election import LeaderElection
from ballast.cluster.host import HostSampler, ProfileFn, SyntheticHost, TopicHost, idle_profiles
from ballast.cluster.load_manager import LoadManager
from ballast.cluster.metrics import ClusterMetrics
from ballast.cluster.resources import ResourceSampler
from ballast.config import BallastConfig
from ballast.load_history import HistoryWriter
from ballast.metadata import MetadataStore
from ballast.model import BrokerId

log = logging.getLogger(__name__)


@dataclass
class BrokerProcess:
    """The services of one broker, built but not yet started."""

    broker_id: BrokerId
    host: TopicHost
    node: BrokerNode
    election: LeaderElection
    manager: LoadManager
    metrics: ClusterMetrics
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    crashed: BaseException | None = None

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    def abandon(self) -> None:
        """Make every service exit without clean-up (a simulated crash)."""
        for service in (self.manager, self.election, self.node):
            service.abandon()

    async def run(self) -> None:
        """Serve until `stop` is set (graceful) or the task is cancelled."""
        async with self.node, self.election, self.manager:
            self.started.set()
            await self.stop.wait()


def build_broker(
    store: MetadataStore,
    clock: Clock,
    config: BallastConfig,
    broker_id: BrokerId,
    host: TopicHost,
    *,
    sampler: ResourceSampler | None = None,
    history_dir: str | Path | None = None,
    metrics: ClusterMetrics | None = None,
) -> BrokerProcess:
    """Wire the services of one broker. `history_dir` enables the leader's load history."""
    metrics = metrics if metrics is not None else ClusterMetrics(broker_id)
    node = BrokerNode(store, clock, host, config, broker_id, sampler=sampler, metrics=metrics)
    if isinstance(host, DataPlaneHost):
        host.release = node.release_topic  # a topic whose WAL failed goes back to the leader
    election = LeaderElection(
        store, clock, broker_id, config.broker.leader_ttl_seconds, metrics=metrics
    )
    sink = HistoryWriter(history_dir, writer=f"leader-{broker_id}") if history_dir else None
    manager = LoadManager(store, clock, config, election, metrics=metrics, sink=sink)
    return BrokerProcess(broker_id, host, node, election, manager, metrics)


HostFactory = Callable[[BrokerId], SyntheticHost]


class LocalCluster:
    """Brokers in this event loop, over one shared store, with synthetic hosts."""

    def __init__(
        self,
        store: MetadataStore,
        clock: Clock,
        config: BallastConfig,
        *,
        profiles: ProfileFn = idle_profiles,
        synthetic_resources: bool = True,
        history_dir: str | Path | None = None,
        start_timeout: float = 10.0,
    ) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.profiles = profiles
        self.synthetic_resources = synthetic_resources
        self.history_dir = history_dir
        self.start_timeout = start_timeout
        self.brokers: dict[BrokerId, BrokerProcess] = {}
        self._owner: TaskOwner | None = None

    async def __aenter__(self) -> Self:
        self._owner = TaskOwner("cluster")
        await self._owner.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for broker in list(self.brokers.values()):
            broker.stop.set()
        owner, self._owner = self._owner, None
        if owner is not None:
            # Graceful: every broker leaves on its own (topics sealed, leases revoked).
            await owner.close(exc_type, exc, tb, cancel=False)

    def host(self, broker_id: BrokerId) -> SyntheticHost:
        """The synthetic host of a broker started here."""
        host = self.brokers[broker_id].host
        assert isinstance(host, SyntheticHost)
        return host

    async def start_broker(self, broker_id: BrokerId) -> BrokerProcess:
        """Start one broker and wait until it has registered."""
        if self._owner is None:
            raise RuntimeError("LocalCluster: start_broker() outside of `async with`")
        host = SyntheticHost(broker_id, self.clock, self.profiles)
        sampler = HostSampler(host) if self.synthetic_resources else None
        process = build_broker(
            self.store,
            self.clock,
            self.config,
            broker_id,
            host,
            sampler=sampler,
            history_dir=self.history_dir,
        )
        self.brokers[broker_id] = process
        process.task = self._owner.spawn(self._run(process), broker_id)
        async with asyncio.timeout(self.start_timeout):
            await process.started.wait()
        return process

    async def _run(self, process: BrokerProcess) -> None:
        """Run one broker; a broker that crashes ends alone (logged), not the cluster."""
        try:
            await process.run()
        except Exception as exc:
            process.crashed = exc
            log.error("cluster: broker %s crashed", process.broker_id, exc_info=exc)

    async def stop_broker(self, broker_id: BrokerId) -> None:
        """Graceful stop: topics sealed, leases revoked, leadership handed over."""
        process = self.brokers.pop(broker_id)
        process.stop.set()
        if process.task is not None:
            await process.task

    async def kill_broker(self, broker_id: BrokerId) -> None:
        """Crash: no clean-up; the store notices only when the broker's leases expire."""
        process = self.brokers.pop(broker_id)
        process.abandon()
        if process.task is not None:
            process.task.cancel()
            # wait() never raises: our own cancellation still propagates, the broker's doesn't.
            await asyncio.wait({process.task})

    def leader(self) -> BrokerProcess | None:
        """The broker that currently leads, if any (as each broker believes)."""
        leaders = [b for b in self.brokers.values() if b.is_leader]
        return leaders[0] if leaders else None

    async def wait_leader(self, timeout: float = 10.0) -> BrokerProcess:
        """Wait until some broker leads and has bootstrapped its session."""
        async with asyncio.timeout(timeout):
            while True:
                leader = self.leader()
                session = leader.manager.session if leader is not None else None
                if leader is not None and session is not None and session.ready.is_set():
                    return leader
                await asyncio.sleep(0.01)
