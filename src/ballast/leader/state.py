"""What the leader knows during one term: the view of the cluster, the move history and
the estimates of its own moves, and the snapshots and rankings it computes from them.

`LeaderState` is the base of `LeaderMachine` (`machine`): the round's steps (`rounds`)
read this state, the machine's learning writes it.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from ballast.balance import (
    Decision,
    MoveHistory,
    measure,
    rank,
)
from ballast.balance.pulsar.bundles import NamespaceBundles
from ballast.balance.pulsar.policy import prepare_snapshot
from ballast.config import BallastConfig, PlacementUnit, RebalancingPolicy
from ballast.leader.effects import (
    Collector,
    MetricDelta,
    Write,
)
from ballast.leader.intents import (
    Intent,
)
from ballast.leader.view import BadRecord, ClusterView, classify
from ballast.metadata.records import RecordKind
from ballast.model import (
    BrokerId,
    ClusterSnapshot,
    LoadReport,
    Move,
    topic_namespace,
)

# A round fails over at most this many topics of one dead broker (the rest next round, so
# one step never blocks the shell's event loop for long; each round levels the survivors
# as they are then, so the result is levelled all the same).
FAILOVER_TOPICS_PER_ROUND = 400
# A marker whose topic metadata has not been seen waits this long for the ``/topics/``
# watch to catch up before the leader tries to drop it (the drop is guarded anyway).
META_GRACE_SECONDS = 2.0


@dataclass(frozen=True)
class InFlight:
    """A write asked for, and the part of the intent it carries (booked on success)."""

    write: Write
    intent: Intent


def classify_quietly(key: str) -> tuple[RecordKind, BrokerId | None, str | None]:
    try:
        return classify(key)
    except BadRecord:
        return RecordKind.OTHER, None, None


class LeaderState:
    """The state of one term of leadership, and what is computed from it."""

    def __init__(
        self,
        leader: BrokerId,
        term: int,
        config: BallastConfig,
        *,
        rankings_interval: float = 0.1,
    ) -> None:
        self.leader = leader
        self.term = term
        self.config = config
        self.rebalancing = config.load_manager.rebalancing
        self.strategy = config.load_manager.assignment_strategy
        self.pulsar = config.load_manager.pulsar
        self.by_bundle = config.load_manager.placement_unit is PlacementUnit.BUNDLE
        self.shedding = self.rebalancing.policy is not RebalancingPolicy.DANUBE
        # A Pulsar shedder's smoothed usage per broker (ThresholdShedder's EWMA), passed
        # back to the next check like `episode`.
        self.shedder_state: dict[BrokerId, float] | None = None
        # Topics of bundles this leader split, to unload so that placement spreads them.
        self._split_unloads: list[tuple[str, BrokerId]] = []
        self.rankings_interval = rankings_interval
        self.view = ClusterView()
        self.history = MoveHistory()
        self.episode = False
        self.last_chosen: BrokerId | None = None
        self.last_decision: Decision | None = None
        self.bootstrapped = False
        self._ids = itertools.count(1)
        self._inflight: dict[int, InFlight] = {}
        self._dirty = False
        self._reports_dirty = False
        self._next_check = 0.0
        self._next_rankings = 0.0
        self._repairs: dict[str, int] = {}
        self._unknown_hints: set[tuple[str, int]] = set()
        self._stuck: set[str] = set()
        self._last_rule = ""
        self._opaque_topics: set[str] = set()  # metadata present but undecodable
        self._topics_revision = 0  # how far the ``/topics/`` stream has been seen
        self._meta_wait: dict[str, float] = {}  # topic -> since when its marker waits
        # topic -> (marker revision, when this leader first saw it waiting for a seal): the
        # seal timeout runs on this leader's own clock, never on a timestamp another
        # leader (or broker) wrote with its clock.
        self._seal_wait: dict[str, tuple[int, float]] = {}
        self._ownership_check: set[str] = set()  # topics whose records changed
        self._smoothed: dict[BrokerId, LoadReport] = {}
        # Estimated reports after our own moves (the core's `apply_move`), kept until a
        # broker's real report shows the move: {broker: (report, {topic: present}, since)}.
        self._estimates: dict[BrokerId, tuple[LoadReport, dict[str, bool], float]] = {}

    # -- estimates and snapshots ---------------------------------------------------------

    def snapshot(
        self, *, pending: bool = True, exclude: Collection[str] = (), raw: bool = False
    ) -> ClusterSnapshot:
        """The view's snapshot with smoothed reports (`raw`: the latest ones), estimates
        where a move of ours is not reported yet, and, with `placement_unit: bundle`, the
        namespaces' bundle layouts."""
        snap = self.view.snapshot(pending=pending, exclude=exclude)
        if raw:
            reports = dict(snap.reports)
        else:
            reports = {b: self._smoothed.get(b, r) for b, r in snap.reports.items()}
        for broker, (estimate, _, _) in self._estimates.items():
            if broker in reports or broker in snap.brokers:
                reports[broker] = estimate
        snap = replace(snap, reports=reports)
        if self.by_bundle:
            snap = prepare_snapshot(snap, self.config.load_manager, self._layouts())
        return snap

    def _layouts(self) -> dict[str, NamespaceBundles]:
        """The stored layouts, and Pulsar's default one for every other namespace the
        leader knows a topic of (topics being placed included: they own nothing yet)."""
        layouts = dict(self.view.bundles)
        n = self.pulsar.default_number_of_namespace_bundles
        for topic in itertools.chain(self.view.topics, self.view.markers, self.view.owners):
            ns = topic_namespace(topic)
            if ns not in layouts:
                layouts[ns] = NamespaceBundles.create(ns, n)
        return layouts

    def _estimate(self, after: ClusterSnapshot, move: Move, now: float) -> None:
        for broker, present in ((move.from_broker, False), (move.to_broker, True)):
            report = after.reports.get(broker)
            if report is None:
                continue
            expected = dict(self._estimates[broker][1]) if broker in self._estimates else {}
            expected[move.topic] = present
            self._estimates[broker] = (report, expected, now)

    def _retire_estimate(self, broker: BrokerId, now: float) -> None:
        """Drop a broker's estimate once its real report shows every move (or is late)."""
        entry = self._estimates.get(broker)
        report = self.view.reports.get(broker)
        if entry is None or report is None:
            return
        _, expected, since = entry
        reported = {t.topic for t in report.topics}
        shown = all((topic in reported) == present for topic, present in expected.items())
        interval = self.config.load_manager.load_report_interval_seconds
        if shown or now - since > 5 * interval:
            del self._estimates[broker]
            # The move changed the broker's load for real: readings from before it are
            # history of another load, so smoothing starts again from this report.
            self._smoothed[broker] = report

    def _forget_report(self, broker: BrokerId) -> None:
        self.view.forget_report(broker)
        if broker not in self.view.registrations:
            self._smoothed.pop(broker, None)
            self._estimates.pop(broker, None)

    def _waiting_since(self, topic: str, revision: int, now: float) -> float:
        """When this leader first saw the marker of `topic` (at `revision`) waiting."""
        seen = self._seal_wait.get(topic)
        if seen is None or seen[0] != revision:
            self._seal_wait[topic] = (revision, now)
            return now
        return seen[1]

    # -- rankings ------------------------------------------------------------------------

    def balance(self, out: Collector | None = None) -> dict[str, Any]:
        """Rankings and balance statistics of the current view."""
        snapshot = self.snapshot()
        rankings = rank(snapshot, self.strategy, self.pulsar)
        active = set(snapshot.active_brokers())
        stats = measure({b: s for b, s in rankings.entries if b in active})
        if out is not None:
            out.metrics.append(MetricDelta("balance", len(active), kind="balance", extra=stats))
        return {
            "leader": self.leader,
            "term": self.term,
            "strategy": self.strategy.value,
            "rankings": rankings.to_dict(),
            "balance": stats.to_dict(),
            "decision": self.last_decision.explanation if self.last_decision else None,
        }
