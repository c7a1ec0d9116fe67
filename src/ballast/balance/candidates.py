"""Which topics may move: blacklist, minimum age, per-topic cooldown; lightest first."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from ballast.balance.estimate import topic_weight
from ballast.balance.history import MoveHistory
from ballast.config import RebalancingConfig
from ballast.model import BrokerId, ClusterSnapshot


def is_blacklisted(topic: str, patterns: tuple[str, ...]) -> bool:
    """Glob match (`/system/*`, `/default/critical-*`, exact names)."""
    return any(fnmatchcase(topic, p) for p in patterns)


@dataclass(frozen=True)
class Candidates:
    """Movable topics of one broker, lightest first, and why the others were excluded."""

    broker: BrokerId
    topics: tuple[tuple[str, float], ...]
    excluded: Counter[str] = field(default_factory=Counter)

    def explain_exclusions(self) -> str:
        return ", ".join(f"{n} {why}" for why, n in sorted(self.excluded.items())) or "none"


def movable_topics(
    snapshot: ClusterSnapshot,
    broker: BrokerId,
    history: MoveHistory,
    now: float,
    config: RebalancingConfig,
) -> Candidates:
    """The topics of `broker` that the rules allow to move, with their weights."""
    cooling = history.recently_moved(now, config.cooldown_seconds)
    excluded: Counter[str] = Counter()
    eligible: list[tuple[str, float]] = []
    for topic, load in snapshot.topic_loads(broker).items():
        if is_blacklisted(topic, config.blacklist_topics):
            excluded["blacklisted"] += 1
            continue
        created = snapshot.topic_created.get(topic)
        # A topic whose creation time is unknown is treated as old enough.
        if created is not None and now - created < config.min_topic_age_seconds:
            excluded["too young"] += 1
            continue
        if topic in cooling:
            excluded["cooling down"] += 1
            continue
        eligible.append((topic, topic_weight(load)))
    eligible.sort(key=lambda e: (e[1], e[0]))
    return Candidates(broker, tuple(eligible), excluded)
