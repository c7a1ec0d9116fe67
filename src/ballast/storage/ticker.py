"""`Ticker`: one timer per broker for the periodic work of all its topics' storage.

Each topic's cursors are written every `cursor_flush_seconds` and its uploader merges,
collects and applies retention every `upload_interval_seconds`. With a timer per topic
each, ten thousand idle topics wake the broker thousands of times a second to find
nothing to do. Instead a topic asks to be woken at the next tick when it has something
pending (`soon`: an ack not written yet, small objects to merge, objects to collect or
retain); one task per period sets the events asked for since the previous tick and goes
back to sleep. An idle topic asks nothing: it costs memory only.
"""

from __future__ import annotations

import asyncio

from ballast.aio import cancel_and_wait
from ballast.clock import Clock

__all__ = ["Ticker"]


class Ticker:
    """Wakes what asked at the next tick of its period (on `clock`)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._pending: dict[float, set[asyncio.Event]] = {}
        self._tasks: dict[float, asyncio.Task[None]] = {}
        self._closed = False

    def start(self, seconds: float) -> None:
        """Run the timer of this period (a no-op if it runs): a component starts its
        periods when it starts, so that a tick comes within one period of any request."""
        if seconds in self._tasks or self._closed:
            return
        self._pending.setdefault(seconds, set())
        self._tasks[seconds] = asyncio.get_running_loop().create_task(
            self._run(seconds), name=f"ticker/{seconds:g}s"
        )

    def soon(self, seconds: float, wake: asyncio.Event) -> None:
        """Set `wake` at the next tick of the `seconds` period."""
        self.start(seconds)
        if not self._closed:
            self._pending[seconds].add(wake)

    def forget(self, wake: asyncio.Event) -> None:
        """Drop `wake` from every pending tick (its owner stopped)."""
        for events in self._pending.values():
            events.discard(wake)

    @property
    def pending(self) -> int:
        """Events waiting for a tick (what the next ticks will wake)."""
        return sum(len(events) for events in self._pending.values())

    async def _run(self, seconds: float) -> None:
        while True:
            await self._clock.sleep(seconds)
            due, self._pending[seconds] = self._pending[seconds], set()
            for event in due:
                event.set()

    async def close(self) -> None:
        """Stop every timer; nothing is woken any more."""
        self._closed = True
        tasks = list(self._tasks.values())
        self._tasks.clear()
        self._pending.clear()
        for task in tasks:
            await cancel_and_wait(task)
