"""The Kafka replica planner (KAFKA-19048): worked cases, properties, the codec."""

from __future__ import annotations

import json
import re
import zlib
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from ballast.balance.kafka.reassignment import (
    dumps,
    parse_assignment,
    parse_broker_ids,
    parse_brokers,
    reassignment_document,
    rollback_document,
)
from ballast.balance.kafka.replicas import (
    BrokerLayout,
    KafkaBroker,
    PartitionAssignment,
    ReplicaInputError,
    ReplicaPlan,
    check_feasible,
    group_topics,
    kafka_assignment,
    make_layout,
    plan_replicas,
    plan_targets,
    round_robin_moves,
    topic_counts,
)
from ballast.balance.kafka.targets import spread_extras, water_fill


def plan_of(
    brokers: Sequence[KafkaBroker],
    assignment: Sequence[PartitionAssignment],
    add: Sequence[int] = (),
    remove: Sequence[int] = (),
    rack_aware: bool = True,
) -> tuple[ReplicaPlan, BrokerLayout]:
    max_rf = max(len(a.replicas) for a in assignment)
    layout = make_layout(brokers, add, remove, rack_aware, max_rf)
    topics = group_topics(assignment, layout)
    check_feasible(topics, layout, strict=False)
    return plan_replicas(topics, layout), layout


def applied(
    assignment: Sequence[PartitionAssignment], plan: ReplicaPlan
) -> list[PartitionAssignment]:
    after = {(c.topic, c.partition): c.after for c in plan.changes}
    return [
        PartitionAssignment(a.topic, a.partition, after.get((a.topic, a.partition), a.replicas))
        for a in assignment
    ]


def per_broker(assignment: Sequence[PartitionAssignment]) -> Counter[int]:
    return Counter(b for a in assignment for b in a.replicas)


# ------------------------------------------------------------------ the worked cases


def test_seven_six_zero_zero_becomes_four_three_three_three_in_six_moves() -> None:
    brokers = [KafkaBroker(i) for i in (1, 2, 3, 4)]
    current = [PartitionAssignment("t", p, (1 if p < 7 else 2,)) for p in range(13)]
    plan, _ = plan_of(brokers, current, rack_aware=False)
    assert plan.replica_moves == 6 == plan.lower_bound
    assert [b.replicas_after for b in plan.brokers] == [4, 3, 3, 3]
    assert [b.leaders_after for b in plan.brokers] == [4, 3, 3, 3]
    assert per_broker(applied(current, plan)) == {1: 4, 2: 3, 3: 3, 4: 3}


def test_removing_one_of_twenty_brokers_moves_exactly_one_replica() -> None:
    brokers = [KafkaBroker(i) for i in range(20)]
    current = [PartitionAssignment("t", p, (2 * p, 2 * p + 1)) for p in range(10)]
    for rack_aware in (True, False):
        plan, _ = plan_of(brokers, current, remove=[7], rack_aware=rack_aware)
        assert plan.replica_moves == 1 == plan.lower_bound
        (change,) = plan.changes
        assert change.partition == 3 and 7 in change.before and 7 not in change.after
        assert change.before[0] == change.after[0] == 6  # the leader stays
        assert plan.leader_changes == 0
        # Kafka's --generate reshuffles nearly everything for the same change.
        assert plan.round_robin_moves > 10


def test_new_brokers_take_their_share_and_nobody_else_moves() -> None:
    brokers = [KafkaBroker(i, f"r{i % 3}") for i in range(6)]
    current = [
        PartitionAssignment("orders", p, (p % 6, (p + 1) % 6, (p + 2) % 6)) for p in range(12)
    ]
    plan, _ = plan_of([*brokers, KafkaBroker(6, "r0"), KafkaBroker(7, "r1")], current)
    loads = {b.id: b for b in plan.brokers}
    # r2 holds two brokers but still one replica per partition (anti-affinity caps it):
    # 12 replicas each for brokers 2 and 5... split 6/6; r0 and r1 share 12 over 3 brokers.
    assert [loads[b].replicas_after for b in (2, 5)] == [6, 6]
    assert all(loads[b].replicas_after == 4 for b in (0, 1, 3, 4, 6, 7))
    assert plan.replica_moves == plan.lower_bound == 8
    assert plan.rack_violations_before == plan.rack_violations_after == 0


def test_rack_violations_are_fixed_first() -> None:
    brokers = [KafkaBroker(i, f"r{i // 2}") for i in range(6)]  # r0: 0,1  r1: 2,3  r2: 4,5
    current = [
        PartitionAssignment("t", 0, (0, 1, 2)),  # r0 twice
        PartitionAssignment("t", 1, (2, 4, 0)),
        PartitionAssignment("t", 2, (5, 3, 1)),
    ]
    plan, _ = plan_of(brokers, current)
    assert plan.rack_violations_before == 1
    assert plan.rack_violations_after == 0
    fixed = applied(current, plan)
    assert len({b // 2 for b in fixed[0].replicas}) == 3
    # Without rack-awareness the same cluster is already balanced: nothing moves.
    assert plan_of(brokers, current, rack_aware=False)[0].changes == ()


def test_brokers_without_a_rack_are_never_in_conflict() -> None:
    brokers = [KafkaBroker(0, "a"), KafkaBroker(1, "a"), KafkaBroker(2), KafkaBroker(3)]
    current = [PartitionAssignment("t", p, (2, 3)) for p in range(4)]
    plan, _ = plan_of(brokers, current)
    after = applied(current, plan)
    assert all(not {0, 1} <= set(a.replicas) for a in after)
    assert [b.replicas_after for b in plan.brokers] == [2, 2, 2, 2]


def test_cluster_totals_are_balanced_across_many_small_topics() -> None:
    # 30 one-partition RF-1 topics on broker 0; per topic any broker is "balanced", so
    # per-topic planning alone would leave the cluster lopsided. Totals must be 10/10/10.
    brokers = [KafkaBroker(i) for i in range(3)]
    current = [PartitionAssignment(f"t{i:02d}", 0, (0,)) for i in range(30)]
    plan, _ = plan_of(brokers, current, rack_aware=False)
    assert [b.replicas_after for b in plan.brokers] == [10, 10, 10]
    assert plan.replica_moves == plan.lower_bound == plan.cluster_lower_bound == 20


def test_a_balanced_cluster_is_left_alone() -> None:
    brokers = [KafkaBroker(i, f"r{i % 3}") for i in range(6)]
    current = [PartitionAssignment("t", p, (p % 6, (p + 1) % 6, (p + 2) % 6)) for p in range(6)]
    plan, _ = plan_of(brokers, current)
    assert plan.changes == () and plan.replica_moves == plan.lower_bound == 0


def test_follower_order_spreads_a_failed_brokers_leaderships() -> None:
    # Broker 0 leads 6 partitions; all move their followers to the 4 new brokers.
    brokers = [KafkaBroker(i) for i in range(6)]
    current = [PartitionAssignment("t", p, (0, 1)) for p in range(6)]
    plan, _ = plan_of(brokers, current, rack_aware=False)
    after = applied(current, plan)
    seconds = Counter(a.replicas[1] for a in after if a.replicas[0] == 0)
    assert max(seconds.values(), default=0) <= 1


# ------------------------------------------------------------------ targets


def test_water_fill_caps_and_redistributes_exactly() -> None:
    # 10 replicas over racks of 5, 1 and 1 brokers, at most 4 per rack (4 partitions).
    shares = water_fill(10, np.array([5, 1, 1]), np.array([4, 4, 4]))
    assert shares.whole.tolist() == [4, 3, 3]
    assert shares.extra == 0
    shares = water_fill(7, np.array([1, 1, 1]), np.array([9, 9, 9]))
    assert shares.whole.tolist() == [2, 2, 2] and shares.extra == 1
    assert shares.remainder.tolist() == [1, 1, 1] and shares.denominator == 3


def test_spread_extras_keeps_replicas_where_they_are_when_it_can() -> None:
    # Two topics of 1 replica over 2 bins: each has one extra; bin 1 holds topic 0's
    # replica, bin 0 holds topic 1's. Keeping both costs nothing and balances the totals.
    one = water_fill(1, np.array([1, 1]), np.array([1, 1]))
    targets = spread_extras([one, one], [np.array([0, 1]), np.array([1, 0])])
    assert [t.tolist() for t in targets] == [[0, 1], [1, 0]]


# ------------------------------------------------------------------ properties


# brokers, current assignment, brokers to add, brokers to remove, rack-aware
Case = tuple[list[KafkaBroker], list[PartitionAssignment], list[int], list[int], bool]


@st.composite
def clusters(draw: st.DrawFn, rack_aware: bool | None = None) -> Case:
    n = draw(st.integers(2, 8))
    racks = draw(st.integers(1, 4))
    brokers = [
        KafkaBroker(i, draw(st.one_of(st.none(), st.sampled_from([f"r{k}" for k in range(racks)]))))
        for i in range(n)
    ]
    assignment = []
    for t in range(draw(st.integers(1, 3))):
        rf = draw(st.integers(1, min(3, n)))
        for p in range(draw(st.integers(1, 10))):
            replicas = draw(st.permutations(range(n)))[:rf]
            assignment.append(PartitionAssignment(f"t{t}", p, tuple(replicas)))
    add = draw(st.lists(st.integers(n, n + 2), max_size=2, unique=True))
    remove = draw(st.lists(st.integers(0, n - 1), max_size=1, unique=True))
    aware = draw(st.booleans()) if rack_aware is None else rack_aware
    event("rack-aware" if aware else "not rack-aware")
    return brokers, assignment, add, remove, aware


def _feasible(case: Case) -> tuple[ReplicaPlan, BrokerLayout]:
    try:
        return plan_of(*case)
    except ReplicaInputError:
        assume(False)
        raise


# Derandomized: the same examples on every run, so CI never flakes; raise max_examples
# (and drop derandomize) to explore further by hand.
PROPERTY = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


@PROPERTY
@given(clusters())
def test_plan_reaches_its_targets_with_the_fewest_moves(case: Case) -> None:
    assignment, rack_aware = case[1], case[4]
    plan, layout = _feasible(case)
    topics = group_topics(assignment, layout)
    targets = plan_targets([topic_counts(t, layout) for t in topics], layout)
    after = applied(assignment, plan)
    stuck = [n for n in plan.notes if not n.startswith("[beyond-lower-bound]")]
    event("stuck: some target missed" if stuck else "all targets met")
    if not stuck:
        # Every broker holds exactly its target of every topic.
        for t in targets:
            held = per_broker([a for a in after if a.topic == t.topic])
            for i, b in enumerate(layout.ids):
                assert held.get(b, 0) == t.replicas[i], (t.topic, b)
        if plan.rack_violations_before == 0 or not rack_aware:
            # At the lower bound, but for moves the planner reports as beyond it (a replica
            # that fits only brokers already at their target).
            extra = sum(
                int(m.group(1))
                for n in plan.notes
                if (m := re.match(r"\[beyond-lower-bound\] .*: (\d+) extra move", n))
            )
            assert plan.replica_moves == plan.lower_bound + extra
    if not rack_aware:
        assert not stuck  # without racks every target is reached
    # Each broker within one replica of the cluster-wide share (equal weights).
    if not rack_aware:
        kept = [b for b in plan.brokers if b.state != "removed"]
        share = plan.replicas / len(kept)
        assert all(int(share) <= b.replica_target <= -(-plan.replicas // len(kept)) for b in kept)
        assert all(b.replicas_after == b.replica_target for b in kept)
    assert all(b.replicas_after == 0 for b in plan.brokers if b.state == "removed")
    assert all(len(set(a.replicas)) == len(a.replicas) for a in after)


@PROPERTY
@given(clusters(rack_aware=True))
def test_no_rack_holds_two_replicas_when_racks_allow(case: Case) -> None:
    assignment = case[1]
    plan, layout = _feasible(case)
    after = applied(assignment, plan)
    racks_left = {layout.racks[i] or f"-{b}" for i, b in enumerate(layout.ids) if layout.target[i]}
    rack_of = {b: r for b, r in zip(layout.ids, layout.racks, strict=True)}
    if not any(n.startswith("[rack-anti-affinity]") for n in plan.notes):
        assert plan.rack_violations_after == 0
        for a in after:
            if len(racks_left) >= len(a.replicas):
                named = [rack_of[b] for b in a.replicas if rack_of[b] is not None]
                assert len(named) == len(set(named)), a


@PROPERTY
@given(clusters())
def test_leaders_within_floor_and_ceiling_where_replicas_allow(case: Case) -> None:
    assignment = case[1]
    plan, layout = _feasible(case)
    topics = group_topics(assignment, layout)
    targets = plan_targets([topic_counts(t, layout) for t in topics], layout)
    after = applied(assignment, plan)
    for t in targets:
        parts = [a for a in after if a.topic == t.topic]
        n = int(layout.target.sum())
        held = per_broker(parts)
        for i, b in enumerate(layout.ids):
            # A target is the fair share ⌊P/N⌋..⌈P/N⌉, or all it holds when that is less.
            if layout.target[i]:
                lo, hi = len(parts) // n, -(-len(parts) // n)
                wanted = int(t.leaders[i])
                assert wanted <= held.get(b, 0) or plan.notes
                assert wanted <= hi or wanted <= int(t.replicas[i])
                assert wanted >= min(lo, int(t.replicas[i])) or wanted == int(t.replicas[i])
        led = Counter(a.replicas[0] for a in parts)
        assert sum(led.values()) == len(parts)
        if not plan.notes:
            # Off target only when a chain of hand-offs would be too long: by at most 1.
            assert all(abs(led.get(b, 0) - t.leaders[i]) <= 1 for i, b in enumerate(layout.ids))


@PROPERTY
@given(clusters())
def test_planning_the_plan_again_moves_no_replica(case: Case) -> None:
    assignment, rack_aware = case[1], case[4]
    plan, layout = _feasible(case)
    assume(not [n for n in plan.notes if not n.startswith("[beyond-lower-bound]")])
    again, _ = plan_of(
        [KafkaBroker(b, layout.racks[i]) for i, b in enumerate(layout.ids) if layout.target[i]],
        [
            a
            for a in applied(assignment, plan)
            if all(layout.target[layout.index(b)] for b in a.replicas)
        ],
        rack_aware=rack_aware,
    )
    # A partition already where its targets want it never moves a replica again.
    assert again.replica_moves == 0
    # Leader targets are a cluster-wide rounding of fractional shares, and the rounding
    # may tip the other way once replicas sit elsewhere: a re-plan may switch a few
    # leaders (cheap, no data moves), never a replica set.
    assert all(set(ch.before) == set(ch.after) for ch in again.changes)
    if again.changes:
        event("re-plan switches leaders")


# ------------------------------------------------------------------ input errors and codec


def test_bad_input_names_the_partition_and_the_value() -> None:
    def error(text: str) -> str:
        with pytest.raises(ReplicaInputError) as info:
            parse_assignment(text, "current.json")
        return str(info.value)

    assert "not valid JSON" in error('{"version":1,"partitions":[')
    assert "orders-3: duplicate replicas [1, 2, 1]" in error(
        '{"version":1,"partitions":[{"topic":"orders","partition":3,"replicas":[1,2,1]}]}'
    )
    assert "orders-0 is listed twice" in error(
        '{"partitions":[{"topic":"orders","partition":0,"replicas":[1]},'
        '{"topic":"orders","partition":0,"replicas":[2]}]}'
    )
    assert "partition must be an integer ≥ 0, got -1" in error(
        '{"partitions":[{"topic":"orders","partition":-1,"replicas":[1]}]}'
    )
    assert "replicas must be a non-empty list" in error(
        '{"partitions":[{"topic":"orders","partition":0,"replicas":["1"]}]}'
    )
    assert "log_dirs must list one string per replica (2)" in error(
        '{"partitions":[{"topic":"o","partition":0,"replicas":[1,2],"log_dirs":["any"]}]}'
    )
    assert "unsupported version 2" in error('{"version":2,"partitions":[]}')
    brokers = [KafkaBroker(1), KafkaBroker(2)]
    layout = make_layout(brokers, max_rf=3)
    with pytest.raises(
        ReplicaInputError, match=r"orders-5: replicas \[1, 9\] name unknown .*\[9\]"
    ):
        group_topics([PartitionAssignment("orders", 5, (1, 9))], layout)
    topics = group_topics([PartitionAssignment("orders", 5, (1, 2))], layout)
    with pytest.raises(ReplicaInputError, match="orders-5: replication factor 2 larger than"):
        check_feasible(topics, make_layout(brokers, remove=[2], max_rf=2), strict=False)
    racked = [KafkaBroker(1, "a"), KafkaBroker(2, "a"), KafkaBroker(3, "b")]
    layout = make_layout(racked, max_rf=3)
    topics = group_topics([PartitionAssignment("logs", 0, (1, 2, 3))], layout)
    check_feasible(topics, layout, strict=False)
    with pytest.raises(
        ReplicaInputError, match=r"logs-0: replication factor 3 larger than .*racks: 2"
    ):
        check_feasible(topics, layout, strict=True)
    with pytest.raises(ReplicaInputError, match="--remove 7: not a known broker"):
        make_layout(brokers, remove=[7])
    with pytest.raises(ReplicaInputError, match="broker 1 is listed twice"):
        make_layout([*brokers, KafkaBroker(1)])
    with pytest.raises(ReplicaInputError, match="'x' is not a broker id"):
        parse_broker_ids("7,x", "--add")
    with pytest.raises(ReplicaInputError, match=r"brokers\[1\]: rack of broker 2"):
        parse_brokers('{"brokers":[{"id":1},{"id":2,"rack":5}]}', "brokers.json")


def test_brokers_file_forms() -> None:
    expected = [KafkaBroker(1, "a"), KafkaBroker(2, None)]
    assert parse_brokers('{"brokers":[{"id":1,"rack":"a"},{"id":2}]}') == expected
    assert parse_brokers('[{"id":1,"rack":"a"},{"id":2,"rack":null}]') == expected
    assert parse_brokers("[1, 2]") == [KafkaBroker(1), KafkaBroker(2)]
    assert parse_broker_ids(" 7, 8 ", "--add") == [7, 8]


def test_reassignment_and_rollback_documents_keep_log_dirs() -> None:
    text = json.dumps(
        {
            "version": 1,
            "partitions": [
                {"topic": "t", "partition": 0, "replicas": [1, 2], "log_dirs": ["/d1", "/d2"]},
                {"topic": "t", "partition": 1, "replicas": [2, 1]},
            ],
        }
    )
    current = parse_assignment(text)
    plan, _ = plan_of([KafkaBroker(b) for b in (1, 2, 3)], current, rack_aware=False)
    dirs = {(a.topic, a.partition): a.log_dirs for a in current}
    out = json.loads(dumps(reassignment_document(plan.changes, dirs)))
    back = json.loads(dumps(rollback_document(plan.changes, dirs)))
    assert out["version"] == back["version"] == 1
    assert len(out["partitions"]) == len(plan.changes) >= 1
    for entry, ch in zip(out["partitions"], plan.changes, strict=True):
        assert entry["replicas"] == list(ch.after)
        old = dict(zip(ch.before, dirs[ch.topic, ch.partition] or ("any",) * 2, strict=True))
        assert entry["log_dirs"] == [old.get(b, "any") for b in ch.after]
    assert [p["replicas"] for p in back["partitions"]] == [list(c.before) for c in plan.changes]
    # The documents parse back as assignments (what --execute would read).
    assert len(parse_assignment(dumps(reassignment_document(plan.changes, dirs)))) == len(
        plan.changes
    )


# --- the --generate baseline: Kafka's AdminUtils.assignReplicasToBrokers ------------------


def kafka_rack_layout(racks: dict[int, str]) -> BrokerLayout:
    return make_layout([KafkaBroker(b, r) for b, r in racks.items()], max_rf=3)


def generated(layout: BrokerLayout, partitions: int, rf: int, start: int) -> list[list[int]]:
    """`assignReplicasToBrokers(…, fixedStartIndex=start)` as broker ids."""
    order = layout.round_robin_order
    racks = layout.rack_group[order] if layout.rack_aware else None
    rows = kafka_assignment(order, racks, partitions, rf, start, start)
    return [[layout.ids[i] for i in row] for row in rows.tolist()]


def test_get_rack_alternated_broker_list_and_assign_replicas_to_brokers() -> None:
    # AdminRackAwareTest#testGetRackAlternatedBrokerListAndAssignReplicasToBrokers
    layout = kafka_rack_layout(
        {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    )
    assert [layout.ids[i] for i in layout.round_robin_order] == [0, 3, 1, 5, 4, 2]
    assert generated(layout, 7, 3, 0) == [
        [0, 3, 1], [3, 1, 5], [1, 5, 4], [5, 4, 2], [4, 2, 0], [2, 0, 3], [0, 4, 2],
    ]  # fmt: skip


def test_replica_assignment_without_racks() -> None:
    # AdminTest#testReplicaAssignment (rack-unaware, fixed start index 0)
    layout = make_layout([KafkaBroker(b) for b in range(5)], rack_aware=False, max_rf=3)
    assert generated(layout, 10, 3, 0) == [
        [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 0], [4, 0, 1],
        [0, 2, 3], [1, 3, 4], [2, 4, 0], [3, 0, 1], [4, 1, 2],
    ]  # fmt: skip


def test_assignment_with_rack_aware() -> None:
    # AdminRackAwareTest#testAssignmentWithRackAware: 6 brokers in 3 uneven racks, 6
    # partitions at RF 3 from index 2: every partition in 3 racks, every broker 3 replicas
    # and 1 leader (ensureRackAwareAndEvenDistribution).
    racks = {0: "rack1", 1: "rack2", 2: "rack2", 3: "rack3", 4: "rack3", 5: "rack1"}
    rows = generated(kafka_rack_layout(racks), 6, 3, 2)
    assert all(len({racks[b] for b in row}) == 3 for row in rows)
    assert Counter(b for row in rows for b in row) == {b: 3 for b in racks}
    assert Counter(row[0] for row in rows) == {b: 1 for b in racks}


@settings(max_examples=60, deadline=None)
@given(
    racks=st.lists(st.sampled_from("abcd"), min_size=2, max_size=9),
    partitions=st.integers(1, 40),
    rf=st.integers(1, 4),
    start=st.integers(0, 20),
    shift=st.integers(0, 20),
)
def test_rack_aware_baseline_never_puts_two_replicas_in_one_rack(
    racks: list[str], partitions: int, rf: int, start: int, shift: int
) -> None:
    """Kafka's rack-aware assignment: distinct brokers, and distinct racks while there are
    racks enough (beyond them, every rack before any repeats)."""
    layout = make_layout([KafkaBroker(b, r) for b, r in enumerate(racks)], max_rf=4)
    rf = min(rf, len(racks))
    order = layout.round_robin_order
    rows = kafka_assignment(
        order, layout.rack_group[order], partitions, rf, start % len(racks), shift
    ).tolist()
    n_racks = len(set(racks))
    for row in rows:
        assert len(set(row)) == rf
        assert len({racks[layout.ids[i]] for i in row}) == min(rf, n_racks), row


def test_round_robin_baseline_is_kafkas_rack_aware_assignment() -> None:
    # The figure `plan kafka` reports is measured against what --generate proposes: a
    # topic already laid out exactly so needs no move against it, and no baseline row
    # puts two replicas in one rack (the rack-unaware round robin over the same list did:
    # with shift 1, partition 0 got brokers 0, 1 and 5, two of them in rack1).
    racks = {0: "rack1", 1: "rack2", 2: "rack2", 3: "rack3", 4: "rack3", 5: "rack1"}
    layout = kafka_rack_layout(racks)
    order = layout.round_robin_order
    name, n = "orders", len(order)
    start = zlib.crc32(f"0/{name}/start".encode()) % n
    shift = zlib.crc32(f"0/{name}/shift".encode()) % n
    rows = kafka_assignment(order, layout.rack_group[order], 12, 3, start, shift)
    assignment = [
        PartitionAssignment(name, p, tuple(layout.ids[i] for i in row))
        for p, row in enumerate(rows.tolist())
    ]
    (topic,) = group_topics(assignment, layout)
    assert round_robin_moves(topic, layout, seed=0) == 0
    assert all(len({racks[b] for b in a.replicas}) == 3 for a in assignment)
