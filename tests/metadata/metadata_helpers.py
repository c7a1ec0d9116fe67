"""Small async helpers shared by the metadata tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from ballast.metadata import WatchEvent

EVENT_TIMEOUT = 5.0


async def next_event(
    watch: AsyncIterator[WatchEvent], timeout: float = EVENT_TIMEOUT
) -> WatchEvent:
    """The next event, failing the test if none arrives within `timeout`."""
    return await asyncio.wait_for(anext(watch), timeout)


async def take(
    watch: AsyncIterator[WatchEvent], count: int, timeout: float = EVENT_TIMEOUT
) -> list[WatchEvent]:
    """Exactly the next `count` events (each within `timeout`)."""
    return [await next_event(watch, timeout) for _ in range(count)]


async def assert_quiet(watch: AsyncIterator[WatchEvent], seconds: float = 0.3) -> None:
    """Fail if the watch yields anything within `seconds` (no duplicate or stray event)."""
    try:
        event = await asyncio.wait_for(anext(watch), seconds)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected extra event {event}")


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout: float, interval: float = 0.05
) -> float:
    """Poll `check` until true; returns the seconds it took, fails after `timeout`."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        if await check():
            return loop.time() - start
        if loop.time() - start > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)
