"""The rebalancing decision: one move per cycle, or a hold that says why.

Rules, in order (each hold names its rule): disabled, too few brokers, balanced (with
hysteresis: an episode starts above `cv_threshold` and ends below `target_cv`), noise floor
(the score spread is below `min_imbalance`), rate limit, cooldown, then the search for a
move that strictly reduces imbalance, does not overshoot (the source stays at or above the
target) and does not return a topic to the broker it left within `return_window_seconds`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from ballast.balance.candidates import Candidates, movable_topics
from ballast.balance.estimate import apply_move, broker_topic_load, idle_baseline
from ballast.balance.history import MoveHistory
from ballast.balance.imbalance import Imbalance, measure, sum_squared_deviations
from ballast.balance.noise import is_return, overshoots, spread_hold
from ballast.balance.pulsar.policy import move_budget, shed
from ballast.balance.rankings import score_brokers
from ballast.balance.scoring import balanced_score
from ballast.config import PulsarConfig, RebalancingConfig, RebalancingPolicy, Strategy
from ballast.model import BrokerId, ClusterSnapshot, Move

LINEAR = (Strategy.FAIR, Strategy.BALANCED)
MAX_TRIES_PER_SOURCE = 32  # exact evaluations per source broker (non-linear strategy)
MAX_FALLBACK_PAIRS = 64  # (source, target) pairs tried when no source has a useful move
FALLBACK_TRIES = 4  # exact evaluations per fallback pair (non-linear strategy)


@dataclass(frozen=True)
class Decision:
    """What the rebalancing loop should do now. `rule` is "move" or why nothing moves."""

    rule: str
    reason: str
    stats: Imbalance
    move: Move | None = None
    episode: bool = False
    after: ClusterSnapshot | None = None  # the estimated snapshot once `move` is done
    # Pulsar's shedders (issue 12): every move of this decision (a bundle moves as all its
    # topics; `move` is the first), per-broker explanations, and the shedder's smoothed
    # usage to pass back on the next call (like `episode`).
    moves: tuple[Move, ...] = ()
    details: tuple[str, ...] = ()
    shedder_state: Mapping[BrokerId, float] | None = None

    @property
    def explanation(self) -> str:
        return f"[{self.rule}] {self.reason}"

    def explain(self) -> str:
        """The explanation and, one per line, the per-broker details."""
        return "\n".join([self.explanation, *(f"  {d}" for d in self.details)])


def active_scores(snapshot: ClusterSnapshot, strategy: Strategy) -> dict[BrokerId, float]:
    """Scores of the active brokers only (imbalance is measured over them)."""
    scores = score_brokers(snapshot, strategy)
    active = set(snapshot.active_brokers())
    return {b: s for b, s in scores.items() if b in active}


@dataclass(frozen=True)
class Search:
    """Result of looking for one useful move."""

    move: Move | None
    after: ClusterSnapshot | None
    reason: str


def _idle_score(snapshot: ClusterSnapshot, strategy: Strategy) -> float:
    """The score of a broker without topics under `strategy` (its host's idle load):
    Balanced's resource terms at the idle baseline; 0 otherwise (WeightedLoad: an
    approximation, as the topics' shares below are)."""
    if strategy is not Strategy.BALANCED:
        return 0.0
    cpu, mem, _, _ = idle_baseline(snapshot)
    return float(balanced_score(0.0, cpu, mem))


def _estimated_weights(
    snapshot: ClusterSnapshot, broker: BrokerId, weights: list[float], above_idle: float
) -> list[float]:
    """Approximate score each topic carries: its share of the broker's score above an
    idle broker's."""
    total = broker_topic_load(snapshot, broker)
    return [above_idle * w / total if total > 0 else 0.0 for w in weights]


def find_move(
    snapshot: ClusterSnapshot,
    history: MoveHistory,
    now: float,
    config: RebalancingConfig,
    strategy: Strategy,
    prefer: Literal["lightest", "largest_gain"] = "lightest",
    exclude_topics: Collection[str] = (),
    reason: str = "LoadImbalance",
) -> Search:
    """One move from a source broker to the least-loaded active broker that strictly
    lowers the sum of squared deviations of the active brokers' scores.

    Sources are the overloaded brokers, most loaded first; when none is overloaded (the
    reference's own scale-out case), every broker above the mean. `lightest` follows the
    reference (lightest eligible topic first, least disruption); `largest_gain` picks the
    topic closest to half the gap, so a multi-move plan needs the fewest moves.

    When no source has such a move (Ballast, issue 23), the moves that narrow the spread
    of the scores (max - min) are tried: the least loaded broker takes from any broker
    above it, most loaded first, and the most loaded gives to any broker below it, least
    loaded first (at most `MAX_FALLBACK_PAIRS` pairs, `FALLBACK_TRIES` topics each for a
    non-linear strategy). The same rules hold: no overshoot,
    no return within the window, a strictly lower sum of squared deviations.
    """
    scores = active_scores(snapshot, strategy)
    stats = measure(scores)
    sources = sorted(stats.overloaded, key=lambda b: (-scores[b], b))
    if not sources:
        sources = sorted(
            (b for b in scores if scores[b] > stats.mean), key=lambda b: (-scores[b], b)
        )
    if not sources:
        return Search(None, None, "[no-source] no broker is above the mean")
    pair = _PairSearch(
        snapshot, history, now, config, strategy, prefer, frozenset(exclude_topics), reason
    )
    ascending = sorted(scores, key=lambda b: (scores[b], b))
    notes = []
    tried = set()
    for source in sources:
        targets = [b for b in ascending if b != source]
        if not targets:
            notes.append(f"{source}: no active target")
            continue
        tried.add((source, targets[0]))
        found = pair.attempt(source, targets[0])
        if found.move is not None:
            return found
        notes.append(found.reason)
    lowest, highest = ascending[0], ascending[-1]
    fallback = [(s, lowest) for s in reversed(ascending[1:])]
    fallback += [(highest, t) for t in ascending[1:-1]]
    fallback = [(s, t) for s, t in fallback if (s, t) not in tried and scores[s] > scores[t]]
    for source, target in fallback[:MAX_FALLBACK_PAIRS]:
        found = pair.attempt(source, target, FALLBACK_TRIES)
        if found.move is not None:
            return Search(found.move, found.after, f"{found.reason} [spread]")
    return Search(None, None, "; ".join(notes))


class _PairSearch:
    """Looks for one useful move of a topic from a given source to a given target."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        history: MoveHistory,
        now: float,
        config: RebalancingConfig,
        strategy: Strategy,
        prefer: Literal["lightest", "largest_gain"],
        exclude_topics: frozenset[str],
        reason: str,
    ) -> None:
        self.snapshot, self.history, self.now = snapshot, history, now
        self.config, self.strategy, self.prefer = config, strategy, prefer
        self.exclude_topics, self.reason = exclude_topics, reason
        self.scores = active_scores(snapshot, strategy)
        self.before = sum_squared_deviations(self.scores)
        self.idle = _idle_score(snapshot, strategy)
        self.candidates: dict[BrokerId, Candidates] = {}

    def _movable(self, source: BrokerId) -> Candidates:
        if source not in self.candidates:
            self.candidates[source] = movable_topics(
                self.snapshot, source, self.history, self.now, self.config
            )
        return self.candidates[source]

    def attempt(
        self, source: BrokerId, target: BrokerId, max_tries: int = MAX_TRIES_PER_SOURCE
    ) -> Search:
        """The move, or no move and a note saying why (at most `max_tries` exact
        evaluations; one for a linear strategy taking the lightest topic)."""
        snapshot, scores, strategy = self.snapshot, self.scores, self.strategy
        cands = self._movable(source)
        topics = [(t, w) for t, w in cands.topics if t not in self.exclude_topics]
        window = self.config.return_window_seconds
        returning = [t for t, _ in topics if is_return(self.history, t, target, self.now, window)]
        topics = [(t, w) for t, w in topics if t not in returning]
        if not topics:
            excluded = cands.explain_exclusions()
            if returning:
                excluded += f", {len(returning)} left {target} within the return window"
            return Search(None, None, f"{source}: no movable topic (excluded: {excluded})")
        gap = scores[source] - scores[target]
        above_idle = max(0.0, scores[source] - self.idle)
        est = _estimated_weights(snapshot, source, [w for _, w in topics], above_idle)
        order = list(range(len(topics)))
        if self.prefer == "largest_gain":
            order = [i for i in order if 0 < est[i] < gap] or order
            order.sort(key=lambda i: (abs(est[i] - gap / 2), topics[i][0]))
        tries = 1 if strategy in LINEAR and self.prefer == "lightest" else max_tries
        for i in order[:tries]:
            topic = topics[i][0]
            after = apply_move(snapshot, topic, source, target)
            new_scores = active_scores(after, strategy)
            if overshoots(new_scores, source, target):
                continue  # more than the imbalance one move can fix: noise would undo it
            if sum_squared_deviations(new_scores) < self.before * (1 - 1e-12) - 1e-12:
                move = Move(
                    topic=topic,
                    from_broker=source,
                    to_broker=target,
                    reason=self.reason,
                    estimated_load=scores[source] - new_scores[source],
                    timestamp=self.now,
                )
                return Search(
                    move,
                    after,
                    f"{topic}: {source} ({scores[source]:.2f}) → "
                    f"{target} ({scores[target]:.2f}), est. load {move.estimated_load:.2f}",
                )
        t0, w0 = topics[order[0]][0], est[order[0]]
        return Search(
            None,
            None,
            f"[no-regret] moving {t0} (w={w0:.2f}) from {source} ({scores[source]:.2f}) to "
            f"{target} ({scores[target]:.2f}) does not reduce imbalance",
        )


def decide_rebalance(
    snapshot: ClusterSnapshot,
    history: MoveHistory,
    now: float,
    config: RebalancingConfig,
    strategy: Strategy,
    episode: bool = False,
    *,
    pulsar: PulsarConfig | None = None,
    shedder_state: Mapping[BrokerId, float] | None = None,
) -> Decision:
    """Decide this cycle's move (at most one). Pass back the previous decision's `episode`.

    With `config.policy` one of Pulsar's shedders, the shedder decides instead (settings:
    `pulsar`, Pulsar's defaults when None; pass back the decision's `shedder_state`)."""
    scores = active_scores(snapshot, strategy)
    stats = measure(scores)
    if not config.enabled:
        return Decision("disabled", "rebalancing is disabled (rebalancing.enabled: false)", stats)
    if len(scores) < config.min_brokers_for_rebalance:
        return Decision(
            "too-few-brokers",
            f"{len(scores)} active broker(s), need {config.min_brokers_for_rebalance}",
            stats,
        )
    if config.policy is not RebalancingPolicy.DANUBE:
        return _decide_shedding(
            snapshot, history, now, config, strategy, stats, pulsar, shedder_state
        )
    if episode and stats.cv < config.target_cv:
        return Decision(
            "balanced", f"CV {stats.cv:.1%} is below target_cv {config.target_cv:.0%}; done", stats
        )
    if not episode and stats.cv <= config.cv_threshold:
        return Decision(
            "balanced",
            f"CV {stats.cv:.1%} is within the threshold {config.cv_threshold:.0%} "
            f"({config.aggressiveness.value})",
            stats,
        )
    floor = spread_hold(stats, config)
    if floor is not None:
        return Decision("noise-floor", floor, stats)
    recent = len(history.in_window(now))
    wait = history.next_rate_slot(now, config.max_moves_per_hour)
    if wait > 0:
        return Decision(
            "rate-limit",
            f"{recent} moves in the last hour (max {config.max_moves_per_hour}); "
            f"next slot in {_duration(wait)}",
            stats,
            episode=True,
        )
    wait = history.cooldown_left(now, config.cooldown_seconds)
    if wait > 0:
        return Decision(
            "cooldown", f"{_duration(wait)} left after the last move", stats, episode=True
        )
    found = find_move(snapshot, history, now, config, strategy)
    if found.move is None:
        return Decision("no-useful-move", f"CV {stats.cv:.1%}; {found.reason}", stats)
    return Decision(
        "move", f"CV {stats.cv:.1%}; {found.reason}", stats, found.move, True, found.after
    )


def _decide_shedding(
    snapshot: ClusterSnapshot,
    history: MoveHistory,
    now: float,
    config: RebalancingConfig,
    strategy: Strategy,
    stats: Imbalance,
    pulsar: PulsarConfig | None,
    state: Mapping[BrokerId, float] | None,
) -> Decision:
    cfg = pulsar or PulsarConfig()
    if not cfg.shedding_enabled:
        return Decision("disabled", "shedding is disabled (pulsar.shedding_enabled: false)", stats)
    budget, why = move_budget(history, now, config)
    out = shed(snapshot, history, now, config, strategy, cfg, state, max_moves=budget)
    res = out.result
    details = tuple(v.line() for v in res.verdicts) + out.notes
    usage = dict(res.usage) or None
    if not out.moves:
        if out.rate_limited:
            return Decision(
                "rate-limit",
                f"[{res.shedder.value}] {res.summary}; no move allowed now: {why}",
                stats,
                details=details,
                shedder_state=usage,
            )
        return Decision(
            "no-shedding",
            f"[{res.shedder.value}] {res.summary}",
            stats,
            details=details,
            shedder_state=usage,
        )
    units = len({(m.from_broker, m.to_broker) for m in out.moves})
    reason = (
        f"[{res.shedder.value}] {res.summary}; unload {len(res.unloads)} unit(s) "
        f"({len(out.moves)} topic move(s), {units} broker pair(s))"
    )
    return Decision(
        "move",
        reason,
        stats,
        out.moves[0],
        False,
        out.after_first,
        moves=out.moves,
        details=details,
        shedder_state=usage,
    )


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.0f}s"
