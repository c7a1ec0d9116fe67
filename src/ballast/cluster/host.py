"""What a broker does with the topics it owns: the `TopicHost` protocol and a synthetic host.

The broker tells its host to `load` a topic when an assignment reaches it and to `unload`
it when the assignment goes away (a graceful unload seals the topic and returns the sealed
state); `metrics()` feeds the load report. `SyntheticHost` gives each topic a traffic
profile and derives the broker's CPU and memory from its traffic, for the demo, tests and
benchmarks; the reliable-topic host (storage) serves real messages behind the same protocol.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ballast.clock import Clock
from ballast.cluster.resources import ResourceUsage
from ballast.model import BrokerId, TopicLoad, UnassignedMarker
from ballast.storage.reservation import Handoff
from ballast.storage.seal import SealedState


class TopicHost(Protocol):
    """A broker's topics. Calls for one topic never overlap (the broker serialises them)."""

    async def load(self, topic: str, marker: UnassignedMarker | None) -> None:
        """Start serving `topic`; `marker` says why it came here (None: unknown)."""
        ...

    async def unload(self, topic: str, handoff: Handoff | None = None) -> SealedState | None:
        """Stop serving `topic`, sealing it; None if there was nothing to seal. `handoff`'s
        writes go in the sealed state's transaction if the seal can take them (it then
        calls `handoff.written()`); otherwise the caller makes them itself.

        Raises `ballast.storage.SealError` when the topic was handed over unsealed (it is
        not served here any more; its acknowledged messages are in object storage).
        """
        ...

    def metrics(self) -> list[TopicLoad]:
        """Current traffic of every served topic."""
        ...


@dataclass(frozen=True)
class TrafficProfile:
    """A topic's synthetic traffic: a base rate with an optional slow sine wave."""

    msg_rate: float = 0.0
    msg_size: int = 1_000
    producers: int = 0
    consumers: int = 0
    subscriptions: int = 0
    backlog: int = 0
    wave: float = 0.0  # relative amplitude, 0..1
    period_seconds: float = 300.0

    def at(self, topic: str, now: float) -> TopicLoad:
        """The topic's load at `now`."""
        factor = 1.0
        if self.wave > 0 and self.period_seconds > 0:
            phase = _unit(topic, "phase") * 2 * math.pi
            factor = 1.0 + self.wave * math.sin(2 * math.pi * now / self.period_seconds + phase)
        rate = max(0.0, self.msg_rate * factor)
        return TopicLoad(
            topic=topic,
            msg_rate=rate,
            byte_rate=rate * self.msg_size,
            producers=self.producers,
            consumers=self.consumers,
            subscriptions=self.subscriptions,
            backlog=self.backlog,
        )


ProfileFn = Callable[[str], TrafficProfile]

IDLE = TrafficProfile()

# Light, medium and heavy topics, as a messaging cluster typically has (many small ones).
MIXED = (
    (0.6, TrafficProfile(msg_rate=50, msg_size=500, producers=1, consumers=1, subscriptions=1)),
    (
        0.3,
        TrafficProfile(
            msg_rate=500, msg_size=1_000, producers=2, consumers=3, subscriptions=2, wave=0.2
        ),
    ),
    (
        0.1,
        TrafficProfile(
            msg_rate=3_000,
            msg_size=2_000,
            producers=4,
            consumers=6,
            subscriptions=3,
            backlog=20_000,
            wave=0.3,
        ),
    ),
)


def _unit(topic: str, salt: str) -> float:
    """A stable pseudo-random number in [0, 1) derived from the topic name."""
    digest = hashlib.blake2b(f"{salt}:{topic}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def idle_profiles(topic: str) -> TrafficProfile:
    """Every topic idle (placement then depends on topic counts only)."""
    return IDLE


def mixed_profiles(topic: str) -> TrafficProfile:
    """A stable light/medium/heavy mix, chosen by the topic name."""
    u = _unit(topic, "class")
    for share, profile in MIXED:
        if u < share:
            return profile
        u -= share
    return MIXED[-1][1]


class SyntheticHost:
    """Serves topics in name only: traffic comes from profiles, unloads seal instantly.

    It records every call (`events`), so shell tests can check what the broker asked for.
    Resources are synthetic too (`resources()`): CPU grows with throughput and connections,
    memory with topics and backlog, so strategies that look at resources see the traffic.
    """

    def __init__(
        self,
        broker_id: BrokerId,
        clock: Clock,
        profiles: ProfileFn = idle_profiles,
        *,
        base_cpu: float = 2.0,
        base_memory: float = 5.0,
    ) -> None:
        self.broker_id = broker_id
        self.clock = clock
        self.profiles = profiles
        self.base_cpu = base_cpu
        self.base_memory = base_memory
        self.topics: dict[str, UnassignedMarker | None] = {}
        self.events: list[tuple[str, str]] = []
        self._offsets: dict[str, int] = {}

    async def load(self, topic: str, marker: UnassignedMarker | None) -> None:
        self.topics[topic] = marker
        self.events.append(("load", topic))

    async def unload(self, topic: str, handoff: Handoff | None = None) -> SealedState | None:
        if topic not in self.topics:
            return None
        del self.topics[topic]
        self.events.append(("unload", topic))
        offset = self._offsets.get(topic, -1)
        return SealedState(True, offset, self.broker_id, self.clock.now())

    def metrics(self) -> list[TopicLoad]:
        now = self.clock.now()
        return [self.profiles(t).at(t, now) for t in sorted(self.topics)]

    def resources(self) -> ResourceUsage:
        """Synthetic usage derived from the served traffic."""
        loads = self.metrics()
        mbps = sum(t.byte_rate for t in loads) / 1e6
        connections = sum(t.connections for t in loads)
        backlog = sum(t.backlog for t in loads)
        # Scaled so a few hundred mixed topics keep a handful of brokers well below 100 %.
        cpu = self.base_cpu + 0.5 * mbps + 0.05 * connections
        memory = self.base_memory + 0.02 * len(loads) + backlog / 100_000
        return ResourceUsage(
            cpu_percent=min(100.0, cpu),
            memory_percent=min(100.0, memory),
            disk_io_bps=0.0,
            network_io_bps=mbps * 2e6,
        )


class HostSampler:
    """A `ResourceSampler` reading a synthetic host's resources."""

    def __init__(self, host: SyntheticHost) -> None:
        self.host = host

    def sample(self) -> ResourceUsage:
        return self.host.resources()
