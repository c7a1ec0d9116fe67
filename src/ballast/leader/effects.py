"""What the leader state machine is fed (events) and what it asks for (effects).

Everything here is a frozen value: the machine never awaits, reads a clock or touches the
store; the shell (`cluster.load_manager.LeaderSession`, the simulator, a scripted test)
performs the effects of a `Ready` in the order of its fields and feeds every write's
outcome back as a `WriteDone`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from ballast.balance import Decision
from ballast.metadata import Compare, Delete, Listing, Put, WatchEvent
from ballast.model import BrokerMode, LoadReport, Move

# -- events ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bootstrap:
    """The listings of ``/cluster/`` and ``/topics/`` a term starts from."""

    cluster: Listing
    topics: Listing
    now: float


@dataclass(frozen=True)
class Watched:
    """Watch events (both prefixes), in the order the store delivered them."""

    events: tuple[WatchEvent, ...]
    now: float


@dataclass(frozen=True)
class Tick:
    """Time passed: rebalancing checks, rankings, seal timeouts are due on ticks."""

    now: float


@dataclass(frozen=True)
class Refreshed:
    """One key as read again after a failed write (`present` False: the key is absent)."""

    key: str
    value: Any = None
    mod_revision: int = 0
    present: bool = True
    undecodable: bool = False


@dataclass(frozen=True)
class WriteDone:
    """The outcome of `Write` `id`. A failure carries the written and compared keys as they
    are now (the fence held: a lost fence ends the term in the shell, not here)."""

    id: int
    succeeded: bool
    revision: int
    now: float
    refreshed: tuple[Refreshed, ...] = ()


Event = Bootstrap | Watched | Tick | WriteDone

# -- effects -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Write:
    """A transaction; the shell adds the term's fence to `compares` and performs it."""

    id: int
    compares: tuple[Compare, ...]
    ops: tuple[Put | Delete, ...]
    what: str

    def touched_keys(self) -> tuple[str, ...]:
        """The keys to read again if the write fails (written, then compared)."""
        return tuple(dict.fromkeys([*(op.key for op in self.ops), *(c.key for c in self.compares)]))


@dataclass(frozen=True)
class PostRankings:
    """Rankings and balance statistics to post (fenced) at ``/cluster/load_balance``."""

    payload: dict[str, Any]


@dataclass(frozen=True)
class HistoryRecord:
    """A load report to append to the load-history sink (the data pipeline's input)."""

    report: LoadReport
    mode: BrokerMode


@dataclass(frozen=True)
class MetricDelta:
    """A metric to change: `inc` a counter (by `value`) or `observe` a histogram."""

    name: str
    value: float = 1.0
    labels: tuple[tuple[str, str], ...] = ()
    kind: Literal["inc", "observe", "balance"] = "inc"
    extra: Any = None


@dataclass(frozen=True)
class LogLine:
    """A log line; `note` lines are also control-plane events an operator sees."""

    message: str
    level: int = logging.INFO
    note: bool = False


@dataclass(frozen=True)
class Ready:
    """Effects to perform, in this order: writes (each outcome fed back), rankings,
    history records, metrics, log lines.

    It also tells what the step decided, for whoever drives the machine (the admin, the
    simulator) to keep without reading the machine's insides: `decision`, the rebalancing
    decision of a check made in this step, and `moved`, the moves whose write succeeded."""

    writes: tuple[Write, ...] = ()
    rankings: PostRankings | None = None
    history: tuple[HistoryRecord, ...] = ()
    metrics: tuple[MetricDelta, ...] = ()
    logs: tuple[LogLine, ...] = ()
    decision: Decision | None = None
    moved: tuple[Move, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.writes or self.rankings or self.history or self.metrics or self.logs)


@dataclass
class Collector:
    """Mutable builder of one `Ready` (internal to a step)."""

    writes: list[Write] = field(default_factory=list)
    rankings: PostRankings | None = None
    history: list[HistoryRecord] = field(default_factory=list)
    metrics: list[MetricDelta] = field(default_factory=list)
    logs: list[LogLine] = field(default_factory=list)
    decision: Decision | None = None
    moved: list[Move] = field(default_factory=list)

    def metric(self, name: str, value: float = 1.0, **labels: str) -> None:
        self.metrics.append(MetricDelta(name, value, tuple(sorted(labels.items()))))

    def reject(self, kind: str) -> None:
        self.metric("rejected", kind=kind)

    def log(self, message: str, level: int = logging.INFO) -> None:
        self.logs.append(LogLine(message, level))

    def note(self, message: str) -> None:
        self.logs.append(LogLine(message, logging.INFO, note=True))

    def ready(self) -> Ready:
        return Ready(
            tuple(self.writes),
            self.rankings,
            tuple(self.history),
            tuple(self.metrics),
            tuple(self.logs),
            self.decision,
            tuple(self.moved),
        )


def effects_text(ready: Ready) -> list[str]:
    """A stable one-line-per-effect rendering (scripted tests, replay comparisons)."""
    lines: list[str] = []
    for w in ready.writes:
        lines.append(f"write {w.id}: {w.what}")
        lines += [f"  if {_compare_text(c)}" for c in w.compares]
        lines += [f"  {_op_text(op)}" for op in w.ops]
    if ready.rankings is not None:
        order = [e["broker_id"] for e in ready.rankings.payload["rankings"]]
        lines.append(f"rankings: {' '.join(order)}")
    lines += [f"history: {h.report.broker_id}" for h in ready.history]
    for m in ready.metrics:
        if m.kind == "inc":
            labels = ",".join(f"{k}={v}" for k, v in m.labels)
            lines.append(f"metric {m.name}{{{labels}}} +{m.value:g}")
    lines += [f"{'note' if line.note else 'log'}: {line.message}" for line in ready.logs]
    return lines


def _compare_text(c: Compare) -> str:
    if c.target == "version" and c.op == "==" and c.operand == 0:
        return f"absent {c.key}"
    if c.target == "version" and c.op == ">" and c.operand == 0:
        return f"present {c.key}"
    return f"{c.key} {c.target} {c.op} {c.operand}"


def _op_text(op: Put | Delete) -> str:
    if isinstance(op, Delete):
        return f"delete {op.key}"
    return f"put {op.key} {json.dumps(_compact(op.value), sort_keys=True, separators=(',', ':'))}"


def _compact(value: Any) -> Any:
    """A value without its times and nulls (stable across runs, short to read)."""
    if isinstance(value, dict):
        return {
            k: _compact(v)
            for k, v in value.items()
            if v is not None and k not in ("timestamp", "assigned_at", "since")
        }
    return value
