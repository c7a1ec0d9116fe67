"""The data-plane host's background work: owned from `start` to `stop`, and a sweep that
outlives a metadata-store outage (it used to end for good at the first failure, and with
it every retry of a topic whose opening had failed)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from ballast.broker import host as host_module
from ballast.broker.host import DISPATCH_KEY, RELIABLE, DataPlaneHost
from ballast.broker.service import DataPlaneService
from ballast.clock import FakeClock
from ballast.metadata import MemoryStore, keys
from ballast.metadata.store import KeyValue, Listing, MetadataUnavailableError
from ballast.model import TopicName
from ballast.wire.protocol import pb
from tests.server.helpers import data_config
from tests.storage.helpers import eventually


class CutStore(MemoryStore):
    """A memory store whose reads and writes fail while `down` (an etcd outage)."""

    down = False

    def _check(self) -> None:
        if self.down:
            raise MetadataUnavailableError("etcd unreachable (cut by the test)")

    async def get(self, key: str) -> KeyValue | None:
        self._check()
        return await super().get(key)

    async def put(self, key: str, value: Any, lease: int | None = None) -> int:
        self._check()
        return await super().put(key, value, lease)


async def test_the_sweep_outlives_an_outage_and_retries_a_failed_opening(tmp_path: Path) -> None:
    store, clock = CutStore(), FakeClock()
    host = DataPlaneHost("b1", store, clock, data_config(tmp_path))
    await host.start()
    try:
        await host.load("/default/busy", None)
        await eventually(lambda: "/default/busy" in host.topics)
        host.budgets.refused["/default/busy"] = 1  # as a send refused for a full budget
        store.down = True
        await host.load("/default/t", None)
        await eventually(lambda: "/default/t" not in host._opening)
        assert "/default/t" not in host.topics  # the opening failed: the store is down

        await clock.advance(5.0)  # this sweep cannot publish the pressure figures
        assert host.counters.sweep_failures._value.get() == 1

        store.down = False
        await clock.advance(5.0)  # the next one can, and retries the opening
        await eventually(lambda: "/default/t" in host.topics)
        assert await store.get(keys.topic_pressure("/default/busy")) is not None
    finally:
        await host.stop()
    assert not host._tasks.running


async def test_a_load_after_stop_is_ignored_and_a_load_before_start_refused(
    tmp_path: Path,
) -> None:
    host = DataPlaneHost("b1", MemoryStore(), FakeClock(), data_config(tmp_path))
    try:
        await host.load("/default/t", None)
    except RuntimeError as exc:
        assert "before open()" in str(exc)
    else:
        raise AssertionError("load() before start() must be refused")
    await host.start()
    await host.stop()
    await host.load("/default/t", None)  # a broker reacting while its server stops
    assert not host.topics and not host._opening


class SlowStore(MemoryStore):
    """A memory store whose reads (those `gates` picks: all by default) wait while `gate`
    is closed (an opening in progress); it notes each key read."""

    def __init__(self, gates: Callable[[str], bool] = lambda key: True) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        # The gate a key's read waits on, if any (default: `gate`, for those `gates` picks).
        self.gate_of: Callable[[str], asyncio.Event | None] = lambda key: (
            self.gate if gates(key) else None
        )
        self.reads: list[str] = []
        self.listed: list[str] = []
        self.together: list[tuple[str, str]] = []

    async def get(self, key: str) -> KeyValue | None:
        self.reads.append(key)
        gate = self.gate_of(key)
        if gate is not None:
            await gate.wait()
        return await super().get(key)

    async def get_prefix(self, prefix: str) -> Listing:
        self.listed.append(prefix)
        return await super().get_prefix(prefix)

    async def get_and_list(self, key: str, prefix: str) -> tuple[KeyValue | None, Listing]:
        self.together.append((key, prefix))
        return await super().get_and_list(key, prefix)


async def test_a_create_for_a_topic_being_opened_waits_for_the_opening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CreateProducer/Subscribe ask `serving`: a topic this broker is opening is answered
    once open (a move's new owner), not with UNAVAILABLE and a retry."""
    store = SlowStore()
    host = DataPlaneHost("b1", store, FakeClock(), data_config(tmp_path))
    await host.start()
    try:
        assert await host.serving("/default/t") is None  # neither served nor opening
        store.gate.clear()
        await host.load("/default/t", None)
        assert "/default/t" in host._opening
        asking = asyncio.create_task(host.serving("/default/t"))
        await asyncio.sleep(0.1)
        assert not asking.done()  # waits for the opening
        store.gate.set()
        served = await asyncio.wait_for(asking, 5)
        assert served is host.topics["/default/t"]

        # An opening slower than the wait: the caller gets no topic (and UNAVAILABLE).
        monkeypatch.setattr(host_module, "CREATE_WAITS_FOR_OPENING_SECONDS", 0.1)
        store.gate.clear()
        await host.load("/default/u", None)
        assert await host.serving("/default/u") is None
        store.gate.set()
        await eventually(lambda: "/default/u" in host.topics)
    finally:
        store.gate.set()
        await host.stop()


async def test_many_openings_queue_and_a_topic_a_client_asks_for_opens_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker that inherits many topics at once (a drain, a failover) opens a few at a
    time; the one a client waits for does not queue behind the idle ones."""
    monkeypatch.setattr(host_module, "OPENINGS_AT_ONCE", 2)
    store = SlowStore(gates=lambda key: key.startswith(keys.TOPICS_PREFIX))
    host = DataPlaneHost("b1", store, FakeClock(), data_config(tmp_path))
    await host.start()
    names = [f"/default/t{i}" for i in range(6)]
    try:
        store.gate.clear()
        for name in names:
            await host.load(name, None)
        assert set(host._opening) == set(names[:2])  # the others wait their turn

        # A client asks for the last one: its opening starts at once (its reads, alone,
        # are let through).
        gated = store.gate_of
        store.gate_of = lambda key: None if names[-1] in key else gated(key)
        served = await asyncio.wait_for(host.serving(names[-1]), 5)
        assert served is host.topics[names[-1]]
        assert set(host.topics) == {names[-1]}  # ahead of all the queued ones

        await host.unload(names[3], None)  # unassigned while queued: never opened
        store.gate.set()
        await eventually(lambda: set(host.topics) == set(names) - {names[3]})
        assert not host._opening
    finally:
        store.gate.set()
        await host.stop()


async def test_an_opening_reads_its_metadata_and_storage_in_one_call(tmp_path: Path) -> None:
    """Opening (a move's new owner, a failover's heir) reads the topic's metadata and its
    storage listing in one round trip, and nothing of either again."""
    name = TopicName.parse("/default/r")
    store = SlowStore()
    host = DataPlaneHost("b1", store, FakeClock(), data_config(tmp_path))
    await host.start()
    try:
        await host.directory.create_topic(name, {DISPATCH_KEY: RELIABLE})
        store.reads.clear()
        await host.load(str(name), None)
        await eventually(lambda: str(name) in host.topics)
        assert host.topics[str(name)].reliable
        assert store.together == [(keys.topic_meta(name), keys.storage_topic_prefix(name))]
        assert store.reads.count(keys.topic_meta(name)) == 1  # inside that one call
        assert store.listed == [keys.storage_topic_prefix(name)]  # likewise
    finally:
        await host.stop()


class _Context:
    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")

    def invocation_metadata(self) -> tuple[()]:
        return ()


async def test_a_producer_created_while_its_topic_opens_reads_what_it_checks_meanwhile(
    tmp_path: Path,
) -> None:
    """A move's new owner is asked to create the producer before it serves the topic: the
    topic's schema binding and the namespace's quotas are read during that wait, so
    neither the create nor the first (held) send after the move pays a read."""
    # The topic's records wait (its opening waits), its schema binding does not.
    store = SlowStore(
        lambda key: key.startswith(keys.TOPICS_PREFIX) and not key.endswith("/schema")
    )
    config = data_config(tmp_path)
    host = DataPlaneHost("b1", store, FakeClock(), config)
    await host.start()
    service = DataPlaneService(host, config, "127.0.0.1:6650")
    schema_key = keys.topic_schema(TopicName.parse("/default/t"))
    quota_key = keys.quota_policy("default")
    try:
        store.gate.clear()
        await host.load("/default/t", None)
        request = pb.ProducerRequest(request_id=1, topic_name="/default/t", producer_name="p")
        creating = asyncio.ensure_future(service.CreateProducer(request, _Context()))
        await eventually(lambda: {schema_key, quota_key} <= set(store.reads))
        assert not creating.done()  # still waiting for the opening
        reads = len(store.reads)
        store.gate.set()
        answer = await asyncio.wait_for(creating, 5)
        assert quota_key not in store.reads[reads:]  # the create found them read already
        reads = len(store.reads)
        message = pb.StreamMessage(request_id=2, payload=b"x")
        message.msg_id.producer_id = answer.producer_id
        message.msg_id.topic_name = "/default/t"
        await service.SendMessage(message, _Context())
        assert schema_key not in store.reads[reads:]  # the send found it read already
    finally:
        store.gate.set()
        await host.stop()


async def test_a_consumer_subscribing_after_a_move_reads_quotas_and_nack_delays_meanwhile(
    tmp_path: Path,
) -> None:
    """A move's new owner is asked to subscribe before it serves the topic: the namespace's
    quotas are read during the opening, and the subscription's recorded nack delays while
    its cursor is read, not one round trip after."""
    name = TopicName.parse("/default/t")
    cursor_key = keys.subscription_cursor(name, "s")
    opening, cursor = asyncio.Event(), asyncio.Event()

    def gate(key: str) -> asyncio.Event | None:
        if key == cursor_key:
            return cursor
        return opening if key.startswith(keys.TOPICS_PREFIX) else None

    store = SlowStore()
    store.gate_of = gate
    config = data_config(tmp_path)
    host = DataPlaneHost("b1", store, FakeClock(), config)
    await host.start()
    service = DataPlaneService(host, config, "127.0.0.1:6650")
    quota_key = keys.quota_policy("default")
    holds_key = keys.subscription_redeliveries(name, "s")
    try:
        opening.set()
        await host.directory.create_topic(name, {DISPATCH_KEY: RELIABLE})
        opening.clear()
        await host.load(str(name), None)
        request = pb.ConsumerRequest(
            request_id=1, topic_name=str(name), consumer_name="c", subscription="s"
        )
        subscribing = asyncio.ensure_future(service.Subscribe(request, _Context()))
        await eventually(lambda: quota_key in store.reads)
        assert not host.topics  # read while the topic still opens
        opening.set()
        await eventually(lambda: cursor_key in store.reads)
        await eventually(lambda: holds_key in store.reads)
        assert not subscribing.done()  # the cursor is still being read
        cursor.set()
        answer = await asyncio.wait_for(subscribing, 5)
        assert answer.consumer_name == "c"
    finally:
        opening.set()
        cursor.set()
        await host.stop()


async def test_metrics_scraped_from_another_thread_while_topics_open(tmp_path: Path) -> None:
    """The metrics server scrapes from its own thread while the event loop opens topics: a
    scrape that iterated the live topic dicts failed with "dictionary changed size during
    iteration" (HTTP 500 to Prometheus during a drain of 10 000 topics)."""
    host = DataPlaneHost("b1", MemoryStore(), FakeClock(), data_config(tmp_path))
    await host.start()
    failures: list[BaseException] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            try:
                generate_latest(host.counters.registry)
            except BaseException as exc:
                failures.append(exc)
                return

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for i in range(2000):
            await host.load(f"/default/t{i}", None)
            if i % 50 == 0:
                await asyncio.sleep(0)  # let openings finish (they change host.topics)
        await eventually(lambda: len(host.topics) == 2000, timeout=30)
    finally:
        stop.set()
        scraper.join()
        await host.stop()
    assert not failures, failures
