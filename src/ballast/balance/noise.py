"""Rules that keep noise from moving topics (Ballast additions to the reference rules).

Three rules, each a pure function the rebalancing decision consults:

- `spread_hold`: no move while the spread of the active brokers' scores (max - min) is
  below an absolute floor, however large the CV of tiny numbers may be (three idle brokers
  at 0.4 / 0.6 / 0.9 have a CV of 30 %, yet nothing there is worth a move);
- `overshoots`: a move must not fix more than the imbalance it is meant to fix: the source
  must not end up below the target (otherwise the next reading, or a little noise, moves
  the topic back);
- `is_return`: a topic never moves back to the broker it left within
  `return_window_seconds` (a hard guarantee against ping-pong, whatever the readings).
"""

from __future__ import annotations

from collections.abc import Mapping

from ballast.balance.history import MoveHistory
from ballast.balance.imbalance import Imbalance
from ballast.config import RebalancingConfig
from ballast.model import BrokerId

EPSILON = 1e-9


def spread_hold(stats: Imbalance, config: RebalancingConfig) -> str | None:
    """Why the spread of scores is too small to act on, or None when it is not."""
    spread = stats.max - stats.min
    if spread < config.min_imbalance:
        return (
            f"score spread {spread:.2f} (max {stats.max:.2f} - min {stats.min:.2f}) is below "
            f"min_imbalance {config.min_imbalance:.2f}"
        )
    return None


def overshoots(after: Mapping[BrokerId, float], source: BrokerId, target: BrokerId) -> bool:
    """True if, after the move, the source would score below the target."""
    return after[source] < after[target] - EPSILON


def is_return(
    history: MoveHistory, topic: str, target: BrokerId, now: float, window: float
) -> bool:
    """True if `topic` left `target` less than `window` seconds before `now`."""
    return any(
        m.topic == topic and m.from_broker == target and now - m.timestamp < window
        for m in history.moves
    )
