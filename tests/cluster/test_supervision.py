"""The broker survives what goes wrong around it: failing host calls and a store outage.

Fake clock, MemoryStore: the test plays the leader by writing keys. The last test runs a
small cluster on the wall clock: a source that cannot seal is overruled by the leader.
"""

from __future__ import annotations

from typing import Any

import pytest

from ballast.clock import FakeClock
from ballast.cluster import AdminClient, BrokerNode, LocalCluster, SyntheticHost
from ballast.metadata import MetadataUnavailableError, keys
from ballast.metadata.memory import MemoryStore
from ballast.metadata.records import assignment_value
from ballast.model import Assignment, MarkerReason, UnassignedMarker
from tests.cluster.helpers import all_settled, fast_config, leading, wait_virtual

pytestmark = pytest.mark.timeout(30)


class FlakyHost(SyntheticHost):
    """Fails `load` of the topics in `failing` a given number of times, and every `unload`
    of the topics in `stuck`."""

    def __init__(self, *args: Any, failing: dict[str, int], stuck: set[str]) -> None:
        super().__init__(*args)
        self.failing = failing
        self.stuck = stuck

    async def load(self, topic: str, marker: UnassignedMarker | None) -> None:
        if self.failing.get(topic, 0) > 0:
            self.failing[topic] -= 1
            raise OSError(f"disk full while loading {topic}")
        await super().load(topic, marker)

    async def unload(self, topic: str, handoff: Any = None) -> Any:
        if topic in self.stuck:
            raise RuntimeError(f"seal of {topic} failed")
        return await super().unload(topic, handoff)


class FlakyStore(MemoryStore):
    """A MemoryStore whose listings fail while `down` is set (an etcd outage)."""

    down = False

    async def get_prefix(self, prefix: str, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise MetadataUnavailableError("etcd is unreachable")
        return await super().get_prefix(prefix, *args, **kwargs)


def errors(broker: BrokerNode, loop: str) -> float:
    return broker.metrics.sample("ballast_broker_loop_errors_total", {"loop": loop})


async def assign(store: MemoryStore, clock: FakeClock, broker: str, topic: str) -> None:
    value = assignment_value(Assignment(clock.now()), UnassignedMarker(timestamp=clock.now()))
    await store.put(keys.broker_assignment(broker, topic), value)


async def test_failing_host_calls_are_counted_retried_and_the_broker_keeps_serving() -> None:
    clock = FakeClock()
    async with FlakyStore(clock) as store:
        host = FlakyHost("b1", clock, failing={"/ns/bad": 2}, stuck={"/ns/stuck"})
        config = fast_config(ttl=10.0, report_interval=5.0)
        async with BrokerNode(store, clock, host, config, "b1", retry_delay=1.0) as broker:
            await clock.advance(0)
            for topic in ("/ns/bad", "/ns/good", "/ns/stuck"):
                await assign(store, clock, "b1", topic)
            await clock.advance(0)
            assert set(host.topics) == {"/ns/good", "/ns/stuck"}
            assert errors(broker, "load") == 1
            await clock.advance(1.0)  # the retry fails once more ...
            assert errors(broker, "load") == 2
            await clock.advance(1.0)  # ... then succeeds
            assert set(host.topics) == {"/ns/bad", "/ns/good", "/ns/stuck"}

            # A seal that fails: the marker is not set ready (the leader's timeout decides).
            marker = UnassignedMarker(MarkerReason.UNLOAD, from_broker="b1", ready=False)
            await store.put(keys.unassigned("/ns/stuck"), marker.to_dict())
            await store.delete(keys.broker_assignment("b1", "/ns/stuck"))
            await clock.advance(0)
            assert errors(broker, "unload") == 1
            kv = await store.get(keys.unassigned("/ns/stuck"))
            assert kv is not None and UnassignedMarker.from_dict(kv.value).ready is False
            assert "/ns/stuck" not in broker.serving

            # A store outage while the assignment loop lists again: counted, retried.
            store.down = True
            broker._resync.set()
            await clock.advance(0)
            assert errors(broker, "assignments") >= 1
            await clock.advance(1.0)
            store.down = False
            await clock.advance(1.0)
            await assign(store, clock, "b1", "/ns/late")
            await clock.advance(0)
            assert "/ns/late" in host.topics and "/ns/good" in host.topics


async def test_a_source_that_cannot_seal_is_overruled_after_the_seal_timeout() -> None:
    """End to end: b1's host fails every unload; the leader forces the move after
    `seal_timeout_seconds` and the new owner learns why (the forced reason). On a fake
    clock: the timeout is the point."""
    clock = FakeClock()
    config = fast_config(rebalancing={"enabled": False, "seal_timeout_seconds": 1.0})
    async with MemoryStore(clock) as store:
        admin = AdminClient(store, clock, config)
        async with LocalCluster(store, clock, config) as cluster:
            for broker in ("b1", "b2"):
                await cluster.start_broker(broker)
            await wait_virtual(clock, leading(cluster), 5, "a leader")
            await admin.create_topic("/ns/stuck", hint="b1")
            await wait_virtual(clock, all_settled(admin, 1), 10, "the topic assigned")

            async def cannot_seal(topic: str) -> Any:
                raise RuntimeError(f"the object store is down: cannot seal {topic}")

            cluster.host("b1").unload = cannot_seal  # type: ignore[method-assign]
            await admin.unload_topic("/ns/stuck")
            took = await wait_virtual(clock, all_settled(admin, 1), 10, "the move forced")
            assert took >= 1.0  # not before the seal timeout
            view = await admin.view()
            assert view.owner("/ns/stuck") == "b2"

            async def loaded() -> bool:
                return "/ns/stuck" in cluster.host("b2").topics

            await wait_virtual(clock, loaded, 5, "b2 loads the topic")
            marker = cluster.host("b2").topics["/ns/stuck"]
            assert marker is not None and marker.forced is not None
            assert marker.forced.startswith("[seal-timeout] b1 did not seal /ns/stuck")
            assert errors(cluster.brokers["b1"].node, "unload") == 1
            leader = cluster.leader()
            assert leader is not None
            assert leader.metrics.sample("ballast_rebalancing_forced_moves_total") == 1
