"""Pulsar's policies in the data pipeline.

1. Ranking scores of Pulsar's two placement strategies as Spark columns (same formulas as
   `balance.pulsar.strategies`), so the strategy comparison covers them too.
2. A side-by-side of the rebalancing policies — Danube's CV rule and Pulsar's three
   shedders — replayed on the same load history: Spark aggregates the history into windows;
   the driver replays the decision core window by window. Each policy starts from the
   assignment the history shows and keeps its own virtual assignment: a topic carries its
   measured load wherever the policy put it, and its broker's resources move with it
   (`balance.estimate.apply_move`). One decision per window; CV is measured under the
   configured assignment strategy after the window's moves.

Reported per policy: moves made, CV at the start and the end, mean CV, and the time to
converge (from the first window until CV stays at or below `cv_threshold` for good).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd
from pyspark.sql import Column
from pyspark.sql import functions as F

from ballast.balance import MoveHistory, decide_rebalance
from ballast.balance.estimate import apply_move
from ballast.balance.imbalance import measure
from ballast.balance.pulsar.strategies import bandwidth_percent, resource_usage_score
from ballast.balance.rebalance import active_scores
from ballast.config import LoadManagerConfig, PulsarConfig, RebalancingPolicy, Strategy
from ballast.model import BrokerId, BrokerMode, BrokerState, ClusterSnapshot, LoadReport, TopicLoad
from ballast.pipeline.rules import SPARK_OPS

PULSAR_SCORE_COLUMNS = {
    Strategy.LEAST_LONG_TERM_MESSAGE_RATE: "score_least_long_term_message_rate",
    Strategy.LEAST_RESOURCE_USAGE_WITH_WEIGHT: "score_least_resource_usage_with_weight",
}


def pulsar_score_columns(cfg: PulsarConfig | None = None) -> list[Column]:
    """The two Pulsar ranking scores from a broker window's means (msg rate; max weighted
    resource usage in percent, with the network rate as bandwidth)."""
    cfg = cfg or PulsarConfig()
    bw = bandwidth_percent(F.col("network_io_bps_mean"), cfg.nic_speed_gbps)
    usage = resource_usage_score(
        F.col("cpu_percent_mean"),
        F.col("memory_percent_mean"),
        F.lit(0.0),
        bw,
        bw,
        cfg,
        SPARK_OPS,
    )
    return [
        (F.col("msg_rate_mean") * 1.0).alias(
            PULSAR_SCORE_COLUMNS[Strategy.LEAST_LONG_TERM_MESSAGE_RATE]
        ),
        usage.alias(PULSAR_SCORE_COLUMNS[Strategy.LEAST_RESOURCE_USAGE_WITH_WEIGHT]),
    ]


# --- the policy replay --------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One window of history: brokers (state, cpu, mem, disk, net) and topics (owner and
    mean rates)."""

    start: float
    end: float
    brokers: Mapping[BrokerId, tuple[str, float, float, float, float]]
    topics: Mapping[str, tuple[BrokerId, float, float, int]]  # owner, msg/s, B/s, conns


# The topic windows' columns the replay reads (the job selects only these).
TOPIC_WINDOW_COLUMNS = (
    "window_start",
    "topic",
    "broker_id",
    "msg_rate_mean",
    "byte_rate_mean",
    "connections_mean",
)


def windows_from_frames(broker_windows: pd.DataFrame, topic_windows: pd.DataFrame) -> list[Window]:
    """Group the pipeline's per-window tables (pandas) into `Window`s, oldest first."""

    def epoch(v: Any) -> float:
        return float(pd.Timestamp(v).timestamp())

    out = []
    topics_by = {k: g for k, g in topic_windows.groupby("window_start")}
    for start, g in broker_windows.groupby("window_start"):
        brokers = {
            str(r.broker_id): (
                str(r.state),
                float(r.cpu_percent_mean or 0.0),
                float(r.memory_percent_mean or 0.0),
                float(r.disk_io_bps_mean or 0.0),
                float(r.network_io_bps_mean or 0.0),
            )
            for r in g.itertuples()
        }
        tg = topics_by.get(start)
        topics = {}
        if tg is not None:
            for r in tg.itertuples():
                topics[str(r.topic)] = (
                    str(r.broker_id),
                    float(r.msg_rate_mean or 0.0),
                    float(r.byte_rate_mean or 0.0),
                    round(float(r.connections_mean or 0.0)),
                )
        out.append(Window(epoch(start), epoch(g["window_end"].iloc[0]), brokers, topics))
    return sorted(out, key=lambda w: w.start)


def window_snapshot(w: Window, virtual: Mapping[str, BrokerId]) -> ClusterSnapshot:
    """The window as measured, then with each topic moved to where the policy put it."""
    brokers = tuple(sorted(w.brokers))
    by_broker: dict[BrokerId, list[TopicLoad]] = {b: [] for b in brokers}
    for t, (owner, rate, byte_rate, conns) in sorted(w.topics.items()):
        if owner in by_broker:
            by_broker[owner].append(TopicLoad(t, rate, byte_rate, producers=conns))
    reports = {
        b: LoadReport(b, w.end, cpu, mem, disk, net, tuple(by_broker[b]))
        for b, (_, cpu, mem, disk, net) in w.brokers.items()
    }
    states = {
        b: BrokerState(BrokerMode(s) if s in BrokerMode._value2member_map_ else BrokerMode.ACTIVE)
        for b, (s, *_) in w.brokers.items()
    }
    snap = ClusterSnapshot(
        brokers,
        reports,
        states,
        {b: tuple(t.topic for t in ts) for b, ts in by_broker.items()},
    )
    for t, target in sorted(virtual.items()):
        measured = w.topics.get(t)
        if measured is None:
            continue
        owner = measured[0]
        if owner in by_broker and target in by_broker and target != owner:
            snap = apply_move(snap, t, owner, target)
    return snap


@dataclass(frozen=True)
class PolicyRun:
    policy: RebalancingPolicy
    moves: int
    initial_cv: float
    final_cv: float
    mean_cv: float
    converged_after_seconds: float | None
    windows: int
    cv: tuple[float, ...]  # per window, after its moves (`initial_cv`: before the first)
    rules: Mapping[str, int]  # how many windows ended with each decision rule
    last_decision: str  # the last window's explanation (why it moved, or why not)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.value,
            "moves": self.moves,
            "initial_cv": self.initial_cv,
            "final_cv": self.final_cv,
            "mean_cv": self.mean_cv,
            "converged_after_seconds": self.converged_after_seconds,
            "windows": self.windows,
            "rules": dict(self.rules),
            "last_decision": self.last_decision,
        }


def replay_policy(
    windows: Sequence[Window],
    lm: LoadManagerConfig,
    policy: RebalancingPolicy,
    strategy: Strategy | None = None,
) -> PolicyRun:
    """Replay one policy over the windows (rebalancing forced on, the rest as configured)."""
    strategy = strategy or lm.assignment_strategy
    rules = lm.rebalancing.model_copy(update={"enabled": True, "policy": policy})
    virtual: dict[str, BrokerId] = {}
    history = MoveHistory()
    episode = False
    state: dict[BrokerId, float] | None = None
    moves = 0
    cvs: list[float] = []
    initial: float | None = None
    rule_counts: dict[str, int] = {}
    last = ""
    for w in windows:
        snap = window_snapshot(w, virtual)
        if initial is None:
            initial = measure(active_scores(snap, strategy)).cv
        d = decide_rebalance(
            snap, history, w.end, rules, strategy, episode, pulsar=lm.pulsar, shedder_state=state
        )
        episode = d.episode
        state = dict(d.shedder_state) if d.shedder_state else None
        rule_counts[d.rule] = rule_counts.get(d.rule, 0) + 1
        last = d.explanation
        for m in d.moves or ((d.move,) if d.move is not None else ()):
            snap = apply_move(snap, m.topic, m.from_broker, m.to_broker)
            virtual[m.topic] = m.to_broker
            history = history.add(replace(m, timestamp=w.end))
            moves += 1
        cvs.append(measure(active_scores(snap, strategy)).cv)
    converged: float | None = None
    if cvs:
        last_above = max((i for i, c in enumerate(cvs) if c > rules.cv_threshold), default=-1)
        if last_above < len(cvs) - 1:
            converged = windows[last_above + 1].end - windows[0].start if last_above >= 0 else 0.0
    return PolicyRun(
        policy,
        moves,
        initial or 0.0,
        cvs[-1] if cvs else 0.0,
        sum(cvs) / len(cvs) if cvs else 0.0,
        converged,
        len(cvs),
        tuple(cvs),
        dict(sorted(rule_counts.items())),
        last,
    )


def compare_policies(
    broker_windows: pd.DataFrame,
    topic_windows: pd.DataFrame,
    lm: LoadManagerConfig,
    strategy: Strategy | None = None,
) -> list[dict[str, Any]]:
    """Danube's policy and each shedder on the same history, side by side."""
    windows = windows_from_frames(broker_windows, topic_windows)
    return [replay_policy(windows, lm, p, strategy).to_dict() for p in RebalancingPolicy]


def summary_line(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line for the report's summary: each policy's moves, final CV, convergence."""

    def conv(v: Any) -> str:
        return "never" if v is None else f"{float(v) / 60:.0f} min"

    return "; ".join(
        f"{r['policy']}: {r['moves']}, {100 * r['final_cv']:.1f}%, "
        f"{conv(r['converged_after_seconds'])}"
        for r in rows
    )
