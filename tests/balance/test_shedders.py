"""Pulsar's shedders: the reference's anchors and the scenarios of Pulsar's unit tests
(ThresholdShedderTest, OverloadShedderTest, UniformLoadShedderTest), with their numbers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.balance.pulsar import shedders, strategies
from ballast.balance.pulsar.shedders import (
    SheddingInput,
    max_usage_with_weight,
    overload_shedder,
    threshold_shedder,
    uniform_shedder,
)
from ballast.config import PulsarConfig

MB = 1024 * 1024
DEFAULT = PulsarConfig()


def make_input(
    brokers: dict[str, dict[str, float]],
    units: Sequence[tuple[str, str, float, float]],
    blocked: Sequence[str] = (),
) -> SheddingInput:
    """brokers: {id: {cpu, mem, direct, bw_in, bw_out (percent), rate, thr}};
    units: (name, broker, msg_rate, throughput)."""
    ids = tuple(sorted(brokers))
    res = np.array(
        [[brokers[b].get(k, 0.0) for k in ("cpu", "mem", "direct", "bw_in", "bw_out")] for b in ids]
    ).reshape(len(ids), 5)
    names = tuple(u[0] for u in units)
    return SheddingInput(
        brokers=ids,
        resources=res,
        msg_rate=np.array([brokers[b].get("rate", 0.0) for b in ids]),
        throughput=np.array([brokers[b].get("thr", 0.0) for b in ids]),
        unit_names=names,
        unit_broker=np.array([ids.index(u[1]) for u in units], dtype=np.int64),
        unit_msg_rate=np.array([u[2] for u in units], dtype=float),
        unit_throughput=np.array([u[3] for u in units], dtype=float),
        blocked={names.index(n): "recently unloaded (grace 30m)" for n in blocked},
    )


def chosen(result: object, broker: str | None = None) -> list[str]:
    return [u.unit for u in result.unloads if broker is None or u.broker == broker]  # type: ignore[attr-defined]


def ten_bundles(blocked: Sequence[str] = (), with_broker2: bool = True) -> SheddingInput:
    """Pulsar's testBrokerWithMultipleBundles: broker-1 at 99.9 % bandwidth owns bundle-i of
    2·i MB/s (i = 1..10, 110 MB/s in all); broker2 owns copies and reports nothing."""
    brokers = {"broker-1": {"bw_in": 99.9, "bw_out": 99.9, "thr": 110 * MB}}
    units = [(f"bundle-{i}", "broker-1", 0.0, 2.0 * i * MB) for i in range(1, 11)]
    if with_broker2:
        brokers["broker2"] = {}
        units += [(f"broker2-bundle-{10 + i}", "broker2", 0.0, 2.0 * i * MB) for i in range(1, 11)]
    return make_input(brokers, units, blocked)


# --- ThresholdShedder -------------------------------------------------------------------


def test_threshold_no_brokers() -> None:
    assert threshold_shedder(make_input({}, []), DEFAULT).unloads == ()


def test_threshold_broker_with_no_bundles() -> None:
    inp = make_input({"broker-1": {"bw_in": 99.9, "bw_out": 99.9}}, [])
    assert threshold_shedder(inp, DEFAULT).unloads == ()


def test_threshold_not_reached_and_single_bundle() -> None:
    for usage in (50.0, 99.9):
        inp = make_input(
            {"broker-1": {"bw_in": usage, "bw_out": usage, "thr": 2000}},
            [("bundle-1", "broker-1", 0.0, 2000.0)],
        )
        assert threshold_shedder(inp, DEFAULT).unloads == ()


def test_threshold_multiple_bundles_heaviest_first_until_the_need_is_met() -> None:
    result = threshold_shedder(ten_bundles(), DEFAULT)
    # avg 49.95 %, broker-1 at 99.9 %: offload 99.9 − 49.95 − 10 + 5 = 44.95 % of 110 MB/s
    # = 49.4 MB/s → bundles of 20, 18, 16 MB/s.
    assert chosen(result, "broker-1") == ["bundle-10", "bundle-9", "bundle-8"]
    assert chosen(result) == chosen(result, "broker-1")
    assert "avg usage 50.0%" in result.summary
    (verdict,) = result.verdicts
    assert verdict.rule == "shed"
    assert "offload 45.0% of 110.0 MB/s = 49.4 MB/s" in verdict.detail
    assert "7 lighter unit(s) not needed" in verdict.detail


def test_threshold_filters_recently_unloaded() -> None:
    result = threshold_shedder(ten_bundles(blocked=["bundle-10", "bundle-9"]), DEFAULT)
    assert chosen(result) == ["bundle-8", "bundle-7", "bundle-6", "bundle-5"]
    assert "excluded 2 recently unloaded (grace 30m)" in result.verdicts[0].detail


def eleven(loads: Sequence[float], bundles: Sequence[int], thr: float) -> SheddingInput:
    brokers, units = {}, []
    for i, (load, n) in enumerate(zip(loads, bundles, strict=True)):
        b = f"broker-{i:02d}"
        per = 0.0 if load == 0 else thr
        brokers[b] = {"bw_in": load, "bw_out": load, "thr": 2 * per}
        units += [(f"{b}-bundle-{j}", b, 0.0, 2 * per) for j in range(n)]
    return make_input(brokers, units)


def test_anchor_eleven_brokers_one_idle_needs_lower_boundary_shedding() -> None:
    # 10 brokers at 80 %, one at 0 %: avg 72.73 %, trigger 82.73 %, 80 % stays.
    inp = eleven([80.0] * 10 + [0.0], [10] * 11, 100 * MB)
    off = threshold_shedder(inp, DEFAULT)
    assert off.unloads == ()
    assert "avg usage 72.7%" in off.summary and "shed above 82.7%" in off.summary
    assert "lower_boundary_shedding_enabled is false" in off.summary
    on = threshold_shedder(inp, PulsarConfig(lower_boundary_shedding_enabled=True))
    # the most used broker (ties: lowest id) offloads 10 % × 50 % of 200 MB/s = 10 MB/s
    assert chosen(on) == ["broker-00-bundle-0"]
    assert on.verdicts[-1].rule == "lower-boundary"
    assert "= 10.0 MB/s" in on.verdicts[-1].detail


def test_anchor_all_eleven_at_80_sheds_nothing_either_way() -> None:
    inp = eleven([80.0] * 11, [10] * 11, 80 * MB)
    assert threshold_shedder(inp, DEFAULT).unloads == ()
    on = threshold_shedder(inp, PulsarConfig(lower_boundary_shedding_enabled=True))
    assert on.unloads == ()
    assert "no broker is below 70.0%" in on.verdicts[-1].detail


def test_lower_boundary_skips_brokers_with_one_bundle() -> None:
    # Pulsar's testLowerBoundarySheddingBrokerWithOneBundle: only broker 3 has 10 bundles.
    inp = eleven([80.0] * 5 + [0.0] + [80.0] * 5, [1, 1, 1, 10, 1, 1, 1, 1, 1, 1, 1], 100 * MB)
    assert threshold_shedder(inp, DEFAULT).unloads == ()
    on = threshold_shedder(inp, PulsarConfig(lower_boundary_shedding_enabled=True))
    assert [u.broker for u in on.unloads] == ["broker-03"]


def test_threshold_only_bundle_and_min_throughput_are_explained() -> None:
    inp = make_input(
        {
            "a": {"cpu": 95.0, "thr": 100 * MB},
            "b": {"cpu": 95.0, "thr": 1 * MB},
            "c": {"cpu": 5.0},
            "d": {"cpu": 5.0},
        },
        [("a-1", "a", 0.0, 100.0 * MB), ("b-1", "b", 0.0, 0.5 * MB), ("b-2", "b", 0.0, 0.5 * MB)],
    )
    result = threshold_shedder(inp, DEFAULT)
    assert result.unloads == ()
    rules = {v.broker: v.rule for v in result.verdicts}
    assert rules == {"a": "only-bundle", "b": "min-throughput"}


def test_threshold_smooths_usage_with_the_previous_value() -> None:
    inp = make_input({"a": {"cpu": 10.0}, "b": {"cpu": 30.0}}, [])
    first = threshold_shedder(inp, DEFAULT)
    assert first.usage == {"a": 0.1, "b": 0.3}  # seeded with the first sample
    again = threshold_shedder(inp, DEFAULT, previous={"a": 0.5, "b": 0.3})
    assert again.usage["a"] == 0.9 * 0.5 + 0.1 * 0.1


def test_weighted_usage_is_not_clamped_at_100_percent() -> None:
    # apache/pulsar#18598 (reverting #16937 by #18645): getMaxResourceUsageWithWeight takes the
    # weighted signals as they are, above 100 % too.
    res = np.array([[50.0, 20.0, 0.0, 150.0, 10.0]])
    assert max_usage_with_weight(res, DEFAULT).tolist() == [1.5]
    half_cpu = PulsarConfig(cpu_resource_weight=0.5)
    assert max_usage_with_weight(np.array([[80.0, 20.0, 0, 0, 0]]), half_cpu).tolist() == [0.4]


def test_threshold_broker_threshold_sheds_a_broker_above_100_percent() -> None:
    # ThresholdShedderTest#testBrokerThreshold, the test apache/pulsar#18598 restored: a
    # broker whose weighted usage exceeds 100 % counts with it. a at 140 % against b at 50 %:
    # average 95 %, trigger 105 %; a offloads 140 - 95 - 10 + 5 = 40 % of its 60 MB/s.
    # (With the clamp, a counted at 20 % - its bandwidth - and nothing was shed.)
    inp = make_input(
        {"a": {"cpu": 140.0, "bw_in": 20.0, "thr": 60 * MB}, "b": {"cpu": 50.0, "thr": 10 * MB}},
        [("a1", "a", 0.0, 30 * MB), ("a2", "a", 0.0, 20 * MB), ("a3", "a", 0.0, 10 * MB)],
    )
    result = threshold_shedder(inp, DEFAULT)
    assert result.usage == {"a": 1.4, "b": 0.5}
    assert chosen(result) == ["a1"]  # 30 MB/s ≥ 40 % of 60 MB/s = 24 MB/s
    assert "usage 140.0% ≥ 105.0%; offload 40.0%" in result.verdicts[0].detail


def test_the_weighted_max_is_one_function_for_shedders_strategies_and_spark() -> None:
    # One definition (`resource_usage_score`, percent; `max_usage_with_weight` is it / 100):
    # the two helpers used to disagree above 100 %.
    assert strategies.resource_usage_score is shedders.resource_usage_score
    cfg = PulsarConfig(memory_resource_weight=0.5)
    res = np.array([[70.0, 180.0, 0.0, 120.0, 30.0], [10.0, 5.0, 0.0, 0.0, 0.0]])
    direct = np.asarray(shedders.resource_usage_score(*res.T, cfg)) / 100
    assert max_usage_with_weight(res, cfg).tolist() == direct.tolist() == [1.2, 0.1]


# --- OverloadShedder --------------------------------------------------------------------


def test_anchor_overload_at_95_percent_cpu_offloads_15_percent() -> None:
    inp = make_input(
        {"hot": {"cpu": 95.0, "thr": 100 * MB}, "cold": {"cpu": 10.0}},
        [(f"u{i}", "hot", 0.0, 10.0 * MB) for i in range(10)],
    )
    result = overload_shedder(inp, DEFAULT)
    (v,) = result.verdicts
    assert "offload 95.0% − 85.0% + 5% = 15.0% of 100.0 MB/s = 15.0 MB/s" in v.detail
    assert chosen(result) == ["u0", "u1"]  # 10 MB/s is not enough, 20 MB/s is


def test_overload_ports() -> None:
    assert overload_shedder(make_input({}, []), DEFAULT).unloads == ()
    no_bundles = make_input({"broker-1": {"bw_in": 99.9, "bw_out": 99.9}}, [])
    assert overload_shedder(no_bundles, DEFAULT).unloads == ()
    for usage in (50.0, 99.9):
        single = make_input(
            {"broker-1": {"bw_in": usage, "bw_out": usage, "thr": 2000}},
            [("bundle-1", "broker-1", 0.0, 2000.0)],
        )
        assert overload_shedder(single, DEFAULT).unloads == ()
    # 99.9 − 85 + 5 = 19.9 % of 110 MB/s = 21.9 MB/s → 20 + 18 MB/s
    assert chosen(overload_shedder(ten_bundles(), DEFAULT)) == ["bundle-10", "bundle-9"]
    recent = ten_bundles(blocked=["bundle-10", "bundle-9"], with_broker2=False)
    assert chosen(overload_shedder(recent, DEFAULT)) == ["bundle-8", "bundle-7"]


def test_overload_ignores_heap_memory() -> None:
    inp = make_input({"a": {"mem": 99.0, "thr": MB}}, [("x", "a", 0, MB), ("y", "a", 0, MB)])
    result = overload_shedder(inp, DEFAULT)
    assert result.unloads == ()
    assert "highest: a at 0.0%" in result.summary


# --- UniformLoadShedder -----------------------------------------------------------------


def test_uniform_multiple_bundles() -> None:
    brokers = {"broker-1": {"thr": 110 * MB}, "broker2": {}}
    units = [(f"bundle-{i}", "broker-1", 0.0, 2.0 * i * MB) for i in range(1, 11)]
    result = uniform_shedder(make_input(brokers, units), DEFAULT)
    # throughput ratio 110 MB/s ÷ 1 (0 → 1) > 4: move 20 % of the gap (22 MB/s - 0.2 B/s);
    # bundle-10 (20 MB/s) fits, and bundle-1 (2 MB/s) is 0.2 B/s over what is left, within
    # Pulsar's 1000 bytes/s slack.
    assert chosen(result) == ["bundle-10", "bundle-1"]
    assert "ratio" in result.summary


def test_uniform_lets_a_bundle_through_within_the_need_plus_the_1000_slack() -> None:
    # UniformLoadShedder: `bundleMsgRate <= msgRateRequiredFromUnloadedBundles + 1000 /* delta */`.
    # a at 10 000 msg/s, b at 1 000: need 20 % of 9 000 = 1 800 msg/s. Heaviest first: 1 900
    # fits 1 800 + 1 000 (need now -100), 900 fits -100 + 1 000, 200 does not (-1 000 + 1 000
    # < 200). Without the slack only the 900 went: Ballast unloaded fewer bundles than Pulsar.
    inp = make_input(
        {"a": {"rate": 10_000.0}, "b": {"rate": 1_000.0}},
        [("a1", "a", 1_900.0, 0.0), ("a2", "a", 900.0, 0.0), ("a3", "a", 200.0, 0.0)],
    )
    result = uniform_shedder(inp, DEFAULT)
    assert chosen(result) == ["a1", "a2"]
    assert "1 larger than what was still needed + 1000" in result.verdicts[0].detail


def test_uniform_max_unload_bundle_num_per_shedding() -> None:
    brokers = {"broker-1": {"thr": 40 * MB}, "broker2": {}}
    units = [(f"bundle-{i}", "broker-1", 0.0, 2.0 * MB) for i in range(1, 21)]
    inp = make_input(brokers, units)
    # 20 % of the 40 MB/s gap (less 0.2 B/s): the fourth 2 MB/s bundle fits with the slack.
    assert len(uniform_shedder(inp, DEFAULT).unloads) == 4
    assert (
        len(uniform_shedder(inp, PulsarConfig(max_unload_bundle_num_per_shedding=2)).unloads) == 2
    )


def five_brokers() -> SheddingInput:
    rates = [50000, 60000, 70000, 10000, 20000]
    thrs = [50, 60, 70, 80, 10]
    brokers, units = {}, []
    for i, (r, t) in enumerate(zip(rates, thrs, strict=True)):
        b = f"broker{i}"
        brokers[b] = {"rate": float(r), "thr": t * MB}
        units += [(f"broker-{i}-bundle-{j}", b, r / 5, t * MB / 5) for j in range(5)]
    return make_input(brokers, units)


def test_uniform_overload_broker_select() -> None:
    base = {"max_unload_bundle_num_per_shedding": 1, "max_unload_percentage": 0.5}
    inp = five_brokers()
    rate_only = PulsarConfig(
        **base,
        msg_rate_difference_shedder_threshold=50,
        msg_throughput_multiplier_difference_shedder_threshold=0,
    )
    assert [u.broker for u in uniform_shedder(inp, rate_only).unloads] == ["broker2"]
    thr_only = PulsarConfig(
        **base,
        msg_rate_difference_shedder_threshold=0,
        msg_throughput_multiplier_difference_shedder_threshold=2,
    )
    assert [u.broker for u in uniform_shedder(inp, thr_only).unloads] == ["broker3"]
    both = PulsarConfig(
        **base,
        msg_rate_difference_shedder_threshold=50,
        msg_throughput_multiplier_difference_shedder_threshold=2,
    )
    assert [u.broker for u in uniform_shedder(inp, both).unloads] == ["broker2"]


def test_uniform_filters_out_idle_bundles() -> None:
    brokers = {
        "broker0": {"rate": 10_000.0, "thr": 10 * MB},
        "broker1": {"rate": 100_000.0, "thr": 100 * MB},
    }
    units = [("broker-0-bundle-0", "broker0", 10_000.0, 10 * MB)]
    for i, (r, t) in enumerate([(60_000, 60), (20_000, 20), (20_000, 20), (0, 0), (0, 0)]):
        units.append((f"broker-1-bundle-{i}", "broker1", float(r), t * MB))
    inp = make_input(brokers, units)
    base = {"max_unload_bundle_num_per_shedding": 5, "max_unload_percentage": 0.5}
    for rate, mult in ((50, 0), (0, 2)):
        cfg = PulsarConfig(
            **base,
            msg_rate_difference_shedder_threshold=rate,
            msg_throughput_multiplier_difference_shedder_threshold=mult,
        )
        result = uniform_shedder(inp, cfg)
        assert sorted(chosen(result)) == ["broker-1-bundle-1", "broker-1-bundle-2"]
        assert "1 larger than what was still needed + 1000; 2 idle" in result.verdicts[0].detail


def test_uniform_minimum_unload_made_small_clusters_stuck() -> None:
    # Pulsar issues 21905/21299: a 3× gap of 300 vs 100 msg/s never moves (20 % of 200 < 1000).
    inp = make_input(
        {"a": {"rate": 300.0, "thr": 3000.0}, "b": {"rate": 100.0, "thr": 1000.0}},
        [("a1", "a", 150.0, 1500.0), ("a2", "a", 150.0, 1500.0), ("b1", "b", 100.0, 1000.0)],
    )
    result = uniform_shedder(inp, DEFAULT)
    assert result.unloads == ()
    assert result.verdicts[0].rule == "min-unload"
    assert "40 msg/s < minimum 1000 msg/s" in result.verdicts[0].detail


@settings(max_examples=80, deadline=None)
@given(
    loads=st.lists(
        st.tuples(st.floats(0, 100), st.lists(st.floats(0, 50), max_size=6)), min_size=1, max_size=6
    ),
    blocked_every=st.integers(2, 5),
)
def test_shedders_respect_blocked_and_only_units(
    loads: list[tuple[float, list[float]]], blocked_every: int
) -> None:
    brokers, units = {}, []
    for i, (cpu, rates) in enumerate(loads):
        b = f"b{i}"
        brokers[b] = {"cpu": cpu, "rate": 100.0 * sum(rates), "thr": sum(rates) * MB}
        units += [(f"{b}-u{j}", b, 100.0 * r, r * MB) for j, r in enumerate(rates)]
    blocked = [u[0] for k, u in enumerate(units) if k % blocked_every == 0]
    inp = make_input(brokers, units, blocked)
    counts = {b: sum(1 for u in units if u[1] == b) for b in brokers}
    for result in (
        threshold_shedder(inp, PulsarConfig(lower_boundary_shedding_enabled=True)),
        overload_shedder(inp, DEFAULT),
        uniform_shedder(inp, DEFAULT),
    ):
        names = [u.unit for u in result.unloads]
        assert len(names) == len(set(names))
        for u in result.unloads:
            assert u.unit not in blocked
            assert counts[u.broker] > 1
