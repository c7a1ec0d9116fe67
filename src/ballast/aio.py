"""Small asyncio helpers shared by the services."""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Awaitable, Coroutine, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

from ballast.clock import Clock

log = logging.getLogger(__name__)

_A = TypeVar("_A")
_B = TypeVar("_B")


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel `task` and wait for it to end.

    The task's own CancelledError is absorbed, but if the *caller* is being cancelled
    while it waits, that cancellation propagates (a plain `suppress(CancelledError)`
    would swallow it and leave the caller running).
    """
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def both(first: Awaitable[_A], second: Awaitable[_B]) -> tuple[_A, _B]:
    """Await two things at once; both end before either's failure is raised (unlike a
    plain gather, which leaves the other running when the first fails)."""
    a, b = await asyncio.gather(first, second, return_exceptions=True)
    if isinstance(a, BaseException):
        raise a
    if isinstance(b, BaseException):
        raise b
    return a, b


async def tick(clock: Clock, seconds: float, wake: asyncio.Event) -> None:
    """Set `wake` every `seconds` on `clock`, forever: the timer half of a loop that runs
    on a period or as soon as someone sets the event."""
    while True:
        await clock.sleep(seconds)
        wake.set()


class TaskOwner:
    """The one way a component owns asyncio tasks: a task group of named tasks.

    `open()` starts the group, `spawn(coro, name)` starts a task named ``"<owner>/<name>"``,
    `close()` cancels every task and waits for them, re-raising a crash as the task group's
    `ExceptionGroup` (a crashed task is never silently gone), or, for a task started with
    `spawn_contained`, logging its failure and letting the others go on. Services
    (`cluster.service`), periodic loops (`LoopTasks`), `LocalCluster`, the console and
    the data-plane host (openings, readers, relays, its sweep) all own their tasks
    through it. Bare tasks remain only where one call awaits them itself (the gateway's
    stream pumps, a claim's in-flight extension), as futures of that call, and in the
    broker's write-ahead log (`storage.log.BrokerLog`: opened by whichever topic comes
    first, closed by the host, so no one caller's task group could own them).
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._group: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def running(self) -> bool:
        return self._group is not None

    async def open(self) -> None:
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Start one named task in the group."""
        if self._group is None:
            coro.close()
            raise RuntimeError(f"{self.owner}: spawn() before open() or after close()")
        full = f"{self.owner}/{name}" if self.owner else name
        task = self._group.create_task(coro, name=full)
        self._tasks.add(task)
        task.add_done_callback(self._forget)
        return task

    def spawn_contained(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Start one named task whose failure is its own: logged, not the owner's end.

        For work on one item (a topic's opening, a subscription's reader, a moved
        consumer's relay) that must not stop the owner's other work when it fails.
        """
        if self._group is None:
            coro.close()
            raise RuntimeError(f"{self.owner}: spawn() before open() or after close()")
        full = f"{self.owner}/{name}" if self.owner else name
        return self.spawn(_contained(coro, full), name)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        # Per-item tasks come and go for the owner's whole life: keep only the running.
        self._tasks.discard(task)

    async def close(
        self,
        exc_type: type[BaseException] | None = None,
        exc: BaseException | None = None,
        tb: TracebackType | None = None,
        *,
        cancel: bool = True,
    ) -> None:
        """Cancel the tasks (unless `cancel` is False: then wait for them to end) and wait,
        passing on the owner's exit exception."""
        if cancel:
            for task in list(self._tasks):
                task.cancel()
        group, self._group = self._group, None
        try:
            if group is not None:
                await group.__aexit__(exc_type, exc, tb)
        finally:
            self._tasks.clear()


async def _contained(coro: Coroutine[Any, Any, Any], name: str) -> None:
    try:
        await coro
    except Exception:
        log.exception("task %s failed", name)


async def first_completed(owner: str, tasks: Mapping[str, Coroutine[Any, Any, Any]]) -> None:
    """Run named tasks (a `TaskOwner`) until the first one ends, then cancel the others.

    A task that crashes surfaces as the task group's `ExceptionGroup`.
    """
    group = TaskOwner(owner)
    await group.open()
    try:
        started = [group.spawn(coro, name) for name, coro in tasks.items()]
        await asyncio.wait(started, return_when=asyncio.FIRST_COMPLETED)
    except BaseException as exc:
        await group.close(type(exc), exc, exc.__traceback__)
        raise
    await group.close()


class LoopTasks:
    """A `TaskOwner` of named, never-ending loops that is cancelled (and awaited) on exit.

    The loops sleep on an injected clock that may never move again, so stopping cancels
    them; a loop that crashed surfaces as the task group's ExceptionGroup.
    """

    def __init__(self) -> None:
        self._owner = TaskOwner("")  # the loops' names are used as given

    async def start(self, loops: Mapping[str, Coroutine[Any, Any, None]]) -> None:
        """Start every loop under its name."""
        await self._owner.open()
        for name, coro in loops.items():
            self._owner.spawn(coro, name)

    async def stop(
        self,
        exc_type: type[BaseException] | None = None,
        exc: BaseException | None = None,
        tb: TracebackType | None = None,
    ) -> None:
        """Cancel the loops and wait for them, passing on the owner's exit exception."""
        await self._owner.close(exc_type, exc, tb)


class Served(abc.ABC):
    """A service used as `async with service:`: started on entry, stopped on exit (also
    when the block raises)."""

    @abc.abstractmethod
    async def start(self) -> str:
        """Start serving; returns the address it serves on."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop serving."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
