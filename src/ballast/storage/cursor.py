"""Subscription cursors: what each subscription of a topic has acknowledged.

A cursor is the last offset up to which everything is acked, plus the offsets acked above
it (Shared and KeyShared consumers ack out of order), kept as sorted inclusive ranges.
Acks are cheap (memory only). A cursor is written to the metadata store at
``keys.subscription_cursor(topic, sub)`` at most every `cursor_flush_seconds`, or sooner
once `cursor_flush_acks` acks piled up, and always on seal (in the sealed state's own
transaction, `flush_with`) and close: a crash loses at most that window, and the
subscription then re-delivers (at-least-once), never skips.

The stored value is ``{"last_acked_offset": N, "acked_above": [[a, b], ...], "timestamp"}``
(a bare integer, as Danube writes, still reads). At most `cursor_ack_ranges` ranges are
written, the lowest ones: one value stays far below etcd's 1.5 MiB request limit, and what
is left out (counted in ``acked_above_dropped`` and `StorageStats.ack_ranges_dropped`) is
delivered again by the next owner, never skipped.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from ballast.aio import LoopTasks
from ballast.clock import Clock
from ballast.metadata import keys
from ballast.metadata.store import MetadataError, MetadataStore, Put
from ballast.model import TopicName
from ballast.storage.config import StorageConfig
from ballast.storage.reservation import TopicFencedError
from ballast.storage.stats import StorageStats
from ballast.storage.ticker import Ticker

__all__ = [
    "AckRanges",
    "CursorError",
    "CursorPosition",
    "SubscriptionCursors",
    "parse_acked_ranges",
    "parse_cursor",
]

log = logging.getLogger(__name__)

# At most this many cursors, of this much JSON, ride in the seal's transaction (with the
# sealed state and the marker's handoff — at most three writes —, far within etcd's 128
# operations and 1.5 MiB per request).
FOLD_MAX_CURSORS = 64
FOLD_MAX_BYTES = 512 * 1024


class CursorError(ValueError):
    """A stored cursor value that cannot be read; names the key."""


def parse_cursor(value: Any, key: str) -> int:
    """The last acked offset stored at `key` (an object, or a bare integer as Danube writes)."""
    offset = value.get("last_acked_offset") if isinstance(value, Mapping) else value
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < -1:
        raise CursorError(f"{key}: expected a last acked offset >= -1, got {value!r}")
    return offset


def parse_acked_ranges(value: Any, last_acked: int, key: str) -> tuple[tuple[int, int], ...]:
    """The ranges acked above `last_acked` stored at `key` (none in a bare integer).

    Ranges at or below the cursor are dropped (acked since); overlapping ones merge.
    """
    raw = value.get("acked_above", ()) if isinstance(value, Mapping) else ()
    if not isinstance(raw, list | tuple):
        raise CursorError(f"{key}: acked_above must be a list of [first, last], got {raw!r}")
    ranges = AckRanges()
    for item in raw:
        if (
            not isinstance(item, list | tuple)
            or len(item) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) for x in item)
            or item[0] > item[1]
        ):
            raise CursorError(f"{key}: acked_above holds {item!r}, not [first, last]")
        ranges.add_range(item[0], item[1])
    ranges.trim(last_acked)
    return ranges.ranges()


@dataclass(frozen=True)
class CursorPosition:
    """Where a subscription resumes: everything up to `last_acked` is acked, and so are
    the offsets of `acked_above` (inclusive ranges, sorted, all above `last_acked`)."""

    last_acked: int
    acked_above: tuple[tuple[int, int], ...] = ()


class AckRanges:
    """A set of offsets as sorted, disjoint, inclusive ranges (acks above a cursor).

    Out-of-order acks mostly extend the last range or fill a hole, so the set stays a few
    ranges however many offsets it holds.
    """

    __slots__ = ("_ends", "_starts")

    def __init__(self, ranges: tuple[tuple[int, int], ...] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for first, last in ranges:
            self.add_range(first, last)

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        i = bisect.bisect_right(self._starts, offset) - 1
        return i >= 0 and self._ends[i] >= offset

    def __len__(self) -> int:
        """The number of ranges."""
        return len(self._starts)

    def add(self, offset: int) -> bool:
        """Add one offset; False if it was there already."""
        if offset in self:
            return False
        self.add_range(offset, offset)
        return True

    def add_range(self, first: int, last: int) -> None:
        """Add `first..last` (inclusive), merging with touching or overlapping ranges."""
        starts, ends = self._starts, self._ends
        lo = bisect.bisect_left(ends, first - 1)  # the first range that touches or follows
        hi = bisect.bisect_right(starts, last + 1)  # past the last range that touches
        if lo < hi:
            first = min(first, starts[lo])
            last = max(last, ends[hi - 1])
        starts[lo:hi] = [first]
        ends[lo:hi] = [last]

    def trim(self, cursor: int) -> None:
        """Forget every offset at or below `cursor` (the cursor passed it)."""
        cut = bisect.bisect_right(self._ends, cursor)
        del self._starts[:cut], self._ends[:cut]
        if self._starts and self._starts[0] <= cursor:
            self._starts[0] = cursor + 1

    def absorb(self, cursor: int) -> int:
        """The cursor past the range that starts right after it (if any), which goes."""
        if self._starts and self._starts[0] == cursor + 1:
            cursor = self._ends[0]
            del self._starts[0], self._ends[0]
        return cursor

    def ranges(self, limit: int | None = None) -> tuple[tuple[int, int], ...]:
        """The ranges in order (the lowest `limit` of them)."""
        n = len(self._starts) if limit is None else min(limit, len(self._starts))
        return tuple(zip(self._starts[:n], self._ends[:n], strict=True))

    def count_from(self, index: int) -> int:
        """How many offsets the ranges from the `index`-th on hold."""
        return sum(e - s + 1 for s, e in zip(self._starts[index:], self._ends[index:], strict=True))


@dataclass
class _Cursor:
    """In-memory state of one subscription's cursor (mutable book-keeping)."""

    acked: int
    above: AckRanges
    changes: int = 0  # acks taken since it was loaded or created
    written: int | None = None  # `changes` as of the last write (None: never written)
    truncated: bool = False  # the last write left ranges out (logged once until it fits)

    @property
    def unwritten(self) -> int:
        return self.changes - (self.written or 0)


def _size_bound(value: dict[str, Any]) -> int:
    """At most this many bytes of JSON for a cursor value, without encoding it (the store
    does that once): a range is two offsets of at most 19 digits, ``[a, b], ``."""
    return 128 + 44 * len(value.get("acked_above", ()))


@dataclass(frozen=True)
class _CursorWrite:
    """One cursor's value to write, and the `changes` it covers."""

    subscription: str
    cursor: _Cursor
    changes: int
    key: str
    value: dict[str, Any]
    dropped: int  # acked offsets left out (`cursor_ack_ranges`)


class SubscriptionCursors:
    """The cursors of one topic; an async context manager owning the flush tasks."""

    def __init__(
        self,
        topic: TopicName,
        metadata: MetadataStore,
        *,
        clock: Clock,
        config: StorageConfig | None = None,
        stats: StorageStats | None = None,
        writer: Callable[[str, Any], Awaitable[None]] | None = None,
        ticker: Ticker | None = None,
    ) -> None:
        """`ticker`: the broker's (its own otherwise), waking the flush of changed cursors."""
        self.topic = topic
        self._metadata = metadata
        # The owner's claim fences cursor writes (`TopicClaim.fenced_put`): a deposed owner
        # must not move the new owner's cursors back.
        self._put = writer or metadata.put
        self._clock = clock
        self._config = config or StorageConfig()
        self._stats = stats or StorageStats()
        self._cursors: dict[str, _Cursor] = {}
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._loops = LoopTasks()
        self._own_ticker = ticker is None
        self._ticker = ticker or Ticker(clock)
        self._name = f"cursors{topic}"

    async def load(self, subscription: str) -> CursorPosition | None:
        """The subscription's position (memory first, then the store), or None."""
        cursor = self._cursors.get(subscription)
        if cursor is not None:
            return CursorPosition(cursor.acked, cursor.above.ranges())
        key = keys.subscription_cursor(self.topic, subscription)
        kv = await self._metadata.get(key)
        if kv is None:
            return None
        try:
            offset = parse_cursor(kv.value, key)
        except CursorError as exc:
            # Restarting from the beginning re-delivers; guessing could skip messages.
            log.error("%s: %s; the subscription starts over", self._name, exc)
            return None
        try:
            above = parse_acked_ranges(kv.value, offset, key)
        except CursorError as exc:
            log.error("%s: %s; what was acked above the cursor comes again", self._name, exc)
            above = ()
        # A concurrent ack may have created the entry while we were reading.
        cursor = self._cursors.setdefault(subscription, _Cursor(offset, AckRanges(above), 0, 0))
        return CursorPosition(cursor.acked, cursor.above.ranges())

    async def forget(self, subscription: str) -> None:
        """Drop the subscription's cursor, in memory and in the store (it expired)."""
        async with self._lock:
            self._cursors.pop(subscription, None)
            await self._metadata.delete_prefix(
                f"{keys.subscriptions_prefix(self.topic)}{subscription}/"
            )

    def get(self, subscription: str) -> int | None:
        """The in-memory cursor, without touching the store."""
        cursor = self._cursors.get(subscription)
        return cursor.acked if cursor is not None else None

    def ack(self, subscription: str, offset: int) -> bool:
        """Record that everything up to `offset` is acked; True if the cursor moved."""
        if offset < -1:
            raise ValueError(f"ack offset must be >= -1, got {offset}")
        keys.subscription_cursor(self.topic, subscription)  # validates the name now
        cursor = self._cursors.get(subscription)
        if cursor is None:
            self._cursors[subscription] = cursor = _Cursor(offset, AckRanges())
        elif offset <= cursor.acked:
            return False
        cursor.above.trim(offset)
        cursor.acked = cursor.above.absorb(offset)
        self._changed(cursor)
        return True

    def ack_above(self, subscription: str, offset: int) -> bool:
        """Record one ack above the cursor (out of order); True if it was new.

        Ignored at or below the cursor, and for a subscription without a cursor here (a
        subscription always has one once it was loaded or created).
        """
        cursor = self._cursors.get(subscription)
        if cursor is None or offset <= cursor.acked or not cursor.above.add(offset):
            return False
        cursor.acked = cursor.above.absorb(cursor.acked)
        self._changed(cursor)
        return True

    def _changed(self, cursor: _Cursor) -> None:
        cursor.changes += 1
        if cursor.unwritten >= self._config.cursor_flush_acks:
            self._wake.set()
        else:  # written at the broker's next tick (no timer of the topic's own)
            self._ticker.soon(self._config.cursor_flush_seconds, self._wake)

    async def flush(self) -> int:
        """Write every cursor that changed since its last write; returns how many."""
        async with self._lock:
            writes = self._changed_writes()
            await self._write_each(writes)
        return len(writes)

    async def flush_with(self, write: Callable[[Sequence[Put]], Awaitable[bool]]) -> bool:
        """Write every changed cursor in `write`'s transaction (the seal's: one round trip
        less on a move's path); returns what `write` returned.

        When the cursors would take a transaction past `FOLD_MAX_CURSORS` writes or
        `FOLD_MAX_BYTES` (etcd allows 128 operations and 1.5 MiB per request), they are
        written first, one by one as `flush` does, and `write` gets none.
        """
        async with self._lock:
            writes = self._changed_writes()
            size = sum(_size_bound(w.value) for w in writes)
            if len(writes) > FOLD_MAX_CURSORS or size > FOLD_MAX_BYTES:
                await self._write_each(writes)
                writes = []
            done = await write([Put(w.key, w.value) for w in writes])
            if done:
                for each in writes:
                    self._written(each)
            return done

    async def _write_each(self, writes: list[_CursorWrite]) -> None:
        for each in writes:
            await self._put(each.key, each.value)
            self._written(each)

    def _changed_writes(self) -> list[_CursorWrite]:
        """The write of every cursor changed since its last one (under `_lock`)."""
        out = []
        limit = self._config.cursor_ack_ranges
        for subscription, cursor in self._cursors.items():
            if cursor.written == cursor.changes:
                continue
            value: dict[str, Any] = {
                "last_acked_offset": cursor.acked,
                "timestamp": self._clock.now(),
            }
            if cursor.above:
                value["acked_above"] = [list(r) for r in cursor.above.ranges(limit)]
            dropped = cursor.above.count_from(limit) if len(cursor.above) > limit else 0
            if dropped:
                value["acked_above_dropped"] = dropped
            key = keys.subscription_cursor(self.topic, subscription)
            out.append(_CursorWrite(subscription, cursor, cursor.changes, key, value, dropped))
        return out

    def _written(self, write: _CursorWrite) -> None:
        cursor, dropped = write.cursor, write.dropped
        cursor.written = write.changes
        self._stats.cursor_flushes += 1
        if dropped:
            self._stats.ack_ranges_dropped += dropped
            if not cursor.truncated:
                log.warning(
                    "%s: subscription %s has %d ranges acked above its cursor %d; "
                    "only the lowest %d are kept (cursor_ack_ranges), %d acked "
                    "offsets above them would be delivered again after a move",
                    self._name, write.subscription, len(cursor.above),
                    write.value["last_acked_offset"], self._config.cursor_ack_ranges, dropped,
                )  # fmt: skip
        cursor.truncated = bool(dropped)

    async def __aenter__(self) -> Self:
        self._ticker.start(self._config.cursor_flush_seconds)
        await self._loops.start({f"{self._name}/flush": self._loop()})
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._ticker.forget(self._wake)
        if self._own_ticker:
            await self._ticker.close()
        try:
            await self._loops.stop(exc_type, exc, tb)
        finally:
            try:
                await self.flush()
            except (MetadataError, TopicFencedError) as flush_exc:
                log.error("%s: final cursor flush failed: %s", self._name, flush_exc)

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
            except MetadataError as exc:
                # The cursors stay dirty and go out with the next tick.
                log.warning("%s: cursor flush failed, will retry: %s", self._name, exc)
                self._ticker.soon(self._config.cursor_flush_seconds, self._wake)
            except TopicFencedError as exc:
                log.warning("%s: %s; cursors are no longer written here", self._name, exc)
                return
