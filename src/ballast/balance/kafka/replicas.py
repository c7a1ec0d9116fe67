"""Minimal-movement replica reassignment for Kafka clusters (KAFKA-19048), pure.

The planner runs in three stages so that one engine can run the middle one in parallel:

1. `topic_counts`: per topic, what each broker holds now (replicas, leaders).
2. `plan_targets` (cluster-wide, on one machine): every broker's replica and leader
   target for every topic (see `targets`).
3. `plan_topic` (per topic, independent): relocate replicas, pick leaders, order
   followers; `assemble` adds the topics' results into one `ReplicaPlan`.

Hard constraint: rack anti-affinity (rack-aware mode) — no rack holds more replicas of a
partition than the racks force (one when there are at least RF racks); brokers without a
rack form their own group, so they are never in conflict with anyone else. Without
rack-awareness every broker is its own group: the same code, the same rules.
Objectives, in order: every broker at its replica target (per topic and cluster-wide),
the fewest replica moves (the lower bound Σ max(0, current − target) whenever the
constraint allows), leaders at their targets with the fewest leader changes, and follower
order spreading each broker's leaderships over many brokers should it fail.

Brokers are addressed by their index in `BrokerLayout.ids` (sorted ids) inside the
planner; ids appear again only in `PartitionChange` and `BrokerLoad`.
"""

from __future__ import annotations

import zlib
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from ballast.balance.kafka.targets import IntArray, Shares, spread_extras, water_fill

NO_BROKER = -1
# Longest chain of leadership hand-offs used to bring one broker back to its leader target.
MAX_LEADER_CHAIN = 3
# Sweeps of the cluster-wide leader pass over all partitions (each fixes what it can).
LEADER_SWEEPS = 3


class ReplicaInputError(ValueError):
    """Bad planner input: says which topic/partition/broker and what is wrong with it."""


@dataclass(frozen=True)
class KafkaBroker:
    """A broker as the brokers file lists it; `rack` None when it has none."""

    id: int
    rack: str | None = None


@dataclass(frozen=True)
class PartitionAssignment:
    """One partition's replicas, the first being the preferred leader."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    log_dirs: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, eq=False)
class BrokerLayout:
    """The brokers as the planner sees them (build with `make_layout`)."""

    ids: tuple[int, ...]
    racks: tuple[str | None, ...]
    target: np.ndarray  # bool per broker: stays in (or joins) the cluster
    group: IntArray  # anti-affinity group the planner enforces (per broker)
    rack_group: IntArray  # real racks (rackless brokers alone): what violations report
    limits: tuple[int, ...]  # most replicas of an RF-r partition one group may hold
    rack_limits: tuple[int, ...]  # the same for `rack_group`
    rack_aware: bool
    round_robin_order: IntArray  # target brokers in `--generate`'s order

    @property
    def size(self) -> int:
        return len(self.ids)

    def index(self, broker_id: int) -> int:
        return self.ids.index(broker_id)


def _group_indices(keys: Sequence[object]) -> IntArray:
    seen: dict[object, int] = {}
    return np.array([seen.setdefault(k, len(seen)) for k in keys], dtype=np.int64)


def _limits(group: IntArray, target: np.ndarray, max_rf: int) -> tuple[int, ...]:
    """limits[r]: the least L with Σ_groups min(L, target brokers in group) ≥ r."""
    sizes = np.bincount(group[target], minlength=int(group.max(initial=-1)) + 1)
    sizes = sizes[sizes > 0]
    limits = [0]
    for rf in range(1, max_rf + 1):
        limit = 1
        while int(np.minimum(limit, sizes).sum()) < rf and limit < rf:
            limit += 1
        limits.append(limit)
    return tuple(limits)


def _rack_alternated(
    ids: Sequence[int], racks: Sequence[str | None], members: IntArray
) -> IntArray:
    """Kafka's rack-alternated broker list: first broker of each rack, then the second…"""
    by_rack: dict[str, list[int]] = defaultdict(list)
    for i in members.tolist():
        by_rack[racks[i] if racks[i] is not None else f"\0{ids[i]}"].append(i)
    columns = [sorted(v, key=lambda i: ids[i]) for _, v in sorted(by_rack.items())]
    order = [c[k] for k in range(max(map(len, columns), default=0)) for c in columns if k < len(c)]
    return np.array(order, dtype=np.int64)


def make_layout(
    brokers: Sequence[KafkaBroker],
    add: Iterable[int] = (),
    remove: Iterable[int] = (),
    rack_aware: bool = True,
    max_rf: int = 1,
) -> BrokerLayout:
    """The cluster after adding and removing brokers.

    Added brokers missing from `brokers` join without a rack. Raises ReplicaInputError for
    a broker listed twice, a removed broker nobody knows, a broker both added and removed,
    or no broker left.
    """
    racks: dict[int, str | None] = {}
    for b in brokers:
        if b.id in racks:
            raise ReplicaInputError(f"broker {b.id} is listed twice in the brokers file")
        racks[b.id] = b.rack
    for added in add:
        racks.setdefault(added, None)
    removed = set(remove)
    both = sorted(removed & set(add))
    if both:
        raise ReplicaInputError(
            f"broker(s) {','.join(map(str, both))} both in --add and in --remove"
        )
    unknown = sorted(removed - racks.keys())
    if unknown:
        raise ReplicaInputError(
            f"--remove {','.join(map(str, unknown))}: not a known broker "
            f"(known: {','.join(map(str, sorted(racks)))})"
        )
    ids = tuple(sorted(racks))
    target = np.array([i not in removed for i in ids], dtype=bool)
    if not target.any():
        raise ReplicaInputError("no broker left after --remove: nothing can hold replicas")
    rack_list = tuple(racks[i] for i in ids)
    # A rackless broker is a group of its own: never in conflict, always checked the same way.
    rack_keys = [r if r is not None else ("broker", i) for i, r in zip(ids, rack_list, strict=True)]
    rack_group = _group_indices(rack_keys)
    group = rack_group if rack_aware else np.arange(len(ids), dtype=np.int64)
    members = np.flatnonzero(target)
    order = _rack_alternated(ids, rack_list, members) if rack_aware else members
    return BrokerLayout(
        ids=ids,
        racks=rack_list,
        target=target,
        group=group,
        rack_group=rack_group,
        limits=_limits(group, target, max_rf),
        rack_limits=_limits(rack_group, target, max_rf),
        rack_aware=rack_aware,
        round_robin_order=order,
    )


@dataclass(frozen=True, eq=False)
class TopicReplicas:
    """One topic's partitions (sorted) and replicas as broker indices, padded with -1."""

    topic: str
    partitions: IntArray
    replicas: IntArray

    @property
    def replication_factors(self) -> IntArray:
        return np.asarray((self.replicas >= 0).sum(axis=1), dtype=np.int64)


def group_topics(
    assignments: Iterable[PartitionAssignment], layout: BrokerLayout
) -> list[TopicReplicas]:
    """Topics sorted by name, partitions sorted by number; checks ids and duplicates."""
    index = {b: i for i, b in enumerate(layout.ids)}
    by_topic: dict[str, list[PartitionAssignment]] = defaultdict(list)
    for a in assignments:
        by_topic[a.topic].append(a)
    topics = []
    for name in sorted(by_topic):
        parts = sorted(by_topic[name], key=lambda a: a.partition)
        width = max(len(a.replicas) for a in parts)
        matrix = np.full((len(parts), width), NO_BROKER, dtype=np.int64)
        for row, a in enumerate(parts):
            try:
                matrix[row, : len(a.replicas)] = [index[b] for b in a.replicas]
            except KeyError:
                bad = sorted(set(a.replicas) - index.keys())
                raise ReplicaInputError(
                    f"partition {a.name}: replicas {list(a.replicas)} name unknown broker(s) "
                    f"{bad} (known: {','.join(map(str, layout.ids))}); add them to the "
                    "brokers file or with --add"
                ) from None
        partitions = np.array([a.partition for a in parts], dtype=np.int64)
        topics.append(TopicReplicas(name, partitions, matrix))
    return topics


def check_feasible(topics: Sequence[TopicReplicas], layout: BrokerLayout, strict: bool) -> None:
    """Raise ReplicaInputError when a partition's RF cannot be placed on the target brokers."""
    brokers = int(layout.target.sum())
    racks = len(np.unique(layout.group[layout.target]))
    for t in topics:
        rf = t.replication_factors
        worst = int(rf.max(initial=0))
        if worst > brokers or (strict and layout.rack_aware and worst > racks):
            row = int(np.argmax(rf))
            name = f"{t.topic}-{int(t.partitions[row])}"
            if worst > brokers:
                raise ReplicaInputError(
                    f"partition {name}: replication factor {worst} larger than available "
                    f"brokers: {brokers}"
                )
            rackless = sum(
                1 for i in np.flatnonzero(layout.target).tolist() if layout.racks[i] is None
            )
            detail = (
                f" ({racks - rackless} racks and {rackless} broker(s) without a rack)"
                if rackless
                else ""
            )
            raise ReplicaInputError(
                f"partition {name}: replication factor {worst} larger than available racks: "
                f"{racks}{detail}; drop --strict-racks to allow two replicas in one rack"
            )


def rack_violations(replicas: IntArray, group: IntArray, limits: Sequence[int]) -> np.ndarray:
    """Per partition: does some group hold more of its replicas than `limits[rf]`?"""
    if replicas.size == 0:
        return np.zeros(len(replicas), dtype=bool)
    width = replicas.shape[1]
    safe = np.where(replicas >= 0, replicas, 0)
    # Padding gets distinct negative groups, so it never looks like a duplicate.
    groups = np.where(replicas >= 0, group[safe], -1 - np.arange(width))
    groups.sort(axis=1)
    limit = np.asarray(limits, dtype=np.int64)[(replicas >= 0).sum(axis=1)]
    bad = np.zeros(len(replicas), dtype=bool)
    for lim in np.unique(limit).tolist():
        if lim < width:
            rows = limit == lim
            bad[rows] = (groups[rows, lim:] == groups[rows, :-lim]).any(axis=1)
    return bad


# ---------------------------------------------------------------------------- stage 1


@dataclass(frozen=True, eq=False)
class TopicCounts:
    """What each broker holds of one topic now (arrays over `BrokerLayout.ids`)."""

    topic: str
    partitions: int
    rf_histogram: tuple[tuple[int, int], ...]  # (replication factor, partitions)
    replicas: IntArray
    leaders: IntArray
    rack_violations: int


def topic_counts(topic: TopicReplicas, layout: BrokerLayout) -> TopicCounts:
    """Stage 1: the topic's current replica and leader counts per broker."""
    flat = topic.replicas[topic.replicas >= 0]
    rf, n = np.unique(topic.replication_factors, return_counts=True)
    return TopicCounts(
        topic=topic.topic,
        partitions=len(topic.partitions),
        rf_histogram=tuple(zip(rf.tolist(), n.tolist(), strict=True)),
        replicas=np.bincount(flat, minlength=layout.size).astype(np.int64),
        leaders=np.bincount(topic.replicas[:, 0], minlength=layout.size).astype(np.int64),
        rack_violations=int(
            rack_violations(topic.replicas, layout.rack_group, layout.rack_limits).sum()
        ),
    )


# ---------------------------------------------------------------------------- stage 2


@dataclass(frozen=True, eq=False)
class TopicTargets:
    """Replica and leader targets of one topic per broker (0 for removed brokers).

    `leader_floor`/`leader_ceiling` bound each broker's leaders in the topic (its fair
    share rounded down and up); the cluster-wide pass may move within them.
    """

    topic: str
    replicas: IntArray
    leaders: IntArray
    leader_floor: IntArray | None = None
    leader_ceiling: IntArray | None = None


def _even_shares(total: int, bins: int) -> Shares:
    whole, extra = divmod(total, bins)
    return Shares(
        np.full(bins, whole, dtype=np.int64),
        np.full(bins, extra, dtype=np.int64),
        bins,
        extra,
    )


def plan_targets(counts: Sequence[TopicCounts], layout: BrokerLayout) -> list[TopicTargets]:
    """Stage 2: replica targets (racks, then brokers within racks) and leader targets.

    Topics are taken in name order, whatever order `counts` comes in.
    """
    counts = sorted(counts, key=lambda c: c.topic)
    members = np.flatnonzero(layout.target)
    groups, member_group = np.unique(layout.group[members], return_inverse=True)
    sizes = np.bincount(member_group, minlength=len(groups)).astype(np.int64)
    # Rack level: shares in proportion to the rack's brokers, capped by anti-affinity.
    rack_shares, rack_current = [], []
    for c in counts:
        total = sum(rf * n for rf, n in c.rf_histogram)
        caps = sum(n * np.minimum(layout.limits[rf], sizes) for rf, n in c.rf_histogram)
        rack_shares.append(water_fill(total, sizes, np.asarray(caps, dtype=np.int64)))
        rack_current.append(np.bincount(member_group, c.replicas[members], len(groups)))
    rack_targets = spread_extras(rack_shares, [x.astype(np.int64) for x in rack_current])
    replica_targets = [np.zeros(layout.size, dtype=np.int64) for _ in counts]
    # Broker level: a rack's share evenly over its brokers (a broker holds a partition once).
    for k in range(len(groups)):
        inside = members[member_group == k]
        if len(inside) == 1:
            for t, target in enumerate(rack_targets):
                replica_targets[t][inside[0]] = target[k]
            continue
        shares = [_even_shares(int(target[k]), len(inside)) for target in rack_targets]
        node = spread_extras(shares, [c.replicas[inside] for c in counts])
        for t, target in enumerate(node):
            replica_targets[t][inside] = target
    # Leaders: a topic's partitions evenly over its replica holders, none leading more than
    # it holds (KAFKA-19048's light brokers, found exactly by water-filling).
    leader_shares = [
        water_fill(c.partitions, np.ones(len(members), dtype=np.int64), r[members])
        for c, r in zip(counts, replica_targets, strict=True)
    ]
    # A broker that must shed replicas counts as leading that many fewer: relocation moves
    # its leader replicas first, so its leaderships travel to the brokers that need them.
    leader_current = [
        np.maximum(c.leaders - np.maximum(c.replicas - r, 0), 0)[members]
        for c, r in zip(counts, replica_targets, strict=True)
    ]
    # Per topic a leader share is even over the holders, but holders of small topics
    # hold few replicas each: summed up, brokers holding many small-topic replicas would
    # lead more than others. Cluster-wide, leaderships follow replicas instead.
    replica_totals = np.sum([r[members] for r in replica_targets], axis=0)
    total_replicas = max(int(replica_totals.sum()), 1)
    ideal = sum(c.partitions for c in counts) * replica_totals / total_replicas
    leader_targets = spread_extras(leader_shares, leader_current, ideal)
    out = []
    for c, r, lead, share in zip(
        counts, replica_targets, leader_targets, leader_shares, strict=True
    ):
        leaders, floor, ceiling = (np.zeros(layout.size, dtype=np.int64) for _ in range(3))
        leaders[members] = lead
        floor[members] = share.whole
        ceiling[members] = share.whole + (share.remainder > 0)
        out.append(TopicTargets(c.topic, r, leaders, floor, ceiling))
    return out


# ---------------------------------------------------------------------------- stage 3


@dataclass(frozen=True)
class PartitionChange:
    """A partition whose replica list changes (broker ids, leader first)."""

    topic: str
    partition: int
    before: tuple[int, ...]
    after: tuple[int, ...]

    @property
    def moves(self) -> int:
        return len(set(self.after) - set(self.before))

    @property
    def leader_changed(self) -> bool:
        return self.before[0] != self.after[0]


@dataclass(frozen=True)
class TopicPlan:
    """One topic's changes, what a round robin would move, and what could not be done."""

    topic: str
    changes: tuple[PartitionChange, ...]
    round_robin_moves: int
    notes: tuple[str, ...] = ()


class _TopicState:
    """Mutable working copy of one topic while stage 3 runs (never leaves this module)."""

    def __init__(self, topic: TopicReplicas, layout: BrokerLayout) -> None:
        self.topic = topic.topic
        self.layout = layout
        matrix = topic.replicas
        if (matrix >= 0).all():
            self.rows: list[list[int]] = matrix.tolist()
        else:
            self.rows = [[b for b in row if b >= 0] for row in matrix.tolist()]
        self.original = [list(r) for r in self.rows]
        self.partitions: list[int] = topic.partitions.tolist()
        self.counts: list[int] = np.bincount(matrix[matrix >= 0], minlength=layout.size).tolist()
        self.group: list[int] = layout.group.tolist()
        self.limits = layout.limits
        self.moved: set[int] = set()
        self.notes: list[str] = []
        self.moves = 0

    def fits(self, p: int, source: int, dest: int) -> bool:
        """May partition p's replica on `source` go to `dest` without breaking anti-affinity?"""
        row = self.rows[p]
        if dest in row or source not in row:  # (a chain may have moved it already)
            return False
        g = self.group[dest]
        same = sum(1 for b in row if b != source and self.group[b] == g)
        return same < self.limits[len(row)]

    def moved_replicas(self) -> int:
        """Replicas now on a broker that did not hold them (the plan's move count)."""
        return sum(len(set(self.rows[p]) - set(self.original[p])) for p in self.moved)

    def move(self, p: int, source: int, dest: int) -> None:
        row = self.rows[p]
        row[row.index(source)] = dest
        self.counts[source] -= 1
        self.counts[dest] += 1
        self.moved.add(p)
        self.moves += 1


def _fix_rack_violations(state: _TopicState, targets: list[int], bad: Iterable[int]) -> None:
    """Move replicas out of over-full groups, preferring over-target sources and
    under-target destinations (then a move costs nothing beyond the lower bound)."""
    layout = state.layout
    target_array = np.asarray(targets, dtype=np.int64)
    for p in bad:
        while True:
            row = state.rows[p]
            per_group: dict[int, int] = defaultdict(int)
            for b in row:
                per_group[state.group[b]] += 1
            limit = state.limits[len(row)]
            crowded = [b for b in row if per_group[state.group[b]] > limit]
            if not crowded:
                break
            # Most over its target first; a follower before the leader; then by id.
            source = min(
                crowded,
                key=lambda b: (targets[b] - state.counts[b], b == row[0], -layout.ids[b]),
            )
            # Every broker `fits` would accept, at once: in the cluster, not in the row,
            # in a group holding fewer than the limit once the source's replica leaves.
            per_group[state.group[source]] -= 1
            full = [g for g, n in per_group.items() if n >= limit]
            fitting = layout.target.copy()
            fitting[row] = False
            if full:
                fitting &= ~np.isin(layout.group, full)
            candidates = np.flatnonzero(fitting)
            if not len(candidates):
                state.notes.append(
                    f"[rack-anti-affinity] {state.topic}-{state.partitions[p]}: no broker can "
                    f"take the replica on broker {layout.ids[source]} without crowding a rack"
                )
                break
            # Largest deficit first: an under-target broker absorbs the move for free; then
            # by id (indices follow ids).
            surplus = np.asarray(state.counts)[candidates] - target_array[candidates]
            dest = int(candidates[np.lexsort((candidates, surplus))[0]])
            state.move(p, source, dest)


def _relocate(state: _TopicState, targets: list[int], leader_targets: list[int]) -> None:
    """Move replicas from over-target brokers (most over first) to under-target ones.

    Which of a source's partitions moves is also a leadership decision. In order: a
    replica the source leads beyond its leader target (the leadership travels with it), a
    follower of a partition whose leader has leaderships to spare (the newcomer takes the
    lead: one change that balances two brokers), other followers, and last a leader
    replica the source needs. Leaders are written first in the rows as they are decided.
    """
    layout = state.layout
    ids = layout.ids
    over = [b for b in range(layout.size) if state.counts[b] > targets[b]]
    if not over:
        return
    held: dict[int, list[int]] = defaultdict(list)
    over_set = set(over)
    led = [0] * layout.size
    for p, row in enumerate(state.rows):
        led[row[0]] += 1
        for b in row:
            if b in over_set:
                held[b].append(p)
    over.sort(key=lambda b: (targets[b] - state.counts[b], ids[b]))
    under = [b for b in range(layout.size) if state.counts[b] < targets[b]]
    received: dict[int, list[int]] = defaultdict(list)  # partitions moved in, per broker

    def rank(p: int, source: int) -> int:
        first = state.rows[p][0]
        if first == source:
            return 0 if led[source] > leader_targets[source] else 3
        return 1 if led[first] > leader_targets[first] else 2

    for source in over:
        candidates = held[source]
        while state.counts[source] > targets[source]:
            under = [d for d in under if state.counts[d] < targets[d]]
            under.sort(key=lambda d: (state.counts[d] - targets[d], ids[d]))
            needy = [d for d in under if led[d] < leader_targets[d]]
            ranks = [rank(p, source) for p in candidates]
            # First a move that also fixes leadership (to a broker short of leaders), then
            # any move, followers before leader replicas.
            attempts = [
                (i, needy)
                for i in sorted(range(len(candidates)), key=ranks.__getitem__)
                if ranks[i] < 2 and needy
            ]
            attempts += [
                (i, under)
                for i in sorted(
                    range(len(candidates)), key=lambda i: ranks[i] == 0 or ranks[i] == 3
                )
            ]
            done = False
            for i, dests in attempts:
                p = candidates[i]
                kind = ranks[i]
                for dest in dests:
                    if not state.fits(p, source, dest):
                        continue
                    row = state.rows[p]
                    first = row[0]
                    state.move(p, source, dest)
                    if first == source:
                        led[source] -= 1
                        led[dest] += 1
                    elif kind == 1 and led[dest] < leader_targets[dest]:
                        j = row.index(dest)
                        row[0], row[j] = dest, first
                        led[first] -= 1
                        led[dest] += 1
                    del candidates[i]
                    received[dest].append(p)
                    done = True
                    break
                if done:
                    break
            if not done:
                done = _reroute(state, source, candidates, targets, received, led)
            if not done:
                excess = state.counts[source] - targets[source]
                state.notes.append(
                    f"[replica-balance] {state.topic}: broker {ids[source]} stays {excess} "
                    "over its target: none of its partitions can go to an under-target broker "
                    "without crowding a rack"
                )
                break


def _reroute(
    state: _TopicState,
    source: int,
    candidates: list[int],
    targets: list[int],
    received: dict[int, list[int]],
    led: list[int],
) -> bool:
    """When no partition of `source` fits an under-target broker directly, find a chain:
    p goes from source to d (full), a partition moved into d earlier goes on to d2, …
    until a broker under target takes the last one. Every replica still moves once, so
    the count stays at the lower bound (an augmenting path, breadth-first: shortest).
    Only when no such chain exists may a chain pass on a replica a broker held before —
    one move beyond the lower bound, which a note reports."""
    if _find_chain(state, source, candidates, targets, received, led, received.__getitem__):
        return True

    def held(d: int) -> list[int]:
        return [q for q, row in enumerate(state.rows) if d in row]

    before = state.moved_replicas()
    if _find_chain(state, source, candidates, targets, received, led, held):
        extra = state.moved_replicas() - before - 1
        if extra > 0:
            state.notes.append(
                f"[beyond-lower-bound] {state.topic}: {extra} extra move(s): broker "
                f"{state.layout.ids[source]}'s replicas fit only brokers at their target"
            )
        return True
    return False


def _find_chain(
    state: _TopicState,
    source: int,
    candidates: list[int],
    targets: list[int],
    received: dict[int, list[int]],
    led: list[int],
    movable: Callable[[int], list[int]],
) -> bool:
    layout = state.layout
    parent: dict[int, tuple[int, int]] = {}  # broker reached -> (partition, from broker)
    queue: deque[int] = deque()
    for p in candidates:
        for d in range(layout.size):
            if d not in parent and d != source and layout.target[d] and state.fits(p, source, d):
                parent[d] = (p, source)
                queue.append(d)
    found = NO_BROKER
    while queue and found == NO_BROKER:
        d = queue.popleft()
        for q in movable(d):
            for d2 in range(layout.size):
                if d2 in parent or d2 == source or not layout.target[d2]:
                    continue
                if state.fits(q, d, d2):
                    parent[d2] = (q, d)
                    if state.counts[d2] < targets[d2]:
                        found = d2
                        break
                    queue.append(d2)
            if found != NO_BROKER:
                break
    if found == NO_BROKER:
        return False
    path = []
    node = found
    while True:
        p, frm = parent[node]
        path.append((p, frm, node))
        if frm == source:
            break
        node = frm
    if len({p for p, _, _ in path}) < len(path):
        return False  # one partition twice on the path: its rows would interfere
    for p, frm, to in path:  # the far end first: each step frees the broker before it
        if state.rows[p][0] == frm:
            led[frm] -= 1
            led[to] += 1
        state.move(p, frm, to)
        if frm == source:
            candidates.remove(p)
        elif p in received[frm]:
            received[frm].remove(p)
        received[to].append(p)
    return True


def _choose_leaders(
    state: _TopicState, targets: list[int], ceiling: list[int] | None = None
) -> list[int]:
    """One leader per partition, at the leader targets with the fewest leader changes.

    Every partition starts with the leader relocation left it (its current one, or the
    broker its leader replica moved to). Then brokers over their target hand leaderships
    directly to a co-replica under target (one change each), and what is left moves along
    the shortest chain of hand-offs (an augmenting path).
    """
    rows = state.rows
    led = [0] * state.layout.size
    leader = [row[0] for row in rows]
    for b in leader:
        led[b] += 1
    over = [b for b in range(len(led)) if led[b] > targets[b]]
    if not over:
        return leader
    leads: dict[int, list[int]] = defaultdict(list)
    for p, b in enumerate(leader):
        leads[b].append(p)
    for u in over:
        for p in leads[u]:
            if led[u] <= targets[u]:
                break
            others = [w for w in rows[p] if w != u and led[w] < targets[w]]
            if others:
                w = min(others, key=lambda w: (led[w] - targets[w], rows[p].index(w)))
                leader[p] = w
                led[u] -= 1
                led[w] += 1
    if any(led[b] > targets[b] for b in over):
        _repair_leaders(state, leader, led, targets)
    if ceiling is not None and any(led[b] > ceiling[b] for b in over):
        # Exact targets out of reach: at least no broker above the topic's fair share.
        _repair_leaders(state, leader, led, ceiling)
    return leader


def _repair_leaders(
    state: _TopicState, leader: list[int], led: list[int], targets: list[int]
) -> None:
    """Shift leaderships along chains (u leads p, w holds p → w leads p …) from brokers
    over their leader target to one under it: an augmenting path, as in bipartite matching.

    A chain of n hand-offs changes n leaders to fix one unit of imbalance; chains longer
    than MAX_LEADER_CHAIN are not worth it (a broker then ends one leader off target).
    """
    leads: dict[int, set[int]] = defaultdict(set)
    for p, b in enumerate(leader):
        leads[b].add(p)
    while True:
        progress = False
        for u in [b for b in range(len(led)) if led[b] > targets[b]]:
            parent: dict[int, tuple[int, int]] = {}
            depth = {u: 0}
            queue = deque([u])
            found = NO_BROKER
            while queue and found == NO_BROKER:
                x = queue.popleft()
                if depth[x] >= MAX_LEADER_CHAIN:
                    continue
                for p in sorted(leads[x]):
                    for w in state.rows[p]:
                        if w in depth:
                            continue
                        depth[w] = depth[x] + 1
                        parent[w] = (x, p)
                        if led[w] < targets[w]:
                            found = w
                            break
                        queue.append(w)
                    if found != NO_BROKER:
                        break
            if found == NO_BROKER:
                continue
            w = found
            while w != u:
                x, p = parent[w]
                leads[x].discard(p)
                leads[w].add(p)
                leader[p] = w
                w = x
            led[u] -= 1
            led[found] += 1
            progress = True
        if not progress:
            return


def _order_followers(state: _TopicState, leader: list[int]) -> None:
    """Leader first; for partitions that change anyway, the follower that takes over
    (the second replica) is the one that least often backs up this leader in the topic,
    so a broker's failure hands its leaderships to many brokers, not one."""
    size = state.layout.size
    rotation = zlib.crc32(state.topic.encode()) % max(size, 1)
    pairs: dict[tuple[int, int], int] = defaultdict(int)
    second: list[int] = [0] * size
    changing = []
    for p, row in enumerate(state.rows):
        if p in state.moved or leader[p] != row[0]:
            changing.append(p)
        elif len(row) > 1:
            pairs[row[0], row[1]] += 1
            second[row[1]] += 1
    for p in changing:
        row = state.rows[p]
        lead = leader[p]
        followers = [b for b in row if b != lead]
        if followers:
            # Ties rotate by topic, so equal topics do not all pick the same backup.
            first = min(
                followers,
                key=lambda b: (pairs[lead, b], second[b], (b - rotation) % size),
            )
            followers.remove(first)
            followers.insert(0, first)
            pairs[lead, first] += 1
            second[first] += 1
        state.rows[p] = [lead, *followers]


def kafka_assignment(
    order: IntArray,
    racks: IntArray | None,
    partitions: int,
    rf: int,
    start: int,
    shift: int,
) -> IntArray:
    """Kafka's `AdminUtils.assignReplicasToBrokers` (what `--generate` proposes), as a
    (partitions, rf) array of entries of `order`.

    `order` is the broker list: rack-alternated (`getRackAlternatedBrokerList`) when
    `racks` (each entry's rack) is given, which selects the rack-aware assignment: a
    follower is skipped while its rack already holds a replica of the partition and some
    rack holds none, or while it holds one itself and some broker holds none, so no two
    replicas of a partition share a rack while there are racks enough. `start` and `shift`
    are Kafka's random start index and replica shift; the shift grows by one every
    `len(order)` partitions.
    """
    n = len(order)
    out = np.empty((partitions, rf), dtype=np.int64)
    if partitions == 0 or rf == 0:
        return out
    p = np.arange(partitions)
    first = (p + start) % n
    shifts = shift + p // n
    out[:, 0] = order[first]
    span = max(n - 1, 1)
    if racks is None:
        for j in range(1, rf):
            out[:, j] = order[(first + 1 + (shifts + j - 1) % span) % n]
        return out
    rack = np.asarray(racks, dtype=np.int64)
    num_racks = len(np.unique(rack))
    pos = np.empty((partitions, rf), dtype=np.int64)  # positions in `order`
    pos[:, 0] = first
    racks_used = np.ones(partitions, dtype=np.int64)  # distinct racks holding a replica
    k = np.zeros(partitions, dtype=np.int64)  # attempts so far (Kafka's `k`, per partition)
    step_base = shifts * num_racks
    for j in range(1, rf):
        pending = np.arange(partitions)
        while pending.size:  # every row accepts within n attempts: the list covers all
            cand = (first[pending] + 1 + (step_base[pending] + k[pending]) % span) % n
            rack_taken = (rack[pos[pending, :j]] == rack[cand][:, None]).any(axis=1)
            broker_taken = (pos[pending, :j] == cand[:, None]).any(axis=1)
            ok = (~rack_taken | (racks_used[pending] == num_racks)) & (~broker_taken | (j == n))
            done = pending[ok]
            pos[done, j] = cand[ok]
            racks_used[done] += ~rack_taken[ok]
            k[pending] += 1
            pending = pending[~ok]
    return np.asarray(order[pos], dtype=np.int64)


def round_robin_moves(topic: TopicReplicas, layout: BrokerLayout, seed: int = 0) -> int:
    """Replica moves of a `kafka-reassign-partitions --generate` assignment.

    Kafka's `assignReplicasToBrokers` (`kafka_assignment`) over the target brokers:
    rack-aware when the layout is (the rack-alternated list, no two replicas of a partition
    in one rack while racks suffice; a broker without a rack is a rack of its own), from a
    start index and replica shift that Kafka draws at random: here derived from `seed` and
    the topic name, so the figure is reproducible. Each partition keeps its own RF.
    """
    brokers = layout.round_robin_order
    n = len(brokers)
    size, width = topic.replicas.shape
    if size == 0:
        return 0
    start = zlib.crc32(f"{seed}/{topic.topic}/start".encode()) % n
    shift = zlib.crc32(f"{seed}/{topic.topic}/shift".encode()) % n
    racks = layout.rack_group[brokers] if layout.rack_aware else None
    new = kafka_assignment(brokers, racks, size, min(width, n), start, shift)
    rf = topic.replication_factors
    new = np.where(np.arange(new.shape[1])[None, :] < rf[:, None], new, NO_BROKER - 1)
    present = topic.replicas >= 0
    kept = (topic.replicas[:, :, None] == new[:, None, :]).any(axis=2)
    return int((present & ~kept).sum())


def plan_topic(
    topic: TopicReplicas, targets: TopicTargets, layout: BrokerLayout, seed: int = 0
) -> TopicPlan:
    """Stage 3 for one topic: relocate, choose leaders, order followers."""
    state = _TopicState(topic, layout)
    replica_targets: list[int] = targets.replicas.tolist()
    bad = np.flatnonzero(rack_violations(topic.replicas, layout.group, layout.limits))
    _fix_rack_violations(state, replica_targets, bad.tolist())
    leader_targets: list[int] = targets.leaders.tolist()
    _relocate(state, replica_targets, leader_targets)
    ceiling = None if targets.leader_ceiling is None else targets.leader_ceiling.tolist()
    leader = _choose_leaders(state, leader_targets, ceiling)
    _order_followers(state, leader)
    ids = layout.ids
    changes = []
    for p, (before, after) in enumerate(zip(state.original, state.rows, strict=True)):
        if before != after:
            changes.append(
                PartitionChange(
                    topic.topic,
                    int(topic.partitions[p]),
                    tuple(ids[b] for b in before),
                    tuple(ids[b] for b in after),
                )
            )
    rr = round_robin_moves(topic, layout, seed)
    return TopicPlan(topic.topic, tuple(changes), rr, tuple(state.notes))


def balance_leaders(
    topics: Sequence[TopicReplicas],
    plans: Sequence[TopicPlan],
    targets: Sequence[TopicTargets],
    layout: BrokerLayout,
) -> list[TopicPlan]:
    """Cluster-wide leader pass (on the driver, after every topic is planned).

    Leader targets are fixed before replicas move, so a broker can end up holding no
    partition whose leader could hand over to it. Across all topics, though, a broker over
    its cluster leader target almost always shares some partition with one under it: the
    partition's leadership switches (one leader change fixes two brokers) as long as both
    stay within the topic's floor..ceiling. Topics in name order, partitions in order.
    """
    index = {b: i for i, b in enumerate(layout.ids)}
    by_topic = {t.topic: t for t in targets}
    plan_of = {p.topic: p for p in plans}
    target_total = np.zeros(layout.size, dtype=np.int64)
    for t in targets:
        target_total += t.leaders
    working: list[tuple[TopicReplicas, list[list[int]], list[list[int]], list[int]]] = []
    led_total = np.zeros(layout.size, dtype=np.int64)
    for topic in topics:
        matrix = topic.replicas
        if (matrix >= 0).all():
            original: list[list[int]] = matrix.tolist()
        else:
            original = [[b for b in row if b >= 0] for row in matrix.tolist()]
        rows = list(original)
        changes = plan_of[topic.topic].changes
        if changes:
            position = {p: i for i, p in enumerate(topic.partitions.tolist())}
            for ch in changes:
                rows[position[ch.partition]] = [index[b] for b in ch.after]
        first = np.bincount([r[0] for r in rows], minlength=layout.size)
        led_total += first
        working.append((topic, original, rows, first.tolist()))
    excess: list[int] = (led_total - target_total).tolist()
    if not any(e > 0 for e in excess) or not any(e < 0 for e in excess):
        return list(plans)
    switched: set[str] = set()
    for _ in range(LEADER_SWEEPS):
        moved = 0
        for topic, _original, rows, leading in working:
            t = by_topic[topic.topic]
            if t.leader_floor is None or t.leader_ceiling is None:
                continue
            low: list[int] = t.leader_floor.tolist()
            high: list[int] = t.leader_ceiling.tolist()
            for p, row in enumerate(rows):
                u = row[0]
                if excess[u] <= 0 or leading[u] <= low[u]:
                    continue
                takers = [w for w in row[1:] if excess[w] < 0 and leading[w] < high[w]]
                if not takers:
                    continue
                w = min(takers, key=lambda w: (excess[w], row.index(w)))
                rows[p] = [w, u, *(b for b in row[1:] if b != w)]
                leading[u] -= 1
                leading[w] += 1
                excess[u] -= 1
                excess[w] += 1
                switched.add(topic.topic)
                moved += 1
        if not moved:
            break
    out = []
    ids = layout.ids
    for topic, original, rows, _leading in working:
        plan = plan_of[topic.topic]
        if topic.topic in switched:
            changes = tuple(
                PartitionChange(
                    topic.topic,
                    int(topic.partitions[p]),
                    tuple(ids[b] for b in before),
                    tuple(ids[b] for b in after),
                )
                for p, (before, after) in enumerate(zip(original, rows, strict=True))
                if before != after
            )
            plan = TopicPlan(plan.topic, changes, plan.round_robin_moves, plan.notes)
        out.append(plan)
    return out


# ---------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class BrokerLoad:
    """One broker's replica and leader counts before, after and wanted."""

    id: int
    rack: str | None
    state: str  # "kept", "added" (held nothing before) or "removed"
    replicas_before: int
    replicas_after: int
    replica_target: int
    leaders_before: int
    leaders_after: int
    leader_target: int


CONSTRAINTS = (
    "[hard] rack anti-affinity: no rack holds more replicas of a partition than the racks "
    "force (one when racks ≥ RF); brokers without a rack are never in conflict",
)
OBJECTIVES = (
    "[1] replica balance: each broker within one replica of its fair share, per topic "
    "and cluster-wide",
    "[2] fewest moves: Σ max(0, current − target) whenever the hard constraint allows",
    "[3] leader balance with the fewest leader changes",
    "[4] follower order: a broker's leaderships fail over to many brokers",
)


@dataclass(frozen=True)
class ReplicaPlan:
    """The reassignment and everything needed to judge it."""

    changes: tuple[PartitionChange, ...]
    brokers: tuple[BrokerLoad, ...]
    topics: int
    partitions: int
    replicas: int
    replica_moves: int
    lower_bound: int
    cluster_lower_bound: int
    round_robin_moves: int
    leader_changes: int
    rack_violations_before: int
    rack_violations_after: int
    rack_aware: bool
    notes: tuple[str, ...] = ()
    constraints: tuple[str, ...] = field(default=CONSTRAINTS)
    objectives: tuple[str, ...] = field(default=OBJECTIVES)

    @property
    def at_lower_bound(self) -> bool:
        return self.replica_moves == self.lower_bound

    def to_dict(self) -> dict[str, object]:
        """The summary for machines (`--json`): everything but the partition list."""
        return {
            "version": 1,
            "rack_aware": self.rack_aware,
            "topics": self.topics,
            "partitions": self.partitions,
            "replicas": self.replicas,
            "partitions_changed": len(self.changes),
            "replica_moves": self.replica_moves,
            "lower_bound": self.lower_bound,
            "cluster_lower_bound": self.cluster_lower_bound,
            "round_robin_moves": self.round_robin_moves,
            "leader_changes": self.leader_changes,
            "rack_violations": {
                "before": self.rack_violations_before,
                "after": self.rack_violations_after,
            },
            "constraints": list(self.constraints),
            "objectives": list(self.objectives),
            "notes": list(self.notes),
            "brokers": [asdict(b) for b in self.brokers],
        }


def assemble(
    counts: Sequence[TopicCounts],
    targets: Sequence[TopicTargets],
    plans: Sequence[TopicPlan],
    layout: BrokerLayout,
) -> ReplicaPlan:
    """Add the topics' results up: per-broker counts after, moves, bounds, violations."""
    size = layout.size
    replicas_before = np.zeros(size, dtype=np.int64)
    leaders_before = np.zeros(size, dtype=np.int64)
    replica_target = np.zeros(size, dtype=np.int64)
    leader_target = np.zeros(size, dtype=np.int64)
    lower_bound = 0
    by_topic = {t.topic: t for t in targets}
    for c in counts:
        t = by_topic[c.topic]
        replicas_before += c.replicas
        leaders_before += c.leaders
        replica_target += t.replicas
        leader_target += t.leaders
        lower_bound += int(np.maximum(c.replicas - t.replicas, 0).sum())
    index = {b: i for i, b in enumerate(layout.ids)}
    replicas_after = replicas_before.copy()
    leaders_after = leaders_before.copy()
    changes = sorted((ch for p in plans for ch in p.changes), key=lambda c: (c.topic, c.partition))
    moves = leader_changes = 0
    for ch in changes:
        for b in set(ch.before) - set(ch.after):
            replicas_after[index[b]] -= 1
        for b in set(ch.after) - set(ch.before):
            replicas_after[index[b]] += 1
        moves += ch.moves
        if ch.leader_changed:
            leader_changes += 1
            leaders_after[index[ch.before[0]]] -= 1
            leaders_after[index[ch.after[0]]] += 1
    violations_before = sum(c.rack_violations for c in counts)
    violations_after = violations_before
    if changes:
        for side, sign in (("before", -1), ("after", 1)):
            rows = [[index[b] for b in getattr(ch, side)] for ch in changes]
            width = max(len(r) for r in rows)
            matrix = np.full((len(rows), width), NO_BROKER, dtype=np.int64)
            for i, r in enumerate(rows):
                matrix[i, : len(r)] = r
            violations_after += sign * int(
                rack_violations(matrix, layout.rack_group, layout.rack_limits).sum()
            )
    brokers = []
    for i, b in enumerate(layout.ids):
        if not layout.target[i]:
            state = "removed"
        elif replicas_before[i] == 0:
            state = "added"
        else:
            state = "kept"
        brokers.append(
            BrokerLoad(
                b,
                layout.racks[i],
                state,
                int(replicas_before[i]),
                int(replicas_after[i]),
                int(replica_target[i]),
                int(leaders_before[i]),
                int(leaders_after[i]),
                int(leader_target[i]),
            )
        )
    return ReplicaPlan(
        changes=tuple(changes),
        brokers=tuple(brokers),
        topics=len(counts),
        partitions=sum(c.partitions for c in counts),
        replicas=int(replicas_before.sum()),
        replica_moves=moves,
        lower_bound=lower_bound,
        cluster_lower_bound=int(np.maximum(replicas_before - replica_target, 0).sum()),
        round_robin_moves=sum(p.round_robin_moves for p in plans),
        leader_changes=leader_changes,
        rack_violations_before=violations_before,
        rack_violations_after=violations_after,
        rack_aware=layout.rack_aware,
        notes=tuple(n for p in sorted(plans, key=lambda p: p.topic) for n in p.notes),
    )


def plan_replicas(
    topics: Sequence[TopicReplicas], layout: BrokerLayout, seed: int = 0
) -> ReplicaPlan:
    """The whole planner on one machine (the local engine)."""
    counts = [topic_counts(t, layout) for t in topics]
    targets = plan_targets(counts, layout)
    by_topic = {t.topic: t for t in targets}
    plans = [plan_topic(t, by_topic[t.topic], layout, seed) for t in topics]
    return assemble(counts, targets, balance_leaders(topics, plans, targets, layout), layout)
