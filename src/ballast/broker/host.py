"""`DataPlaneHost`: the `TopicHost` that serves real topics to the Danube client.

The broker tells it to `load` a topic when the topic is assigned here and to `unload` it
when the assignment goes (a move, a drain, shutdown). A topic whose metadata says
``dispatch_strategy: reliable`` is opened on the storage engine (it continues after the
previous owner's seal or reservation) and sealed on unload; any other topic is an
in-memory fan-out. The gRPC services find producers, consumers and topics here.

Leaving is make-before-break for clients: producers are dropped at once (their next send
gets UNAVAILABLE, on which the client looks up and follows the topic), and consumers go
through the close handshake: their stream stays open, the next health check answers
CLOSE, and the stream ends just after (or after `close_handshake_seconds`). Meanwhile a
`ConsumerRelay` feeds the open stream from the new owner, so the consumer does not wait
for its next health check to get messages again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from ballast.aio import TaskOwner
from ballast.broker.budgets import ByteBudgets
from ballast.broker.dispatch import ConsumerHandle, SubscriptionDispatcher, drain
from ballast.broker.expiry import expired
from ballast.broker.metrics import DataPlaneMetrics
from ballast.broker.pressure import topic_figures
from ballast.broker.relay import ConsumerRelay
from ballast.broker.storage_metrics import StorageCollector
from ballast.broker.topics import (
    NonReliableServedTopic,
    ProducerEntry,
    ReliableServedTopic,
    ServedTopic,
)
from ballast.clock import Clock
from ballast.config import BallastConfig
from ballast.metadata import Listing, MetadataStore, keys
from ballast.metadata.directory import Directory
from ballast.model import TopicLoad, TopicName, UnassignedMarker
from ballast.storage import (
    AckMode,
    CommitStream,
    FsspecObjectStore,
    FsyncPolicy,
    Handoff,
    ObjectStore,
    ReliableTopic,
    SealedState,
    SealError,
    StorageConfig,
    StorageStats,
    verify_shared_object_store,
)
from ballast.storage.log import BrokerLog
from ballast.storage.retention import RetentionPolicies
from ballast.storage.ticker import Ticker
from ballast.wire.cluster_calls import ClusterDialer

__all__ = ["DISPATCH_KEY", "DataPlaneHost"]

log = logging.getLogger(__name__)

# Field of the topic metadata that says how the topic keeps messages.
DISPATCH_KEY = "dispatch_strategy"
RELIABLE = "reliable"
NON_RELIABLE = "non_reliable"

# A consumer without a stream or health check for this long is forgotten; a producer
# without a send or health check for `PRODUCER_IDLE_SECONDS` too (the client checks in
# every 5 s while it lives).
CONSUMER_IDLE_SECONDS = 30.0
PRODUCER_IDLE_SECONDS = 60.0
CLOSE_AFTER_HEALTH_SECONDS = 0.5  # lets the client's acks of what it got arrive first
RELAY_ACK_SECONDS = 3.0
# A CreateProducer/Subscribe for a topic this broker is opening waits this long for it
# (a move's opening takes milliseconds) instead of answering UNAVAILABLE at once, which
# costs a direct client its retry backoff and a gateway a poll.
CREATE_WAITS_FOR_OPENING_SECONDS = 2.0
# Openings in the background at once (`load`); one a client waits for starts anyway.
# Each is a few metadata round trips: 16 at a time, a failover of 3 034 topics (TTL 5 s)
# had them all open 16-20 s after the kill; 64 at a time, 11 s (a loaded machine).
OPENINGS_AT_ONCE = 64


class DataPlaneHost:
    """The topics this broker serves, with their producers and consumers."""

    def __init__(
        self,
        broker_id: str,
        store: MetadataStore,
        clock: Clock,
        config: BallastConfig,
        *,
        objects: ObjectStore | None = None,
        metrics: DataPlaneMetrics | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.store = store
        self.clock = clock
        self.config = config
        self.settings = config.data_plane
        storage = config.storage
        self.wal_dir = Path(storage.data_dir) / "wal" / broker_id
        self._objects = objects  # opened on the first reliable topic (it creates a directory)
        self.storage_config = StorageConfig(
            fsync_policy=FsyncPolicy(storage.fsync_policy),
            ack=AckMode(storage.ack),
            commit_linger_seconds=storage.commit_linger_seconds,
            stream_linger_seconds=storage.stream_linger_seconds,
            max_object_bytes=storage.max_object_bytes,
            max_object_writes_per_second=storage.max_object_writes_per_second,
            upload_interval_seconds=storage.upload_interval_seconds,
            cursor_flush_seconds=storage.cursor_flush_seconds,
            cache_bytes=storage.wal_cache_bytes,
            shared_object_grace_seconds=storage.shared_object_grace_seconds,
        )
        self.stats = StorageStats()
        self._stream: CommitStream | None = None  # with the object store
        self._log: BrokerLog | None = None  # recovered with the first reliable topic
        # One timer per period for every topic's periodic storage work, and the
        # namespaces' retention policies read once per upload interval for all topics.
        self.ticker = Ticker(clock)
        self.retention_policies = RetentionPolicies(
            store, clock, self.storage_config.upload_interval_seconds
        )
        self.counters = metrics if metrics is not None else DataPlaneMetrics()
        self.counters.registry.register(StorageCollector(self.stats, self._stored))
        self.directory = Directory(store, clock)
        self.dialer = ClusterDialer(config)  # the relay's and dead letters' calls
        self.counters.subscription_dropped.set_function(
            lambda: sum(d.dropped for d in self._subscriptions())
        )
        self.counters.subscription_buffered_bytes.set_function(
            lambda: sum(d.buffered_bytes for d in self._subscriptions())
        )
        self.topics: dict[str, ServedTopic] = {}
        self.producers: dict[int, ProducerEntry] = {}
        self.consumers: dict[int, ConsumerHandle] = {}
        self._timers: set[asyncio.TimerHandle] = set()
        self._idle_subscriptions: dict[tuple[str, str], float] = {}  # see `expiry`
        # Bytes held until stored, per topic and in total (SendMessage's backpressure).
        self.budgets = ByteBudgets(
            self.settings.topic_budget_bytes, self.settings.broker_budget_bytes
        )
        self._published: dict[str, dict[str, Any]] = {}  # pressure figures last written
        self._relays: dict[int, ConsumerRelay] = {}  # consumer id -> relay of a moved topic
        self._failed_loads: dict[str, UnassignedMarker | None] = {}  # assigned, not opened
        self._assigned: set[str] = set()  # what the broker asked us to serve
        # Topics a request waits to see assigned here (`assigned_here`): a new topic's
        # first producer is served as soon as it opens, not after a retry.
        self._placements: dict[str, asyncio.Event] = {}
        self._opening: dict[str, asyncio.Task[None]] = {}  # topics whose opening runs
        # Assigned topics waiting for a background opening (`load`), in assignment order.
        self._queued: dict[str, UnassignedMarker | None] = {}
        # The host's background work (openings, releases, the sweep), from `start` to `stop`.
        self._tasks = TaskOwner(f"dataplane/{broker_id}")
        self._stopped = False
        # Gives a topic that cannot go on here back to the leader (set by the broker).
        self.release: Callable[[str, str], Coroutine[Any, Any, None]] | None = None
        self._releasing: dict[str, asyncio.Task[None]] = {}

    def objects(self) -> ObjectStore:
        """The shared object store of reliable topics."""
        if self._objects is None:
            storage = self.config.storage
            self._objects = FsspecObjectStore(
                storage.object_store_url(), dict(storage.object_store_options)
            )
        return self._objects

    def commit_stream(self) -> CommitStream:
        """The broker's object writes and descriptor commits, shared by its topics."""
        if self._stream is None:
            self._stream = CommitStream(
                self.objects(),
                self.store,
                broker_id=self.broker_id,
                clock=self.clock,
                config=self.storage_config,
                stats=self.stats,
            )
        return self._stream

    def broker_log(self) -> BrokerLog:
        """The broker's write-ahead log, shared by its reliable topics (one directory,
        one open file, one group commit whatever the number of topics)."""
        if self._log is None:
            # "_log" cannot be a namespace (names start with a letter or digit): no clash
            # with the per-topic directories older versions left in `wal_dir`.
            self._log = BrokerLog(
                self.wal_dir / "_log",
                clock=self.clock,
                config=self.storage_config,
                stats=self.stats,
                name=f"log/{self.broker_id}",
            )
        return self._log

    async def verify_object_store(self) -> None:
        """Raise `ObjectStoreMismatchError` unless this broker uses the cluster's store."""
        await verify_shared_object_store(self.store, self.objects(), self.broker_id, self.clock)

    # -- TopicHost -------------------------------------------------------------------------

    async def load(self, topic: str, marker: UnassignedMarker | None) -> None:
        """Start serving `topic` (reliable topics open their storage first).

        The opening runs as a task of its own and `load` does not wait for it: the broker
        hands topics over one at a time, and a broker that inherits many at once (a
        drain, a failover) must open them side by side. At most `OPENINGS_AT_ONCE` run
        in the background; the others queue, and a topic a client asks for (`serving`)
        opens at once, ahead of the queue. (Opened all at once, a drain's 1 034 topics
        queued their metadata reads behind each other and its 32 live topics, whose
        opening is what their clients wait for, paused 0.6-1.5 s; bounded without the
        client's priority, the live ones waited behind the idle ones.)
        Until a topic is open its clients get UNAVAILABLE (a gateway holds them), as for
        any topic not served yet; CreateProducer and Subscribe wait for an opening here
        (`serving`).
        """
        self._assigned.add(topic)
        placed = self._placements.pop(topic, None)
        if placed is not None:
            placed.set()
        if topic in self.topics or topic in self._opening or topic in self._queued:
            return
        if self._stopped:
            return  # the server is gone (a crash or a stop racing the broker's reaction)
        self._queued[topic] = marker
        self._open_queued()

    def _open_queued(self, wanted: str | None = None) -> None:
        """Start the `wanted` topic's opening now, and queued ones while there is room."""
        if self._stopped:
            return
        if wanted is not None and wanted in self._queued:
            self._start_opening(wanted, self._queued.pop(wanted))
        while self._queued and len(self._opening) < OPENINGS_AT_ONCE:
            topic = next(iter(self._queued))
            self._start_opening(topic, self._queued.pop(topic))

    def _start_opening(self, topic: str, marker: UnassignedMarker | None) -> None:
        task = self._tasks.spawn(self._open(topic, marker), f"open{topic}")
        self._opening[topic] = task
        task.add_done_callback(lambda done: self._opened(topic, done))

    async def assigned_here(self, topic: str, timeout: float) -> bool:
        """Whether `topic` is (or within `timeout` seconds becomes) assigned to this broker."""
        if topic in self._assigned:
            return True
        event = self._placements.setdefault(topic, asyncio.Event())
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            return topic in self._assigned
        finally:
            if not event.is_set() and self._placements.get(topic) is event:
                del self._placements[topic]
        return True

    async def serving(self, topic: str) -> ServedTopic | None:
        """The topic as served here; while it is being opened here, once that finishes
        (within `CREATE_WAITS_FOR_OPENING_SECONDS`)."""
        self._open_queued(topic)
        opening = self._opening.get(topic)
        if opening is not None and topic not in self.topics:
            await asyncio.wait({opening}, timeout=CREATE_WAITS_FOR_OPENING_SECONDS)
        return self.topics.get(topic)

    def _opened(self, topic: str, task: asyncio.Task[None]) -> None:
        if self._opening.get(topic) is task:
            del self._opening[topic]
        self._open_queued()

    async def _open(self, topic: str, marker: UnassignedMarker | None) -> None:
        try:
            await self._load(topic, marker)
        except Exception as exc:
            # E.g. the metadata store was unreachable: the sweep tries again.
            log.error("%s: opening %s failed: %s", self.broker_id, topic, exc)
            if topic in self._assigned:
                self._failed_loads[topic] = marker

    async def _load(self, topic: str, marker: UnassignedMarker | None) -> None:
        if topic in self.topics:
            return
        self._failed_loads.pop(topic, None)
        name = TopicName.parse(topic)
        began = time.perf_counter()
        # The storage keys with the metadata, in one round trip: a reliable topic's open
        # needs them (for another topic it is an empty prefix read in the same call).
        meta, listing = await self.directory.meta_and_storage(name)
        await self._start_serving(topic, name, marker, meta or {}, listing)
        if topic in self.topics:
            self.counters.handover.labels("open").observe(time.perf_counter() - began)

    async def _start_serving(
        self,
        topic: str,
        name: TopicName,
        marker: UnassignedMarker | None,
        meta: dict[str, Any],
        listing: Listing,
    ) -> None:
        now = self.clock.now()
        window, buffer = self.settings.unacked_window, self.settings.non_reliable_queue
        served: ServedTopic
        if meta.get(DISPATCH_KEY) == RELIABLE:
            storage = ReliableTopic(
                name,
                broker_id=self.broker_id,
                data_dir=self.wal_dir,
                objects=self.objects(),
                metadata=self.store,
                clock=self.clock,
                config=self.storage_config,
                stats=self.stats,
                stream=self.commit_stream(),
                log=self.broker_log(),
                ticker=self.ticker,
                policies=self.retention_policies,
            )
            try:
                opened = await storage.open(listing)
            except Exception as exc:
                self.counters.load_failures.inc()
                self._failed_loads[topic] = marker
                log.error(
                    "%s: cannot open the storage of %s (retrying every sweep): %s",
                    self.broker_id,
                    topic,
                    exc,
                )
                return
            if topic not in self._assigned:  # unloaded while a retry was opening it
                await storage.close()
                return
            log.info(
                "%s: serving reliable %s from offset %d (%s)",
                self.broker_id,
                topic,
                opened.next_offset,
                opened.source.value,
            )
            served = ReliableServedTopic(
                topic,
                storage,
                window=window,
                buffer=max(2 * window, 256),
                now=now,
                tasks=self._tasks,
                stats=self.stats,
            )
        else:
            served = NonReliableServedTopic(topic, window=window, buffer=buffer, now=now)
            log.info("%s: serving non-reliable %s", self.broker_id, topic)
        served.on_failure = self._failed
        served.buffer_bytes = self.settings.subscription_buffer_bytes
        self.topics[topic] = served

    def _failed(self, topic: str, why: str) -> None:
        """A served topic cannot go on here (its WAL failed): give it back, once."""
        log.error("%s: %s cannot be served here: %s; releasing it", self.broker_id, topic, why)
        self.counters.load_failures.inc()
        if self.release is None or topic in self._releasing:
            return
        if self._stopped:
            return  # stopping: the leader fails the topic over
        task = self._tasks.spawn(self._release(topic, why), f"release{topic}")
        self._releasing[topic] = task
        task.add_done_callback(lambda _: self._releasing.pop(topic, None))

    async def _release(self, topic: str, why: str) -> None:
        assert self.release is not None
        try:
            await self.release(topic, why)
        except Exception as exc:  # the metadata store is down: the leader fails it over later
            log.error("%s: could not release %s: %s", self.broker_id, topic, exc)

    async def unload(self, topic: str, handoff: Handoff | None = None) -> SealedState | None:
        """Stop serving `topic`: drop its producers, start the consumers' handshake, seal
        (`handoff`: written with the sealed state, see `ReliableTopic.seal`).

        Raises `SealError` if the topic could not be sealed and was handed over unsealed
        (it is not served here any more either way).
        """
        opening = self._opening.get(topic)
        if opening is not None:
            # Let the opening finish (it may be mid-claim), then seal what it opened.
            await asyncio.wait({opening})
        self._queued.pop(topic, None)
        self._failed_loads.pop(topic, None)
        self._assigned.discard(topic)
        served = self.topics.pop(topic, None)
        if served is None:
            return None
        for entry in served.producers.values():
            self.producers.pop(entry.id, None)
        departing = served.consumers()
        for consumer in departing:
            consumer.closing = True
            self._later(self.settings.close_handshake_seconds, self._forget_consumer, consumer)
        unsealed: SealError | None = None
        began = time.perf_counter()
        try:
            sealed = await served.leave(handoff)
            self.counters.handover.labels("seal").observe(time.perf_counter() - began)
        except SealError as exc:
            # Handed over unsealed: everything acknowledged is in object storage already.
            unsealed, sealed = exc, None
        except Exception:
            # The broker must go on; without a seal the next owner continues after this
            # owner's reservation (no offset is reused).
            log.exception("%s: leaving %s failed", self.broker_id, topic)
            sealed = None
        if self.settings.relay_moving_consumers:
            for consumer in departing:
                if consumer.connected and not consumer.carried:
                    self.counters.consumer_relays.inc()
                    relay = ConsumerRelay(
                        consumer,
                        topic,
                        self.directory,
                        self.broker_id,
                        self.settings.close_handshake_seconds,
                        self.dialer,
                    )
                    self._relays[consumer.id] = relay
                    relay.start(self._tasks)
        self._update_gauges()
        log.info(
            "%s: stopped serving %s%s",
            self.broker_id,
            topic,
            f" (sealed at {sealed.last_committed_offset})" if sealed is not None else "",
        )
        if unsealed is not None:
            raise unsealed
        return sealed

    def metrics(self) -> list[TopicLoad]:
        """Per-topic traffic since the previous call (the load report's topics)."""
        now = self.clock.now()
        return [self.topics[t].sample(now) for t in sorted(self.topics)]

    # -- registries ------------------------------------------------------------------------

    def _subscriptions(self) -> list[SubscriptionDispatcher]:
        """Every served subscription. Called from the metrics server's thread while the
        event loop opens and closes topics: iterating the live dicts there failed a scrape
        with "dictionary changed size during iteration" (a drain of 10 000 topics); list()
        copies each at once."""
        return [d for t in list(self.topics.values()) for d in list(t.subscriptions.values())]

    def _stored(self) -> list[tuple[str, int, int]]:
        """(topic, objects, bytes) in the object store of every reliable topic served."""
        return [
            (name, *served.storage.stored)
            for name, served in list(self.topics.items())
            if isinstance(served, ReliableServedTopic)
        ]

    def add_producer(self, entry: ProducerEntry) -> None:
        """Register a producer's id (for SendMessage and HealthCheck)."""
        self.producers[entry.id] = entry
        self._update_gauges()

    def add_consumer(self, handle: ConsumerHandle) -> None:
        """Register a consumer's id (for ReceiveMessages and HealthCheck)."""
        self.consumers[handle.id] = handle
        self._update_gauges()

    def on_close_sent(self, handle: ConsumerHandle) -> asyncio.Task[Any] | None:
        """A departing consumer is told CLOSE: send it nothing more, end its stream soon.

        The client drops whatever reaches it after CLOSE, so what still waits in the
        stream's queue is not sent: the new owner delivers it (the relay gives it back, or
        it comes after the cursor). The stream ends just after; the client re-subscribes.
        Returns the relay's give-back under way, which the CLOSE answer waits for.
        """
        if handle.close_sent:
            return None
        handle.close_sent = True
        unsent = drain(handle.queue) if handle.queue is not None else []
        relay = self._relays.get(handle.id)
        given_back = relay.end_stream(unsent, self.clock.now()) if relay is not None else None
        self._later(CLOSE_AFTER_HEALTH_SECONDS, self._forget_consumer, handle)
        return given_back

    def _drop_relay(self, handle: ConsumerHandle) -> None:
        relay = self._relays.pop(handle.id, None)
        if relay is not None:
            relay.stop()

    def relay_for(self, topic: str, subscription: str) -> ConsumerRelay | None:
        """A running relay of `subscription` of a topic that moved away, if any."""
        for relay in self._relays.values():
            if relay.topic == topic and relay.subscription == subscription and relay.stub:
                return relay
        return None

    def _forget_consumer(self, handle: ConsumerHandle) -> None:
        if handle.id in self._relays:
            # Acks of what the client received still pass on for a moment.
            self._later(RELAY_ACK_SECONDS, self._drop_relay, handle)
        handle.end_stream()
        if self.consumers.get(handle.id) is handle:
            del self.consumers[handle.id]
        self._update_gauges()

    def _later(
        self, delay: float, fn: Callable[[ConsumerHandle], None], handle: ConsumerHandle
    ) -> None:
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None

        def run() -> None:
            if timer is not None:
                self._timers.discard(timer)
            fn(handle)

        timer = loop.call_later(delay, run)
        self._timers.add(timer)

    def _update_gauges(self) -> None:
        self.counters.producers.set(len(self.producers))
        self.counters.consumers.set(len(self.consumers))

    def sweep(self) -> None:
        """Forget producers and consumers whose clients went away without a word."""
        now = self.clock.now()
        for entry in list(self.producers.values()):
            if now - entry.last_seen > PRODUCER_IDLE_SECONDS:
                del self.producers[entry.id]
                if entry.topic.producers.get(entry.name) is entry:
                    del entry.topic.producers[entry.name]
        for handle in list(self.consumers.values()):
            if handle.connected or now - handle.last_seen <= CONSUMER_IDLE_SECONDS:
                continue
            del self.consumers[handle.id]
            if not handle.closing:
                handle.dispatcher.remove(handle)
        self._update_gauges()

    async def expire_subscriptions(self) -> list[tuple[str, str]]:
        """Remove subscriptions without consumers for `subscription_expiry_seconds`."""
        after = self.settings.subscription_expiry_seconds
        if not after:
            return []
        idle = [
            (topic, name)
            for topic, served in self.topics.items()
            if served.accepting
            for name, dispatcher in served.subscriptions.items()
            if not dispatcher.consumers
        ]
        self._idle_subscriptions, due = expired(
            self._idle_subscriptions, idle, self.clock.now(), after
        )
        for topic, name in due:
            served = self.topics.get(topic)
            if served is not None and await served.drop_subscription(name):
                self.counters.subscriptions_expired.inc()
                log.info("%s: subscription %s of %s expired", self.broker_id, name, topic)
        return due

    async def publish_pressure(self) -> int:
        """Write the changed pressure figures of served topics (`broker.pressure`)."""
        written = 0
        for name, served in list(self.topics.items()):
            figures = topic_figures(served, self.budgets)
            if figures is None or self._published.get(name) == figures:
                continue
            record = {**figures, "broker": self.broker_id, "timestamp": self.clock.now()}
            await self.store.put(keys.topic_pressure(name), record)
            self._published[name] = figures
            written += 1
        return written

    async def start(self) -> None:
        """Start the host's background work: topic openings, releases and the sweep."""
        await self._tasks.open()
        self._tasks.spawn(self._sweep_forever(), "sweep")

    async def stop(self) -> None:
        """Stop it (the server is stopping): cancel what runs and wait for it."""
        self._stopped = True
        self.shutdown()
        await self._tasks.close()
        if self._stream is not None:  # after the topics: what still waits was not acked
            await self._stream.close()
        if self._log is not None:  # after the topics and the stream: they wrote to it
            await self._log.close()
        await self.ticker.close()

    async def sweep_once(self) -> None:
        """Sweep, expire subscriptions, publish pressure and retry failed openings."""
        self.sweep()
        await self.expire_subscriptions()
        await self.publish_pressure()
        for topic, marker in list(self._failed_loads.items()):
            if topic in self._assigned and topic not in self.topics:
                await self.load(topic, marker)

    async def _sweep_forever(self, every: float = 5.0) -> None:
        while True:
            await self.clock.sleep(every)
            try:
                await self.sweep_once()
            except Exception as exc:
                # E.g. the metadata store is down: a sweep that stopped for good would
                # never retry a failed opening again.
                self.counters.sweep_failures.inc()
                log.warning("%s: sweep failed, retrying in %.0f s: %s", self.broker_id, every, exc)

    async def close(self) -> None:
        """Unload every topic (sealing reliable ones); for owners without a BrokerNode."""
        self._queued.clear()  # never claimed here: nothing to seal
        for task in list(self._opening.values()):
            await asyncio.wait({task})
        for topic in sorted(self.topics):
            try:
                await self.unload(topic)
            except Exception:
                log.exception("%s: unloading %s failed", self.broker_id, topic)
        self.shutdown()

    def shutdown(self) -> None:
        """Cancel pending handshakes and relays (the server is stopping)."""
        self._failed_loads.clear()
        self._queued.clear()
        for task in list(self._opening.values()):
            task.cancel()
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        for relay in self._relays.values():
            relay.stop()
        self._relays.clear()
