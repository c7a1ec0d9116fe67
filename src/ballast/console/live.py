"""`LiveCluster`: the store followed once per console server, fanned out to every browser.

It lists ``/cluster/`` and ``/topics/`` once into a `ClusterView` (the leader's own
record decoding), then applies every event of one watch per prefix to it — re-listing
after a compaction or a store failure. At most every `frame_seconds`, when something
changed, it computes a `Frame` (broker rows with their scores and load, balance
statistics, the sorted topic index, the move history) through `AdminClient` over that
view, and hands a small `Update` to every subscriber (the server-sent-event streams).
Browsers then read pages of the frame from the API: nothing per browser touches the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from ballast.aio import TaskOwner
from ballast.clock import Clock
from ballast.cluster.admin import AdminClient, BrokerInfo
from ballast.leader.view import BadRecord, ClusterView
from ballast.metadata import MetadataError, MetadataStore, keys
from ballast.metadata.records import RecordKind
from ballast.model import Move

log = logging.getLogger(__name__)

# What a change touches, for the browser's "what to re-read" hint.
_TOPIC_KINDS = {RecordKind.ASSIGNMENT, RecordKind.MARKER, RecordKind.TOPIC}
_BROKER_KINDS = {
    RecordKind.REGISTRATION,
    RecordKind.STATE,
    RecordKind.ASSIGNMENT,
    RecordKind.LOAD,
    RecordKind.LEADER,
    RecordKind.LOAD_BALANCE,
}


@dataclass(frozen=True)
class BrokerRow:
    """A broker as the console shows it: `BrokerInfo` and its latest load report."""

    info: BrokerInfo
    cpu_percent: float | None
    memory_percent: float | None
    throughput_mbps: float | None
    report_age_seconds: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.info.to_dict(),
            "cpu_percent": self.cpu_percent,
            "memory_percent": self.memory_percent,
            "throughput_mbps": self.throughput_mbps,
            "report_age_seconds": self.report_age_seconds,
        }


@dataclass(frozen=True)
class BalanceSample:
    """The balance the leader posted at `timestamp` (``/cluster/load_balance``)."""

    timestamp: float
    cv: float
    mean: float
    std: float
    min: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return {
            "timestamp": self.timestamp,
            "cv": self.cv,
            "mean": self.mean,
            "std": self.std,
            "min": self.min,
            "max": self.max,
        }

    @classmethod
    def from_posted(cls, posted: dict[str, Any] | None) -> BalanceSample | None:
        """The sample in a load_balance record, or None if it has none."""
        if not posted:
            return None
        stats = posted.get("balance")
        ts = posted.get("timestamp")
        if not isinstance(stats, dict) or not isinstance(ts, int | float):
            return None
        try:
            return cls(
                float(ts),
                *(float(stats[k]) for k in ("cv", "mean", "std", "min", "max")),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Frame:
    """What the console shows, computed from the view at one moment."""

    version: int
    timestamp: float
    brokers: tuple[BrokerRow, ...]
    balance: dict[str, Any]
    leader: dict[str, Any] | None
    topics: tuple[str, ...]  # every known topic, sorted
    moves: tuple[Move, ...]  # the persisted history, oldest first

    def summary(self) -> dict[str, Any]:
        states: dict[str, int] = {}
        for row in self.brokers:
            states[row.info.state] = states.get(row.info.state, 0) + 1
        return {
            "version": self.version,
            "timestamp": self.timestamp,
            "brokers": len(self.brokers),
            "broker_states": states,
            "topics": len(self.topics),
            "moves": len(self.moves),
            "leader": (self.leader or {}).get("broker_id"),
            "balance": {k: v for k, v in self.balance.items() if k != "brokers"},
        }


@dataclass(frozen=True)
class Update:
    """What one frame changed, as sent to browsers: re-read what `changed` names."""

    summary: dict[str, Any]
    changed: tuple[str, ...]
    moves: tuple[Move, ...] = ()
    sample: BalanceSample | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "changed": list(self.changed),
            "moves": [m.to_dict() for m in self.moves],
            "sample": self.sample.to_dict() if self.sample is not None else None,
        }


@dataclass
class _Dirty:
    kinds: set[str] = field(default_factory=set)

    def mark(self, *what: str) -> None:
        self.kinds.update(what)


class LiveCluster:
    """The store's watch, a live `ClusterView`, frames and their subscribers."""

    def __init__(
        self,
        store: MetadataStore,
        clock: Clock,
        *,
        admin: AdminClient | None = None,
        frame_seconds: float = 0.25,
        samples: int = 20_000,
        retry_seconds: float = 1.0,
    ) -> None:
        self.store = store
        self.clock = clock
        self.frame_seconds = frame_seconds
        self.retry_seconds = retry_seconds
        self.view = ClusterView()
        base = admin if admin is not None else AdminClient(store, clock)
        # The same operations as the CLI, reading this view instead of listing the store.
        self.admin = AdminClient(base.store, base.clock, base.config, views=self._current)
        self.samples: deque[BalanceSample] = deque(maxlen=samples)
        self.bad_records = 0
        self.ready = asyncio.Event()
        self.frame: Frame | None = None
        self._version = 0
        self._dirty = _Dirty({"brokers", "topics", "history", "balance"})
        self._wake = asyncio.Event()
        self._subscribers: set[asyncio.Queue[Update]] = set()
        self._owner: TaskOwner | None = None

    async def _current(self) -> ClusterView:
        await self.ready.wait()
        return self.view

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._owner = TaskOwner("console")
        await self._owner.open()
        self._owner.spawn(self._follow(), "watch")
        self._owner.spawn(self._frames(), "frames")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            await owner.close(exc_type, exc, tb)

    # -- following the store -------------------------------------------------------------

    async def _follow(self) -> None:
        """List, then follow both watches; re-list after a compaction or a store failure."""
        while True:
            try:
                cluster = await self.store.get_prefix(keys.CLUSTER_PREFIX)
                topics = await self.store.get_prefix(keys.TOPICS_PREFIX)
                view, bad = ClusterView.from_listings(cluster, topics)
                self.bad_records += len(bad)
                self.view = view
                self._note_sample()
                self._changed("brokers", "topics", "history", "balance")
                self.ready.set()
                await self._watch_both(cluster.revision + 1, topics.revision + 1)
            except asyncio.CancelledError:
                raise
            except MetadataError as exc:
                log.warning("console: metadata store: %s; re-listing", exc)
            except _Relist:
                log.info("console: watch compacted; re-listing")
            await self.clock.sleep(self.retry_seconds)

    async def _watch_both(self, cluster_start: int, topics_start: int) -> None:
        """Follow ``/cluster/`` and ``/topics/`` until one of the watches ends or fails."""
        watches = {
            asyncio.ensure_future(self._watch(keys.CLUSTER_PREFIX, cluster_start)),
            asyncio.ensure_future(self._watch(keys.TOPICS_PREFIX, topics_start)),
        }
        try:
            done, _ = await asyncio.wait(watches, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in watches:
                task.cancel()
            await asyncio.wait(watches)
        for task in done:
            task.result()  # re-raise a failure
        raise _Relist  # a watch ended: list again

    async def _watch(self, prefix: str, start: int) -> None:
        watch = self.store.watch_prefix(prefix, start)
        try:
            async for event in watch:
                if event.kind == "compacted":
                    raise _Relist
                if event.kind not in ("put", "delete"):
                    continue
                try:
                    change = self.view.apply(event.kind, event.key, event.value, event.revision)
                except BadRecord as exc:
                    self.bad_records += 1
                    log.debug("console: skipped %s", exc)
                    continue
                if change is not None:
                    self._on_change(change.kind)
        finally:
            close = getattr(watch, "aclose", None)
            if close is not None:
                await close()

    def _on_change(self, kind: RecordKind) -> None:
        what: list[str] = []
        if kind in _BROKER_KINDS:
            what.append("brokers")
        if kind in _TOPIC_KINDS:
            what.append("topics")
        if kind is RecordKind.HISTORY:
            what.append("history")
        if kind is RecordKind.LOAD_BALANCE:
            what.append("balance")
            self._note_sample()
        if what:
            self._changed(*what)

    def _note_sample(self) -> None:
        sample = BalanceSample.from_posted(self.view.load_balance)
        if sample is not None and (
            not self.samples or sample.timestamp > self.samples[-1].timestamp
        ):
            self.samples.append(sample)

    def _changed(self, *what: str) -> None:
        self._dirty.mark(*what)
        self._wake.set()

    # -- frames --------------------------------------------------------------------------

    async def _frames(self) -> None:
        await self.ready.wait()
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self.publish(await self.compute())
            except Exception:  # one bad frame must not end the live view: log, go on
                log.exception("console: computing a frame failed; keeping the last one")
            await self.clock.sleep(self.frame_seconds)

    async def compute(self) -> tuple[Frame, tuple[str, ...]]:
        """A frame of the view as it is now (what did not change is reused).

        The reads go through `AdminClient` over the live view, which never suspends once
        the view is ready: the frame is one consistent picture.
        """
        changed, self._dirty = tuple(sorted(self._dirty.kinds)), _Dirty()
        previous = self.frame
        view = self.view
        now = self.clock.now()
        self._version += 1
        brokers = previous.brokers if previous is not None else ()
        balance = previous.balance if previous is not None else {}
        if previous is None or "brokers" in changed or "balance" in changed:
            brokers = tuple(self._broker_rows(view, await self.admin.brokers(), now))
            balance = (await self.admin.balance()).to_dict()
        topics = previous.topics if previous is not None else ()
        if previous is None or "topics" in changed:
            topics = tuple(sorted(set(view.topics) | set(view.owners) | set(view.markers)))
        moves = previous.moves if previous is not None else ()
        if previous is None or "history" in changed:
            moves = tuple(sorted(view.moves.values(), key=lambda m: (m.timestamp, m.topic)))
        frame = Frame(self._version, now, brokers, balance, view.leader, topics, moves)
        return frame, changed

    @staticmethod
    def _broker_rows(
        view: ClusterView, infos: Iterable[BrokerInfo], now: float
    ) -> Iterable[BrokerRow]:
        for info in infos:
            report = view.reports.get(info.broker_id)
            yield BrokerRow(
                info,
                report.cpu_percent if report is not None else None,
                report.memory_percent if report is not None else None,
                report.total_throughput_mbps if report is not None else None,
                now - report.timestamp if report is not None else None,
            )

    def publish(self, computed: tuple[Frame, tuple[str, ...]]) -> None:
        """Make `frame` current and tell every subscriber what changed."""
        frame, changed = computed
        previous, self.frame = self.frame, frame
        new_moves: tuple[Move, ...] = ()
        if previous is not None and frame.moves is not previous.moves:
            last = previous.moves[-1].timestamp if previous.moves else float("-inf")
            new_moves = tuple(m for m in frame.moves if m.timestamp > last)[-100:]
        sample = self.samples[-1] if self.samples and "balance" in changed else None
        update = Update(frame.summary(), changed, new_moves, sample)
        for queue in list(self._subscribers):
            if queue.full():  # a slow browser skips to the latest update
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
            queue.put_nowait(update)

    async def current_frame(self) -> Frame:
        """The latest frame (computed now if none was published yet)."""
        await self.ready.wait()
        if self.frame is None:
            self.publish(await self.compute())
        assert self.frame is not None
        return self.frame

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[Update]]:
        """A queue of updates for one browser, removed on exit."""
        queue: asyncio.Queue[Update] = asyncio.Queue(maxsize=8)
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def touch(self, *what: str) -> None:
        """Recompute (these parts of) the frame soon, even without a store event (after an
        admin write: the broker rows)."""
        self._changed(*(what or ("brokers",)))


class _Relist(Exception):
    """The watch was compacted: list again."""
