"""The leader's policy as a pure state machine: events in, ordered effects out.

`LeaderMachine.step(event) -> Ready`; the live leader (`cluster.load_manager`), the
simulator (`simulate.engine`) and the scripted tests (`tests/leader/testdata`) drive it.
In parts: `effects` (events and effects), `machine` (the entry point, learning, booking
outcomes), `rounds` (the round's steps), `state` (what a term knows: the view, history,
estimates, snapshots and rankings), `intents` (what a round decided to write),
`transactions` (intents into guarded writes), `view` and `records` (the cluster's
records, decoded).
"""

from ballast.leader.effects import (
    Bootstrap,
    Event,
    HistoryRecord,
    LogLine,
    MetricDelta,
    PostRankings,
    Ready,
    Refreshed,
    Tick,
    Watched,
    Write,
    WriteDone,
    effects_text,
)
from ballast.leader.machine import LeaderMachine

__all__ = [
    "Bootstrap",
    "Event",
    "HistoryRecord",
    "LeaderMachine",
    "LogLine",
    "MetricDelta",
    "PostRankings",
    "Ready",
    "Refreshed",
    "Tick",
    "Watched",
    "Write",
    "WriteDone",
    "effects_text",
]
