"""The service skeleton: an async context manager owning its tasks (`aio.TaskOwner`).

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

from ballast.aio import TaskOwner
from ballast.metadata import Lease, LeaseNotFoundError, MetadataStore, WatchEvent

log = logging.getLogger(__name__)


class Service:
    """Base class: subclasses start their loops in `_start` and clean up in `_stop`."""

    name: str = "service"

    def __init__(self) -> None:
        self._owner: TaskOwner | None = None
        self._abandoned = False

    def spawn(self, coro: Coroutine[Any, Any, Any], loop: str) -> asyncio.Task[Any]:
        """Start one named task (``"<service>/<loop>"``) in this service's group."""
        if self._owner is None:
            coro.close()
            raise RuntimeError(f"{self.name}: spawn() outside of `async with`")
        return self._owner.spawn(coro, loop)

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
        self._owner = TaskOwner(self.name)
        await self._owner.open()
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
        owner, self._owner = self._owner, None
        try:
            if owner is not None:
                await owner.close(exc_type, exc, tb)
        finally:
            if not self._abandoned:
                await self._stop()


async def keep_alive(lease: Lease, what: str) -> None:
    """Keep `lease` alive; return once it is lost (`Lease.keep_alive_forever`'s rules).

    Lost means the store says the lease no longer exists, or no refresh has succeeded for
    a whole ttl (the store may already have expired it: the owner must assume the worst).
    """
    try:
        await lease.keep_alive_forever(lost_after=lease.ttl)
    except LeaseNotFoundError as exc:
        log.warning("%s: lease %d lost: %s", what, lease.id, exc)


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
