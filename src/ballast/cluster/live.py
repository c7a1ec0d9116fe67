"""`LiveCluster`: in-process brokers that carry synthetic load *and* real messages.

The demo needs many topics with varied load (synthetic, cheap) and a few topics with real
producers and consumers (the data plane, Danube's client protocol). `MixedHost` serves
topics of the `real` namespaces with a `DataPlaneHost` (reliable storage, gRPC on a free
port) and every other topic with a `SyntheticHost`. `kill_broker` crashes the data plane
too: the gRPC server drops its connections at once and reliable topics stop without a
seal, keeping their offset reservation, as after a SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from types import TracebackType

from ballast.broker import DataPlaneHost, DataPlaneServer
from ballast.broker.topics import ReliableServedTopic
from ballast.clock import Clock
from ballast.cluster.cluster import BrokerProcess, LocalCluster, build_broker
from ballast.cluster.host import HostSampler, ProfileFn, SyntheticHost, idle_profiles
from ballast.config import BallastConfig
from ballast.metadata import MetadataStore
from ballast.metadata.directory import DEFAULT_NAMESPACE
from ballast.model import BrokerId, TopicLoad, UnassignedMarker, topic_namespace
from ballast.storage import Handoff, SealedState

__all__ = ["LiveCluster", "MixedHost"]

log = logging.getLogger(__name__)


class MixedHost:
    """Real topics (namespaces in `real`) on a data plane, the others synthetic."""

    def __init__(self, synthetic: SyntheticHost, data: DataPlaneHost, real: frozenset[str]) -> None:
        self.synthetic = synthetic
        self.data = data
        self.real = real

    def _is_real(self, topic: str) -> bool:
        return topic_namespace(topic) in self.real

    async def load(self, topic: str, marker: UnassignedMarker | None) -> None:
        host = self.data if self._is_real(topic) else self.synthetic
        await host.load(topic, marker)

    async def unload(self, topic: str, handoff: Handoff | None = None) -> SealedState | None:
        if self._is_real(topic):
            return await self.data.unload(topic, handoff)
        return await self.synthetic.unload(topic, handoff)

    def metrics(self) -> list[TopicLoad]:
        return [*self.synthetic.metrics(), *self.data.metrics()]


class LiveCluster(LocalCluster):
    """A `LocalCluster` whose brokers also serve real topics of `real_namespaces`."""

    def __init__(
        self,
        store: MetadataStore,
        clock: Clock,
        config: BallastConfig,
        *,
        data_dir: str | Path,
        real_namespaces: frozenset[str] = frozenset({DEFAULT_NAMESPACE}),
        profiles: ProfileFn = idle_profiles,
        synthetic_resources: bool = True,
    ) -> None:
        storage = config.storage.model_copy(update={"data_dir": str(data_dir)})
        broker = config.broker.model_copy(update={"broker_url": "127.0.0.1:0"})
        config = config.model_copy(update={"storage": storage, "broker": broker})
        super().__init__(
            store, clock, config, profiles=profiles, synthetic_resources=synthetic_resources
        )
        self.real_namespaces = real_namespaces
        self.servers: dict[BrokerId, DataPlaneServer] = {}

    async def start_broker(self, broker_id: BrokerId) -> BrokerProcess:
        """Start a broker with its data plane; it registers its real address."""
        if self._owner is None:
            raise RuntimeError("LiveCluster: start_broker() outside of `async with`")
        synthetic = SyntheticHost(broker_id, self.clock, self.profiles)
        data = DataPlaneHost(broker_id, self.store, self.clock, self.config)
        server = DataPlaneServer(data, self.config, "127.0.0.1:0", grace=0.2)
        url = await server.start()
        self.servers[broker_id] = server
        config = self.config.model_copy(
            update={"broker": self.config.broker.model_copy(update={"broker_url": url})}
        )
        for namespace in self.real_namespaces:
            await data.directory.ensure_namespace(namespace)
        process = build_broker(
            self.store,
            self.clock,
            config,
            broker_id,
            MixedHost(synthetic, data, self.real_namespaces),
            sampler=HostSampler(synthetic) if self.synthetic_resources else None,
        )
        self.brokers[broker_id] = process
        process.task = self._owner.spawn(self._run(process), broker_id)
        async with asyncio.timeout(self.start_timeout):
            await process.started.wait()
        return process

    def data_host(self, broker_id: BrokerId) -> DataPlaneHost:
        host = self.brokers[broker_id].host
        assert isinstance(host, MixedHost)
        return host.data

    async def kill_broker(self, broker_id: BrokerId) -> None:
        """Crash: connections drop, reliable topics stop unsealed, leases are left to expire."""
        server = self.servers.pop(broker_id, None)
        host = self.brokers[broker_id].host
        if server is not None:
            await server.stop_now()
        if isinstance(host, MixedHost):
            for served in list(host.data.topics.values()):
                if isinstance(served, ReliableServedTopic):
                    with contextlib.suppress(Exception):
                        await served.storage.close(release_reservation=False)
            host.data.topics.clear()
        await super().kill_broker(broker_id)

    async def stop_broker(self, broker_id: BrokerId) -> None:
        await super().stop_broker(broker_id)
        server = self.servers.pop(broker_id, None)
        if server is not None:
            await server.stop()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await super().__aexit__(exc_type, exc, tb)
        finally:
            for server in self.servers.values():
                with contextlib.suppress(Exception):
                    await server.stop()
            self.servers.clear()
