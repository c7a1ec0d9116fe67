"""Small asyncio helpers shared by the services."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from types import TracebackType
from typing import Any

from ballast.clock import Clock


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


async def tick(clock: Clock, seconds: float, wake: asyncio.Event) -> None:
    """Set `wake` every `seconds` on `clock`, forever: the timer half of a loop that runs
    on a period or as soon as someone sets the event."""
    while True:
        await clock.sleep(seconds)
        wake.set()


class LoopTasks:
    """A task group of named, never-ending loops that is cancelled (and awaited) on exit.

    The loops sleep on an injected clock that may never move again, so stopping cancels
    them; a loop that crashed surfaces as the task group's ExceptionGroup.
    """

    def __init__(self) -> None:
        self._group: asyncio.TaskGroup | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, loops: Mapping[str, Coroutine[Any, Any, None]]) -> None:
        """Start every loop under its name."""
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        self._tasks = [self._group.create_task(c, name=name) for name, c in loops.items()]

    async def stop(
        self,
        exc_type: type[BaseException] | None = None,
        exc: BaseException | None = None,
        tb: TracebackType | None = None,
    ) -> None:
        """Cancel the loops and wait for them, passing on the owner's exit exception."""
        for task in self._tasks:
            task.cancel()
        group, self._group = self._group, None
        if group is not None:
            await group.__aexit__(exc_type, exc, tb)
