"""Clocks: the one place the shell reads time. The core never does; it receives `now`."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    """Wall-clock seconds (epoch) and an awaitable sleep on the same time base."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """Real time."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """Virtual time for tests and simulations: time moves only when `advance` is called.

    `advance` lets the event loop settle before and after moving time, so a loop that has
    just started does not miss its first tick.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    async def advance(self, seconds: float, settle_rounds: int = 20) -> None:
        """Move time forward by `seconds`, waking sleepers in deadline order."""
        await _settle(settle_rounds)
        target = self._now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, fut = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            if not fut.done():
                fut.set_result(None)
            await _settle(settle_rounds)
        self._now = target
        await _settle(settle_rounds)


async def _settle(rounds: int) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)
