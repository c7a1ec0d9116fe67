"""Test helpers: a fault-injecting object store and a topic factory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from ballast.clock import Clock, FakeClock
from ballast.metadata.store import MetadataStore
from ballast.storage import (
    CommitStream,
    ObjectStore,
    ObjectStoreError,
    ReliableTopic,
    StorageConfig,
    StorageStats,
    TieredRecord,
)
from ballast.storage.objects import StoredObject
from ballast.storage.retention import RetentionPolicies
from ballast.storage.ticker import Ticker


class FlakyObjectStore:
    """Wraps a real store and fails the next `fail_puts` puts (and `fail_gets` gets).

    A fault injector around the real component, not a mock: successful calls go through.
    """

    def __init__(self, inner: ObjectStore, fail_puts: int = 0, fail_gets: int = 0) -> None:
        self.inner = inner
        self.fail_puts = fail_puts
        self.fail_gets = fail_gets
        self.puts = 0
        self.failed = 0

    @property
    def url(self) -> str:
        return self.inner.url

    async def put(self, name: str, data: bytes) -> None:
        if self.fail_puts > 0:
            self.fail_puts -= 1
            self.failed += 1
            raise ObjectStoreError(f"injected failure writing {name}")
        self.puts += 1
        await self.inner.put(name, data)

    async def get(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        if self.fail_gets > 0:
            self.fail_gets -= 1
            self.failed += 1
            raise ObjectStoreError(f"injected failure reading {name}")
        return await self.inner.get(name, start, end)

    async def delete(self, name: str) -> None:
        await self.inner.delete(name)

    async def list(self, prefix: str) -> list[StoredObject]:
        return await self.inner.list(prefix)


def make_topic(
    broker: str,
    root: Path,
    *,
    objects: ObjectStore,
    metadata: MetadataStore,
    clock: Clock,
    config: StorageConfig,
    topic: str = "/default/reliable_topic",
    stats: StorageStats | None = None,
    stream: CommitStream | None = None,
    ticker: Ticker | None = None,
    policies: RetentionPolicies | None = None,
) -> ReliableTopic:
    """A topic on `broker`, whose local WAL directory is ``root/broker``."""
    return ReliableTopic(
        topic,
        broker_id=broker,
        data_dir=root / broker,
        objects=objects,
        metadata=metadata,
        clock=clock,
        config=config,
        stats=stats,
        stream=stream,
        ticker=ticker,
        policies=policies,
    )


async def collect(stream: AsyncIterator[TieredRecord]) -> list[TieredRecord]:
    """Drain a (non-live) stream."""
    return [item async for item in stream]


def payload(offset: int) -> bytes:
    """The payload tests write at `offset` (so reads can be checked by content)."""
    return f"message-{offset}".encode()


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait (real time) until `condition()` holds: worker threads finish on their own time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


T = TypeVar("T")


async def advancing(clock: FakeClock, awaitable: Awaitable[T], step: float = 1.0) -> T:
    """Await `awaitable` while moving the fake clock (retries back off on it)."""
    task = asyncio.ensure_future(awaitable)
    for _ in range(500):
        if task.done():
            break
        await clock.advance(step)
        await asyncio.sleep(0.005)
    return await task
