"""`BrokerNode`: one broker's side of the control plane.

- Registers ``/cluster/register/{id}`` on a lease (TTL `broker.registration_ttl_seconds`)
  and keeps it alive; sets its state to active at start.
- Publishes a `LoadReport` every `load_report_interval_seconds`: resource usage from its
  sampler (psutil by default) and per-topic traffic from its `TopicHost`. The report key is
  bound to the same lease, so a dead broker's report vanishes with its registration.
- Watches its own prefix ``/cluster/brokers/{id}/`` (its state and its assignments) and
  makes the host match it: an assignment put loads the topic, a delete unloads it. What
  each change means is decided by `BrokerMachine` (`leader/broker_machine.py`, pure and
  shared with the simulator's brokers); this node performs its effects.
- A delete caused by a move comes with a marker ``{from_broker: me, ready: false}``: the
  broker unloads gracefully (the host seals the topic) and only then sets ``ready: true``,
  which lets the leader assign the topic to its target.
- While draining (or drained) it bounces assignments that still reach it: one transaction
  deletes the assignment and writes a ``drain_redirect`` marker.
- If its lease is lost it stops serving every topic at once (their new owners may already
  be writing), registers again on a new lease and reloads whatever is still assigned to it.
- Its loops are supervised: a store outage, or a `load`/`unload` of its host that fails, is
  logged, counted (``ballast_broker_loop_errors_total{loop}``) and retried; the broker
  keeps serving everything else. A topic whose `load` failed is loaded again at the next
  resync (after `retry_delay`); a topic whose `unload` failed is not marked ready (the
  leader's seal timeout forces the move).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ballast.aio import cancel_and_wait
from ballast.clock import Clock
from ballast.cluster.host import TopicHost
from ballast.cluster.metrics import ClusterMetrics
from ballast.cluster.resources import PsutilSampler, ResourceSampler
from ballast.cluster.service import Service, keep_alive, watching
from ballast.config import BallastConfig
from ballast.leader.broker_machine import (
    BrokerEffect,
    BrokerMachine,
    GiveBack,
    Load,
    SealHandoff,
    Unload,
)
from ballast.metadata import (
    Compare,
    KeyValue,
    Lease,
    Listing,
    MetadataError,
    MetadataStore,
    WatchEvent,
    keys,
)
from ballast.metadata.records import Registration
from ballast.metadata.store import TxnOp
from ballast.model import (
    BrokerId,
    BrokerMode,
    BrokerState,
    LoadReport,
    ModelError,
    validate_broker_id,
)
from ballast.storage import Handoff, SealError

log = logging.getLogger(__name__)

# Topics sealed at once (a drain, a rebalance of many topics): each seal is a few metadata
# and object-store round trips, which overlap. Measured (bench_topics, 84 topics, 32 of
# them live through a gateway): one at a time 2.1 s with live pauses up to 0.45 s; 8 at a
# time 0.8 s, pauses up to 0.7 s; 64 at a time 0.65 s, pauses up to 1.4 s (every topic
# then waits for the whole batch).
_SEALS_AT_ONCE = 8


class MarkerHandoff:
    """A move's marker handed off in the seal's own transaction (`Handoff`): placed on the
    destination the move names (the new owner learns of it from the seal itself), or made
    ready, so the leader sees the topic sealed and ready to move in one write
    (`BrokerMachine.handoff`). Only if the marker is still as `read` found it, and waits
    for this broker."""

    def __init__(
        self,
        read: Awaitable[KeyValue | None],
        decide: Callable[[KeyValue], SealHandoff | None],
    ) -> None:
        self._read = read
        self._decide = decide
        self.decided: SealHandoff | None = None
        self.done = False

    async def writes(self) -> tuple[Sequence[Compare], Sequence[TxnOp]] | None:
        kv = await self._read
        if kv is None:
            return None
        try:
            self.decided = self._decide(kv)
        except ModelError:
            return None  # `_mark_ready` reports it
        if self.decided is None:
            return None
        return self.decided.compares, self.decided.ops

    def written(self) -> None:
        self.done = True

    @property
    def placed_on(self) -> BrokerId | None:
        """The broker the written handoff placed the topic on (None: none written, or the
        marker made ready)."""
        return self.decided.placed_on if self.done and self.decided is not None else None


class BrokerNode(Service):
    """Registration, load reports and the topics of one broker."""

    def __init__(
        self,
        store: MetadataStore,
        clock: Clock,
        host: TopicHost,
        config: BallastConfig,
        broker_id: BrokerId,
        *,
        sampler: ResourceSampler | None = None,
        metrics: ClusterMetrics | None = None,
        registration: Registration | None = None,
        retry_delay: float = 0.5,
    ) -> None:
        super().__init__()
        self.broker_id = validate_broker_id(broker_id)
        self.name = f"broker/{broker_id}"
        self.store = store
        self.clock = clock
        self.host = host
        self.config = config
        self.sampler: ResourceSampler = sampler if sampler is not None else PsutilSampler()
        self.metrics = metrics if metrics is not None else ClusterMetrics(broker_id)
        b = config.broker
        self.registration = registration or Registration(
            broker_url=b.broker_url,
            admin_url=b.admin_url,
            metrics_url=(
                f"http://{config.metrics.host}:{config.metrics.port}/metrics"
                if config.metrics.enabled
                else ""
            ),
            rack=b.rack,
            domain=b.domain,
        )
        self.retry_delay = retry_delay
        self.lease: Lease | None = None
        # What a change of our prefix means is decided there; this shell performs it.
        self.machine = BrokerMachine(self.broker_id, registered=False)
        self.registered = asyncio.Event()
        self.reports_published = 0
        self._host_lock = asyncio.Lock()
        self._unsealed: dict[str, str] = {}  # topic -> why the host could not seal it
        self._leaving: dict[str, asyncio.Task[None]] = {}  # topic -> its seal under way
        self._seals = asyncio.Semaphore(_SEALS_AT_ONCE)
        self._resync = asyncio.Event()
        self._retry_scheduled = False

    @property
    def mode(self) -> BrokerMode:
        return self.machine.mode

    @property
    def serving(self) -> set[str]:
        """The topics the host serves for us."""
        return self.machine.serving

    def _loop_error(self, loop: str, exc: BaseException) -> None:
        """Log and count a failure a supervised loop survives."""
        self.metrics.loop_errors.labels(loop=loop).inc()
        log.warning("%s: %s failed (retrying): %r", self.name, loop, exc)

    def _retry_later(self) -> None:
        """Resync (list the assignments again) after `retry_delay`: failed loads retry."""
        if self._retry_scheduled:
            return
        self._retry_scheduled = True

        async def later() -> None:
            await self.clock.sleep(self.retry_delay)
            self._retry_scheduled = False
            self._resync.set()

        self.spawn(later(), "retry")

    # -- lifecycle -----------------------------------------------------------------------

    async def _start(self) -> None:
        await self._register()
        await self.store.put(
            keys.broker_state(self.broker_id), BrokerState(BrokerMode.ACTIVE, "started").to_dict()
        )
        await self._publish_report()
        self.spawn(self._session_loop(), "session")
        self.spawn(self._assignment_loop(), "assignments")
        self.spawn(self._report_loop(), "load-report")

    def abandon(self) -> None:
        super().abandon()
        for task in self._leaving.values():  # a crash stops a seal under way too
            task.cancel()

    async def _stop(self) -> None:
        """Graceful leave: seal every topic, then revoke the lease (the leader reassigns).

        A seal under way when the loops were cancelled (a move) finishes first: abandoned
        half-way, it would leave the next owner to skip this owner's reserved offsets.
        """
        async with self._host_lock:
            for leaving in list(self._leaving.values()):
                with contextlib.suppress(Exception):
                    await leaving

            async def unload(topic: str) -> None:
                try:
                    await self.host.unload(topic)
                except Exception:
                    log.exception("%s: unloading %s on shutdown failed", self.name, topic)

            await self._side_by_side(sorted(self.serving), unload)
            self.serving.clear()
        lease, self.lease = self.lease, None
        self.registered.clear()
        self.machine.registered = False
        if lease is not None:
            try:
                await self.store.revoke_lease(lease.id)
            except MetadataError as exc:
                log.warning("%s: revoke on shutdown failed (lease will expire): %s", self.name, exc)

    async def _side_by_side(
        self, topics: list[str], unload: Callable[[str], Awaitable[object]]
    ) -> None:
        """`unload` every topic, at most `_SEALS_AT_ONCE` at a time."""

        async def one(topic: str) -> None:
            async with self._seals:
                await unload(topic)

        await asyncio.gather(*(one(topic) for topic in topics))

    # -- registration --------------------------------------------------------------------

    async def _register(self) -> None:
        lease = await self.store.grant_lease(self.config.broker.registration_ttl_seconds)
        await self.store.put(keys.register(self.broker_id), self.registration.to_dict(), lease.id)
        self.lease = lease
        self.registered.set()
        self.machine.registered = True
        log.info("%s: registered (lease %d)", self.name, lease.id)

    async def _session_loop(self) -> None:
        while True:
            lease = self.lease
            if lease is not None:
                await keep_alive(lease, self.name)
            # Lost: the leader may already be reassigning our topics; stop serving them now.
            self.registered.clear()
            self.machine.registered = False
            self.lease = None
            log.warning("%s: registration lost; dropping %d topics", self.name, len(self.serving))
            async with self._host_lock:
                dropped = sorted(self.serving)
                self.serving.clear()
                await self._side_by_side(dropped, lambda t: self._unload(t, serving=True))
            while self.lease is None:
                try:
                    await self._register()
                except Exception as exc:
                    self._loop_error("register", exc)
                    await self.clock.sleep(self.retry_delay)
            self._resync.set()  # reload whatever is still assigned to us

    # -- load reports --------------------------------------------------------------------

    def build_report(self, now: float) -> LoadReport:
        """This broker's load report at `now`."""
        usage = self.sampler.sample()
        topics = tuple(t for t in self.host.metrics() if t.topic in self.serving)
        return LoadReport(
            broker_id=self.broker_id,
            timestamp=now,
            cpu_percent=min(100.0, max(0.0, usage.cpu_percent)),
            memory_percent=min(100.0, max(0.0, usage.memory_percent)),
            disk_io_bps=max(0.0, usage.disk_io_bps),
            network_io_bps=max(0.0, usage.network_io_bps),
            topics=topics,
        )

    async def _publish_report(self) -> None:
        lease = self.lease
        if lease is None:
            return
        report = self.build_report(self.clock.now())
        await self.store.put(keys.load(self.broker_id), report.to_dict(sparse=True), lease.id)
        self.reports_published += 1
        self.metrics.observe_broker(
            report.topic_count,
            report.cpu_percent,
            report.memory_percent,
            report.total_throughput_mbps,
        )

    async def _report_loop(self) -> None:
        interval = self.config.load_manager.load_report_interval_seconds
        while True:
            await self.clock.sleep(interval)
            try:
                await self._publish_report()
            except MetadataError as exc:  # incl. a lost lease: the session loop handles it
                log.warning("%s: publishing the load report failed: %s", self.name, exc)
            except Exception as exc:  # a failing sampler or host metrics: report next time
                self._loop_error("load-report", exc)

    # -- assignments ---------------------------------------------------------------------

    async def _assignment_loop(self) -> None:
        while True:
            try:
                await self._follow_assignments()
            except Exception as exc:  # a store outage, a bad value: list again after a pause
                self._loop_error("assignments", exc)
                await self.clock.sleep(self.retry_delay)

    async def _follow_assignments(self) -> None:
        prefix = keys.broker_prefix(self.broker_id)
        while True:
            self._resync.clear()
            listing = await self.store.get_prefix(prefix)
            async with self._host_lock:
                await self._reconcile(listing)
            async with watching(self.store, prefix, listing.revision + 1) as watch:
                resync = asyncio.ensure_future(self._resync.wait())
                try:
                    while not self._resync.is_set():
                        event = await _next_or_none(watch, resync)
                        if event is None or event.kind == "compacted":
                            break
                        async with self._host_lock:
                            await self._on_event(event)
                finally:
                    resync.cancel()

    async def _reconcile(self, listing: Listing) -> None:
        """Make the host serve exactly the listed assignments (after start or resync)."""
        assigned: dict[str, tuple[object, int]] = {}
        for kv in listing.items:
            if kv.key == keys.broker_state(self.broker_id):
                await self._perform(self.machine.set_state(kv.value))
                continue
            try:
                _, name = keys.parse_assignment_key(kv.key)
            except ValueError:
                continue
            assigned[str(name)] = (kv.value, kv.mod_revision)
        for error in listing.undecodable:
            # Assigned all the same (the leader repairs the value); load without a marker.
            self.metrics.reject("assignment")
            log.warning("%s: %s", self.name, error)
            try:
                _, name = keys.parse_assignment_key(error.key)
            except ValueError:
                continue
            assigned[str(name)] = (None, 0)
        for topic in sorted(self.serving - set(assigned)):
            await self._perform(self.machine.unassigned(topic))
        for topic, (value, revision) in sorted(assigned.items()):
            now = self.clock.now()
            await self._perform(self.machine.assigned(topic, value, revision, now))
        await self._release_stale_markers()

    async def _on_event(self, event: WatchEvent) -> None:
        await self._perform(self.machine.watched(event, self.clock.now()))

    async def _perform(self, effects: list[BrokerEffect]) -> None:
        """Perform what the machine decided, in order."""
        for effect in effects:
            if isinstance(effect, Load):
                await self._load(effect)
            elif isinstance(effect, Unload):
                # Not awaited here: the next events are handled while the topic seals,
                # so a drain of a thousand topics seals them side by side (at most
                # `_SEALS_AT_ONCE`), not one after another. A graceful stop and a later
                # load of the same topic wait for the seal (`_stop`, `_load`).
                leaving = asyncio.ensure_future(self._leave(effect))
                self._leaving[effect.topic] = leaving
                leaving.add_done_callback(functools.partial(self._left, effect.topic))
            elif isinstance(effect, GiveBack):
                result = await self.store.txn(effect.compares, effect.ops)
                if result.succeeded:
                    log.info(
                        "%s: %s is draining; bounced %s", self.name, self.mode.value, effect.topic
                    )
            else:
                self.metrics.reject(effect.kind)
                log.warning("%s: %s", self.name, effect.message)

    async def _load(self, effect: Load) -> None:
        leaving = self._leaving.get(effect.topic)
        if leaving is not None:  # moved back before its seal here ended: that seal first
            with contextlib.suppress(Exception):
                await asyncio.shield(leaving)
        try:
            await self.host.load(effect.topic, effect.marker)
        except Exception as exc:
            self._loop_error("load", exc)
            self._retry_later()
            return
        self.machine.loaded(effect.topic)
        log.debug("%s: loaded %s", self.name, effect.topic)

    def _left(self, topic: str, task: asyncio.Task[None]) -> None:
        if self._leaving.get(topic) is task:
            del self._leaving[topic]
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._loop_error("unload", exc)  # e.g. the marker could not be made ready
            self._retry_later()

    async def _leave(self, effect: Unload) -> None:
        """Seal the topic and hand its marker off (placed on the destination the move
        names, or made ready): in the seal's own transaction when the marker is still as
        read, otherwise made ready right after."""
        # The marker is read while the topic seals, so the seal can hand it off.
        marker = asyncio.ensure_future(self._read_marker(effect.topic))
        handoff = MarkerHandoff(
            marker,
            lambda kv: self.machine.handoff(
                effect.topic, kv.value, kv.mod_revision, self.clock.now()
            ),
        )
        sealed = False
        try:
            async with self._seals:
                sealed = await self._unload(effect.topic, effect.serving, handoff)
        finally:
            if not sealed:
                await cancel_and_wait(marker)
        if sealed and not handoff.done:
            await self._mark_ready(effect.topic, marker)
        elif handoff.decided is not None and (target := handoff.placed_on) is not None:
            why = handoff.decided.marker.reason.value
            self.metrics.assignments.labels(broker_id=target, action="assign").inc()
            log.info("%s: [%s] %s → %s, placed by its seal", self.name, why, effect.topic, target)

    async def _unload(self, topic: str, serving: bool, handoff: Handoff | None = None) -> bool:
        """Stop serving `topic` (sealing it, if `serving`); False if the host failed to.

        A topic the host handed over unsealed (`SealError`) counts as unloaded: its marker
        is made ready with ``unsealed`` saying why, not as if it had sealed.
        """
        if not serving:
            return True
        try:
            await self.host.unload(topic, handoff)
        except SealError as exc:
            self._unsealed[topic] = str(exc)
            log.warning("%s: %s handed over unsealed: %s", self.name, topic, exc)
            return True
        except Exception as exc:
            # Not sealed: the marker stays not ready; the leader forces the move after
            # its seal timeout (the storage engine's fenced claim makes that safe).
            self._loop_error("unload", exc)
            return False
        log.debug("%s: unloaded %s", self.name, topic)
        return True

    async def _read_marker(self, topic: str) -> KeyValue | None:
        """The topic's marker; None also when the store failed (`_mark_ready` reads again)."""
        with contextlib.suppress(MetadataError):
            return await self.store.get(keys.unassigned(topic))
        return None

    async def _mark_ready(self, topic: str, read: Awaitable[KeyValue | None] | None = None) -> None:
        """Set ``ready: true`` on the topic's marker if it waits for us to seal it (`read`:
        the marker as read already, tried first)."""
        key = keys.unassigned(topic)
        for attempt in range(10):
            kv = await read if attempt == 0 and read is not None else None
            if kv is None:  # not read yet, the read failed, or it is a retry
                kv = await self.store.get(key)
            if kv is None:
                return
            try:
                ready = self.machine.ready_marker(kv.value, self._unsealed.get(topic))
            except ModelError as exc:
                self.metrics.reject("marker")
                log.warning("%s: bad marker for %s: %s", self.name, topic, exc)
                return
            if ready is None:
                return
            if await self.store.compare_and_swap(key, kv.mod_revision, ready):
                log.debug("%s: %s sealed, marker ready", self.name, topic)
                self._unsealed.pop(topic, None)
                return
        log.warning("%s: could not set the marker of %s ready (kept changing)", self.name, topic)

    async def _release_stale_markers(self) -> None:
        """Markers waiting for us to seal topics we no longer serve (e.g. after a restart)."""
        listing = await self.store.get_prefix(keys.UNASSIGNED_PREFIX)
        for kv in listing.items:
            value = kv.value
            if not isinstance(value, dict) or value.get("from_broker") != self.broker_id:
                continue
            if value.get("ready") is False:
                try:
                    topic = str(keys.parse_unassigned_key(kv.key))
                except ValueError:
                    continue
                if topic not in self.serving:
                    await self._mark_ready(topic)

    async def release_topic(self, topic: str, why: str) -> None:
        """Give `topic` back to the leader because it cannot be served here (its WAL
        failed): the assignment goes and an unload marker waits for our seal attempt; the
        leader then places the topic on another broker."""
        key = keys.broker_assignment(self.broker_id, topic)
        kv = await self.store.get(key)
        if kv is None:
            return
        give_back = self.machine.release(topic, kv.mod_revision, self.clock.now())
        result = await self.store.txn(give_back.compares, give_back.ops)
        if result.succeeded:
            log.warning("%s: released %s: %s", self.name, topic, why)


async def _next_or_none(watch: object, stop: asyncio.Future[Any]) -> WatchEvent | None:
    """The next watch event, or None when the watch ends or `stop` completes first."""
    it = watch.__aiter__()  # type: ignore[attr-defined]
    step = asyncio.ensure_future(it.__anext__())
    try:
        done, _ = await asyncio.wait({step, stop}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        step.cancel()
        raise
    if step in done:
        try:
            event: WatchEvent = step.result()
        except StopAsyncIteration:
            return None
        return event
    step.cancel()
    return None
