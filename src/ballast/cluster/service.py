"""The service skeleton: an async context manager owning one task group.

Tasks are named ``"<service>/<loop>"``; leaving the context cancels them and waits for
them. A task that crashes cancels the task that entered the context (asyncio.TaskGroup
semantics), so the failure surfaces as an `ExceptionGroup` from the ``async with`` instead
of vanishing. `abandon()` makes the exit skip the graceful clean-up (revoking leases,
resigning leadership, unloading topics): that is how an in-process test or the demo
simulates a crash, after which the store only learns of the death by lease expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from types import TracebackType
from typing import Any, Self

from ballast.clock import Clock
from ballast.metadata import Lease, LeaseNotFoundError, MetadataError, MetadataStore, WatchEvent

log = logging.getLogger(__name__)


class Service:
    """Base class: subclasses start their loops in `_start` and clean up in `_stop`."""

    name: str = "service"

    def __init__(self) -> None:
        self._group: asyncio.TaskGroup | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._abandoned = False

    def spawn(self, coro: Coroutine[Any, Any, Any], loop: str) -> asyncio.Task[Any]:
        """Start one named task in this service's group."""
        if self._group is None:
            coro.close()
            raise RuntimeError(f"{self.name}: spawn() outside of `async with`")
        task = self._group.create_task(coro, name=f"{self.name}/{loop}")
        self._tasks.append(task)
        return task

    def abandon(self) -> None:
        """Exit without clean-up, as if the process had been killed."""
        self._abandoned = True

    @property
    def abandoned(self) -> bool:
        return self._abandoned

    async def _start(self) -> None:
        """Spawn the service's loops (after any set-up that must succeed first)."""

    async def _stop(self) -> None:
        """Graceful clean-up after the loops have stopped (skipped when abandoned)."""

    async def __aenter__(self) -> Self:
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        try:
            await self._start()
        except BaseException as exc:
            await self._close(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._close(exc_type, exc, tb)

    async def _close(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for task in self._tasks:
            task.cancel()
        group, self._group = self._group, None
        try:
            if group is not None:
                await group.__aexit__(exc_type, exc, tb)
        finally:
            self._tasks.clear()
            if not self._abandoned:
                await self._stop()


async def keep_alive(lease: Lease, clock: Clock, what: str) -> None:
    """Refresh `lease` every ttl/3; return once it is lost.

    Lost means the store says the lease no longer exists, or no refresh has succeeded for
    a whole ttl (the store may already have expired it: the owner must assume the worst).
    """
    interval = max(lease.ttl / 3.0, 0.01)
    last_ok = clock.now()
    while True:
        await clock.sleep(interval)
        try:
            # Bounded in real time: a hung call must not outlive the lease unnoticed.
            # (asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that arrives as the call completes, and this loop would then never stop.)
            async with asyncio.timeout(max(interval, 0.5)):
                await lease.refresh()
            last_ok = clock.now()
        except LeaseNotFoundError:
            log.warning("%s: lease %d expired", what, lease.id)
            return
        except (MetadataError, TimeoutError) as exc:
            if clock.now() - last_ok >= lease.ttl:
                log.warning("%s: lease %d not refreshed for %.1fs: lost", what, lease.id, lease.ttl)
                return
            log.warning("%s: lease %d refresh failed, retrying: %s", what, lease.id, exc)


@contextlib.asynccontextmanager
async def watching(
    store: MetadataStore, prefix: str, start_revision: int | None
) -> AsyncIterator[AsyncIterator[WatchEvent]]:
    """A watch that is closed on exit, whatever the store's concrete watch type."""
    watch = store.watch_prefix(prefix, start_revision)
    try:
        yield watch
    finally:
        close = getattr(watch, "aclose", None)
        if close is not None:
            await close()
