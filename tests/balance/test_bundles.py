"""Namespace bundles: ranges, CRC-32 mapping, the four split algorithms, automatic split."""

from __future__ import annotations

import itertools
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.balance.pulsar.bundles import (
    FULL_UPPER,
    BundleError,
    BundleRange,
    BundleStats,
    NamespaceBundles,
    TopicTraffic,
    decide_splits,
    even_boundaries,
    flow_or_qps_equally_divide,
    parse_algorithm,
    parse_position,
    specified_positions_divide,
    split_bundle,
    split_positions,
    topic_count_equally_divide,
    topic_hash,
)
from ballast.config import PulsarConfig, SplitAlgorithm


def test_crc32_is_zlib_ieee_of_the_full_name() -> None:
    assert topic_hash("123456789") == 0xCBF43926  # the CRC-32/IEEE check value
    assert topic_hash("/default/orders") == zlib.crc32(b"/default/orders")


def test_default_four_bundles_print_as_pulsar() -> None:
    ns = NamespaceBundles.create("default", 4)
    assert ns.names() == (
        "default/0x00000000_0x40000000",
        "default/0x40000000_0x80000000",
        "default/0x80000000_0xc0000000",
        "default/0xc0000000_0xffffffff",
    )


def test_sixteen_bundles_and_the_closed_last_range() -> None:
    ns = NamespaceBundles.create("ns", 16)
    assert len(ns) == 16
    assert ns.ranges[1] == BundleRange(0x10000000, 0x20000000)
    assert ns.bundle_for_hash(FULL_UPPER) == BundleRange(0xF0000000, FULL_UPPER)
    assert ns.bundle_for_hash(0x10000000) == BundleRange(0x10000000, 0x20000000)
    assert ns.bundle_for_hash(0x0FFFFFFF) == BundleRange(0, 0x10000000)


def test_topic_lands_in_the_bundle_holding_its_hash() -> None:
    ns = NamespaceBundles.create("default", 4)
    topic = "/default/orders"
    h = zlib.crc32(topic.encode())
    bundle = ns.bundle_for_topic(topic)
    assert bundle.lower <= h < bundle.upper


def test_bad_bundle_counts_and_names_are_clear_errors() -> None:
    with pytest.raises(BundleError, match="invalid number of bundles 0"):
        even_boundaries(0)
    with pytest.raises(BundleError, match="'0x1_0x2'"):
        BundleRange.parse("0x1_0x2")
    ns = NamespaceBundles.create("default", 4)
    with pytest.raises(BundleError, match="has no bundle 0x00000000_0x20000000"):
        ns.find("default/0x00000000_0x20000000")
    with pytest.raises(BundleError, match="does not belong to namespace 'default'"):
        ns.find("other/0x00000000_0x40000000")
    with pytest.raises(BundleError, match="unknown split algorithm 'halves'"):
        parse_algorithm("halves")
    with pytest.raises(BundleError, match="'zz'"):
        parse_position("zz")


def test_overlapping_and_gapped_ranges_are_rejected() -> None:
    with pytest.raises(BundleError, match="overlapping ranges 0x00000000_0x80000000 and "):
        NamespaceBundles.from_ranges(
            "ns",
            [
                BundleRange(0, 0x80000000),
                BundleRange(0x70000000, FULL_UPPER),
            ],
        )
    with pytest.raises(BundleError, match="gap between"):
        NamespaceBundles.from_ranges(
            "ns", [BundleRange(0, 0x70000000), BundleRange(0x80000000, FULL_UPPER)]
        )
    ok = NamespaceBundles.from_ranges(
        "ns", [BundleRange(0x80000000, FULL_UPPER), BundleRange(0, 0x80000000)]
    )
    assert ok == NamespaceBundles("ns", (0, 0x80000000, FULL_UPPER))


def test_range_equally_divide_halves_the_range() -> None:
    ns = NamespaceBundles.create("default", 4)
    first = ns.ranges[0]
    after, result = split_bundle(ns, first, "range_equally_divide")
    assert result.positions == (0x20000000,)
    assert after.names()[:2] == ("default/0x00000000_0x20000000", "default/0x20000000_0x40000000")
    assert len(after) == 5


def test_topic_count_equally_divide_cuts_between_the_middle_hashes() -> None:
    ns = NamespaceBundles.create("ns", 1)
    whole = ns.ranges[0]
    topics = [f"/ns/t{i}" for i in range(6)]
    hashes = sorted(topic_hash(t) for t in topics)
    result = split_positions(
        ns, whole, SplitAlgorithm.TOPIC_COUNT_EQUALLY_DIVIDE, [TopicTraffic(t) for t in topics]
    )
    expected = hashes[2] + (hashes[3] - hashes[2]) // 2
    assert result.positions == (expected,)
    after = ns.split(whole, result.positions)
    groups = after.group_topics(topics)
    assert sorted(len(g) for g in groups.values()) == [3, 3]
    # Pulsar: one topic cannot be split.
    one = split_positions(ns, whole, "topic_count_equally_divide", [TopicTraffic("/ns/a")])
    assert one.positions == ()
    assert "need two" in one.reason


def test_specified_positions_outside_the_bundle_are_an_error_naming_the_value() -> None:
    ns = NamespaceBundles.create("default", 4)
    second = ns.ranges[1]
    with pytest.raises(BundleError, match="split position 0x10000000 is outside bundle"):
        split_positions(ns, second, "specified_positions_divide", positions=[0x10000000])
    with pytest.raises(BundleError, match="needs --positions"):
        split_positions(ns, second, "specified_positions_divide")
    topics = [TopicTraffic(t) for t in in_bundle(ns, second, 2)]
    after, result = split_bundle(
        ns, second, "specified_positions_divide", topics, positions=[0x60000000, 0x50000000]
    )
    assert result.positions == (0x50000000, 0x60000000)
    assert len(after) == 6


def test_flow_or_qps_cuts_where_the_running_rate_passes_the_maximum() -> None:
    cfg = PulsarConfig(
        namespace_bundle_max_msg_rate=1000, namespace_bundle_max_bandwidth_mbytes=100
    )
    ns = NamespaceBundles.create("ns", 1)
    whole = ns.ranges[0]
    topics = [TopicTraffic(f"/ns/t{i}", msg_rate=400.0) for i in range(6)]  # 2400 msg/s
    topics.append(TopicTraffic("/ns/idle"))  # skipped: no traffic
    by_hash = sorted((topic_hash(t.topic), t) for t in topics if t.msg_rate)
    result = split_positions(ns, whole, "flow_or_qps_equally_divide", topics, config=cfg)
    # 400 + 400 fits 1000, the third passes it: cut between the 2nd and 3rd, 4th and 5th.
    h = [x for x, _ in by_hash]
    assert result.positions == (h[1] + (h[2] - h[1]) // 2 + 1, h[3] + (h[4] - h[3]) // 2 + 1)
    quiet = [TopicTraffic(f"/ns/q{i}", msg_rate=100.0) for i in range(5)]
    assert (
        split_positions(ns, whole, "flow_or_qps_equally_divide", quiet, config=cfg).positions == ()
    )


def test_auto_split_any_threshold_up_to_the_maximum_bundles() -> None:
    cfg = PulsarConfig(namespace_maximum_bundles=5)
    ns = NamespaceBundles.create("default", 4)
    r = ns.ranges
    stats = {
        "default": {
            r[0]: BundleStats(topics=1001, sessions=10, msg_rate=10.0, throughput=0.0),
            r[1]: BundleStats(topics=5, sessions=10, msg_rate=30_001.0, throughput=0.0),
            r[2]: BundleStats(topics=1, sessions=2000, msg_rate=0.0, throughput=0.0),
            r[3]: BundleStats(topics=2, sessions=0, msg_rate=0.0, throughput=100 * 1024 * 1024),
        }
    }
    plan = decide_splits({"default": ns}, stats, cfg)
    assert [s.name for s in plan.splits] == ["default/0x00000000_0x40000000"]
    assert plan.splits[0].exceeded == ("topics 1001 > 1000",)
    assert plan.skipped == {
        "default/0x40000000_0x80000000": (
            "[max-bundles] msg rate 30001/s > 30000/s, but default has 5 bundles "
            "(loadBalancerNamespaceMaximumBundles 5)"
        ),
        "default/0x80000000_0xc0000000": (
            "[one-topic] sessions 2000 > 1000, but a single topic cannot split"
        ),
    }
    # exactly 100 MB/s is not above the maximum
    assert (
        decide_splits({"default": ns}, stats, PulsarConfig(auto_bundle_split_enabled=False)).splits
        == ()
    )


def test_bundles_round_trip_through_json() -> None:
    ns = NamespaceBundles.create("default", 4).split(BundleRange(0, 0x40000000), [0x1000])
    assert NamespaceBundles.from_dict(ns.to_dict()) == ns


# --- properties -------------------------------------------------------------------------

cuts = st.lists(st.integers(1, FULL_UPPER - 1), max_size=20)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 64), extra=cuts, probes=st.lists(st.integers(0, FULL_UPPER), max_size=30))
def test_bundles_always_partition_the_full_range(
    n: int, extra: list[int], probes: list[int]
) -> None:
    ns = NamespaceBundles.create("ns", n)
    for p in extra:
        bundle = ns.bundle_for_hash(p)
        if bundle.is_inside(p):
            ns = ns.split(bundle, [p])
    ranges = ns.ranges
    assert ranges[0].lower == 0 and ranges[-1].upper == FULL_UPPER
    assert all(a.upper == b.lower for a, b in itertools.pairwise(ranges))
    for h in [*probes, 0, FULL_UPPER]:
        assert sum(r.contains(h) for r in ranges) == 1
        assert ns.bundle_for_hash(h).contains(h)


@settings(max_examples=60, deadline=None)
@given(
    names=st.lists(
        st.text("abcdefgh0123456789", min_size=1, max_size=8), min_size=2, max_size=40, unique=True
    ),
    algorithm=st.sampled_from(
        [
            SplitAlgorithm.RANGE_EQUALLY_DIVIDE,
            SplitAlgorithm.TOPIC_COUNT_EQUALLY_DIVIDE,
            SplitAlgorithm.FLOW_OR_QPS_EQUALLY_DIVIDE,
        ]
    ),
    n=st.integers(1, 8),
)
def test_a_split_keeps_every_topic_in_exactly_one_bundle(
    names: list[str], algorithm: SplitAlgorithm, n: int
) -> None:
    cfg = PulsarConfig(namespace_bundle_max_msg_rate=50)
    ns = NamespaceBundles.create("ns", n)
    topics = [f"/ns/{x}" for x in names]
    groups = ns.group_topics(topics)
    bundle = max(groups, key=lambda b: (len(groups[b]), b))
    traffic = [TopicTraffic(t, msg_rate=20.0) for t in groups[bundle]]
    after, result = split_bundle(ns, bundle, algorithm, traffic, config=cfg)
    new_groups = after.group_topics(topics)
    assert sorted(t for g in new_groups.values() for t in g) == sorted(topics)
    for t in topics:
        assert sum(r.contains(topic_hash(t)) for r in after.ranges) == 1
    # topics outside the split bundle keep their bundle
    for b, ts in groups.items():
        if b != bundle:
            assert new_groups[b] == ts
    assert len(after) == len(ns) + len(result.positions)


# --- Pulsar's split-algorithm unit tests, ported ------------------------------------------


def test_pulsar_topic_count_split_of_a_b_c() -> None:
    hashes = sorted(topic_hash(t) for t in ("a", "b", "c"))
    whole = BundleRange(0, FULL_UPPER)
    assert topic_count_equally_divide(whole, ["a", "b", "c"]) == (
        hashes[0] + (hashes[1] - hashes[0]) // 2,
    )
    assert topic_count_equally_divide(whole, ["a"]) == ()


def in_bundle(ns: NamespaceBundles, bundle: BundleRange, n: int) -> list[str]:
    """The first `n` topics `/ns/t<i>` that hash into `bundle`."""
    names = (f"/{ns.namespace}/t{i}" for i in itertools.count())
    return list(itertools.islice((t for t in names if bundle.contains(topic_hash(t))), n))


def test_pulsar_specified_positions_inside_the_bundle() -> None:
    # SpecifiedPositionsBundleSplitAlgorithmTest#testAlgorithmReturnCorrectResult (2 topics)
    bundle = BundleRange(1, 1000)
    assert specified_positions_divide(bundle, [100, 200, 500, 800], 2) == (100, 200, 500, 800)
    # Pulsar ignores -1, 0, 1, 1000 and 1100; Ballast names the first bad one
    with pytest.raises(BundleError, match="split position -1 is outside bundle"):
        specified_positions_divide(bundle, [-1, 0, 1, 100, 200, 500, 800, 1000, 1100], 2)


def test_pulsar_specified_positions_total_topics_size_less_than_1() -> None:
    # SpecifiedPositionsBundleSplitAlgorithmTest#testTotalTopicsSizeLessThan1: a bundle
    # owning one topic is not split, whatever the positions.
    assert specified_positions_divide(BundleRange(1, 1000), [100, 200], 1) == ()
    ns = NamespaceBundles.create("default", 4)
    second = ns.ranges[1]
    one = [TopicTraffic(t) for t in in_bundle(ns, second, 1)]
    other = [TopicTraffic(t) for t in in_bundle(ns, ns.ranges[0], 3)]  # not in the bundle
    after, result = split_bundle(
        ns, second, "specified_positions_divide", one + other, positions=[0x50000000]
    )
    assert result.positions == () and after == ns
    assert "1 topic(s): a bundle with at most one topic is not split" in result.reason


def test_pulsar_find_bundle_of_a_topic_of_another_namespace_is_an_error() -> None:
    # NamespaceBundles.findBundle: checkArgument(nsname.equals(topicName.getNamespaceObject()))
    ns = NamespaceBundles.create("default", 4)
    with pytest.raises(BundleError, match="'/other/t1' belongs to namespace 'other'"):
        ns.bundle_for_topic("/other/t1")
    with pytest.raises(BundleError, match="belongs to namespace 'other'"):
        ns.group_topics(["/default/t1", "/other/t1"])
    assert ns.bundle_for_topic("/default/t1") in ns.ranges


def test_pulsar_flow_or_qps_every_part_stays_below_the_maximum() -> None:
    ns = "test-namespace1"
    traffic = []
    for i in range(1, 13):
        rate = 24.5 + 25 if i < 6 else 25.5 + 25
        traffic += [TopicTraffic(f"/{ns}/test{i}-partition-{j}", rate, 2000.0) for j in range(20)]
    traffic.append(TopicTraffic(f"/{ns}/test695-partition-0", 60.0, 2000.0))
    whole = BundleRange(0, FULL_UPPER)
    cuts = flow_or_qps_equally_divide(whole, traffic, 1010, 100 * 1024 * 1024, 0.10)
    assert cuts
    by_hash = sorted((topic_hash(t.topic), t.msg_rate) for t in traffic)
    lower = 0
    for cut in (*cuts, FULL_UPPER + 1):
        part = sum(rate for h, rate in by_hash if lower <= h < cut)
        assert part < 1010
        lower = cut


def test_pulsar_flow_or_qps_first_topic_over_the_maximum() -> None:
    names = [f"/test-namespace1/test-partition-{i}" for i in range(5)]
    ordered = sorted(names, key=topic_hash)
    traffic = [TopicTraffic(ordered[0], 2000.0, 2000.0)]
    traffic += [TopicTraffic(t, 49.5, 2000.0) for t in ordered[1:]]
    cuts = flow_or_qps_equally_divide(
        BundleRange(0, FULL_UPPER), traffic, 1010, 100 * 1024 * 1024, 0.10
    )
    h0, h1 = topic_hash(ordered[0]), topic_hash(ordered[1])
    assert cuts[0] == h0 + (h1 - h0) // 2 + 1
