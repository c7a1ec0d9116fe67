"""A broker-wide bound on object writes per second, shared by every topic's uploader.

Object stores bill and throttle per request, so what matters is a broker's writes per
second, not a topic's. Each uploader takes a turn before building its next object; while
it waits, its sends keep arriving and go into that object. So with many busy topics the
objects get fuller, not more numerous, and a lone topic under the bound never waits.
"""

from __future__ import annotations

import asyncio

__all__ = ["WritePacer"]


class WritePacer:
    """Turns spaced ``1 / per_second`` apart, first come first served."""

    def __init__(self, per_second: float) -> None:
        if not per_second > 0:
            raise ValueError(f"object writes per second: must be > 0, got {per_second!r}")
        self.interval = 1.0 / per_second
        self._next = 0.0  # loop time of the next free turn

    async def turn(self) -> bool:
        """Wait for this caller's turn to write one object; True if it had to wait."""
        now = asyncio.get_running_loop().time()
        at = max(now, self._next)
        self._next = at + self.interval
        if at <= now:
            return False
        await asyncio.sleep(at - now)
        return True
