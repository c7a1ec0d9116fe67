"""Subscription cursors: the last acknowledged offset of each subscription of a topic.

Acks are cumulative and cheap (memory only). A cursor is written to the metadata store at
``keys.subscription_cursor(topic, sub)`` at most every `cursor_flush_seconds`, or sooner
once `cursor_flush_acks` acks piled up, and always on seal and close: a crash loses at
most that window, and the subscription then re-delivers (at-least-once), never skips.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from ballast.aio import LoopTasks, tick
from ballast.clock import Clock
from ballast.metadata import keys
from ballast.metadata.store import MetadataError, MetadataStore
from ballast.model import TopicName
from ballast.storage.config import StorageConfig
from ballast.storage.reservation import TopicFencedError
from ballast.storage.stats import StorageStats

__all__ = ["CursorError", "SubscriptionCursors", "parse_cursor"]

log = logging.getLogger(__name__)


class CursorError(ValueError):
    """A stored cursor value that cannot be read; names the key."""


def parse_cursor(value: Any, key: str) -> int:
    """The last acked offset stored at `key` (an object, or a bare integer as Danube writes)."""
    offset = value.get("last_acked_offset") if isinstance(value, Mapping) else value
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < -1:
        raise CursorError(f"{key}: expected a last acked offset >= -1, got {value!r}")
    return offset


@dataclass
class _Cursor:
    """In-memory state of one subscription's cursor (mutable book-keeping)."""

    acked: int
    persisted: int | None
    acks_since_flush: int = 0


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
    ) -> None:
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
        self._name = f"cursors{topic}"

    async def load(self, subscription: str) -> int | None:
        """The subscription's last acked offset (memory first, then the store), or None."""
        cursor = self._cursors.get(subscription)
        if cursor is not None:
            return cursor.acked
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
        # A concurrent ack may have created the entry while we were reading.
        cursor = self._cursors.setdefault(subscription, _Cursor(offset, offset))
        return cursor.acked

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
            self._cursors[subscription] = cursor = _Cursor(offset, None)
        elif offset <= cursor.acked:
            return False
        cursor.acked = offset
        cursor.acks_since_flush += 1
        if cursor.acks_since_flush >= self._config.cursor_flush_acks:
            self._wake.set()
        return True

    async def flush(self) -> int:
        """Write every cursor that moved since its last write; returns how many."""
        written = 0
        async with self._lock:
            for subscription, cursor in list(self._cursors.items()):
                acked = cursor.acked
                if cursor.persisted == acked:
                    continue
                key = keys.subscription_cursor(self.topic, subscription)
                value = {"last_acked_offset": acked, "timestamp": self._clock.now()}
                await self._put(key, value)
                cursor.persisted = acked
                cursor.acks_since_flush = 0
                written += 1
        if written:
            self._stats.cursor_flushes += written
        return written

    async def __aenter__(self) -> Self:
        await self._loops.start(
            {
                f"{self._name}/flush": self._loop(),
                f"{self._name}/timer": tick(
                    self._clock, self._config.cursor_flush_seconds, self._wake
                ),
            }
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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
            except TopicFencedError as exc:
                log.warning("%s: %s; cursors are no longer written here", self._name, exc)
                return
