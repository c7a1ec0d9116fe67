"""The move history as the core sees it: rate limit and cooldowns are derived from it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ballast.model import Move

HOUR = 3600.0


@dataclass(frozen=True)
class MoveHistory:
    """Moves ordered by timestamp (the persisted `/cluster/rebalancing_history/`)."""

    moves: tuple[Move, ...] = ()

    @classmethod
    def of(cls, moves: Iterable[Move]) -> MoveHistory:
        return cls(tuple(sorted(moves, key=lambda m: m.timestamp)))

    def add(self, move: Move) -> MoveHistory:
        return MoveHistory.of((*self.moves, move))

    def in_window(self, now: float, window: float = HOUR) -> tuple[Move, ...]:
        """Moves with `now - window < timestamp <= now`."""
        return tuple(m for m in self.moves if now - window < m.timestamp <= now)

    def last_move_at(self) -> float | None:
        return self.moves[-1].timestamp if self.moves else None

    def cooldown_left(self, now: float, cooldown: float) -> float:
        """Seconds until the global cooldown after the last move has passed."""
        last = self.last_move_at()
        return 0.0 if last is None else max(0.0, last + cooldown - now)

    def next_rate_slot(self, now: float, max_per_hour: int) -> float:
        """Seconds until one more move fits the hourly limit (0 if it fits now)."""
        recent = self.in_window(now)
        if len(recent) < max_per_hour:
            return 0.0
        if max_per_hour <= 0:
            return float("inf")
        return recent[len(recent) - max_per_hour].timestamp + HOUR - now

    def recently_moved(self, now: float, window: float) -> frozenset[str]:
        """Topics moved within the last `window` seconds (per-topic cooldown)."""
        return frozenset(m.topic for m in self.moves if now - m.timestamp < window)
