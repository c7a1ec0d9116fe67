"""`Turns`: background work of a broker's topics, one topic at a time, nobody waiting.

A topic's uploader loop both writes its sends and merges its small objects. Merging reads
objects, which costs the broker's CPU: 32 topics moved together, each merging at once what
it brought, held every send on the receiving broker for 0.65 s. So one topic reads for a
merge at a time. A loop that finds the turn taken must not wait for it (its sends would
wait too): it is queued and its wake event set when the turn comes to it.
"""

from __future__ import annotations

import asyncio

__all__ = ["Turns"]


class Turns:
    """One holder at a time; the others queued in order, each woken for its turn."""

    def __init__(self) -> None:
        self._holder: asyncio.Event | None = None
        self._offered: asyncio.Event | None = None  # woken for the turn, not yet back
        self._queue: dict[asyncio.Event, None] = {}  # in arrival order, each once

    @property
    def waiting(self) -> int:
        """How many are queued for a turn."""
        return len(self._queue)

    def take(self, who: asyncio.Event) -> bool:
        """The turn for `who` (True), or `who` queued to be set when it comes (False)."""
        if self._holder is not None and self._holder is not who:
            self._queue.setdefault(who)
            return False
        self._holder = who
        self._queue.pop(who, None)
        if self._offered is who:
            self._offered = None
        return True

    def give_back(self, who: asyncio.Event) -> None:
        """`who` is done with its turn (a no-op if it does not hold it)."""
        if self._holder is who:
            self._holder = None
            self._offer()

    def forget(self, who: asyncio.Event) -> None:
        """`who` wants no turn (it has nothing to do, or it stopped): dropped from the
        queue, and a turn offered to it goes to the next."""
        self._queue.pop(who, None)
        if self._holder is who:
            self._holder = None
            self._offer()
        elif self._offered is who:
            self._offered = None
            if self._holder is None:
                self._offer()

    def _offer(self) -> None:
        self._offered = None
        if self._queue:
            who = next(iter(self._queue))
            del self._queue[who]
            self._offered = who
            who.set()
