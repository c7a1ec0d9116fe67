"""Small asyncio helpers shared by the services."""

from __future__ import annotations

import asyncio
from typing import Any


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
