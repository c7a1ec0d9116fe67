"""The key layout: every builder, its parser, validation and sort order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ballast.metadata import keys
from ballast.model import InvalidTopicName, ModelError, TopicName

NAME = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.\-]{0,20}\Z")
BROKER = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.\-:]{0,20}\Z")
TOPICS = st.builds(TopicName, NAME, NAME)


def test_the_layout_matches_the_architecture_table() -> None:
    t = "/ns/orders"
    assert keys.register("b1") == "/cluster/register/b1"
    assert keys.broker_state("b1") == "/cluster/brokers/b1/state"
    assert keys.broker_assignment("b1", t) == "/cluster/brokers/b1/ns/orders"
    assert keys.broker_assignments_prefix("b1") == "/cluster/brokers/b1/"
    assert keys.unassigned(t) == "/cluster/unassigned/ns/orders"
    assert keys.load("b1") == "/cluster/load/b1"
    assert keys.LEADER == "/cluster/leader"
    assert keys.LOAD_BALANCE == "/cluster/load_balance"
    assert keys.rebalancing_history(1_700_000_000.5, t, 7) == (
        "/cluster/rebalancing_history/001700000000500-00000000000000000007-ns:orders"
    )
    assert keys.topic_meta(t) == "/topics/ns/orders/meta"
    assert keys.subscription_cursor(t, "sub-1") == "/topics/ns/orders/subscriptions/sub-1/cursor"
    assert keys.storage_object(t, 42) == "/storage/topics/ns/orders/objects/00000000000000000042"
    assert keys.storage_objects_prefix(t) == "/storage/topics/ns/orders/objects/"
    assert keys.storage_state(t) == "/storage/topics/ns/orders/state"
    for prefix in (
        keys.REGISTER_PREFIX,
        keys.BROKERS_PREFIX,
        keys.UNASSIGNED_PREFIX,
        keys.LOAD_PREFIX,
        keys.HISTORY_PREFIX,
        keys.TOPICS_PREFIX,
        keys.STORAGE_PREFIX,
    ):
        assert prefix.startswith("/") and prefix.endswith("/")


def test_topic_name_objects_and_strings_give_the_same_keys() -> None:
    assert keys.unassigned(TopicName("ns", "t")) == keys.unassigned("/ns/t")


@pytest.mark.parametrize(
    "bad", ["", "t", "ns/t", "/ns", "/ns/t/extra", "//t", "/ns/", "/n s/t", "/ns/t*", "/-ns/t"]
)
@pytest.mark.parametrize(
    "builder",
    [
        keys.unassigned,
        keys.topic_meta,
        keys.storage_state,
        keys.storage_objects_prefix,
        lambda t: keys.broker_assignment("b1", t),
        lambda t: keys.subscription_cursor(t, "s"),
        lambda t: keys.storage_object(t, 0),
    ],
)
def test_invalid_topic_names_raise_a_clear_error(bad: str, builder: object) -> None:
    with pytest.raises(InvalidTopicName, match="invalid topic name"):
        builder(bad)  # type: ignore[operator]


@pytest.mark.parametrize("bad", ["", "a/b", "/b1", "b 1", None])
@pytest.mark.parametrize(
    "builder", [keys.register, keys.broker_state, keys.load, keys.broker_assignments_prefix]
)
def test_invalid_broker_ids_raise_a_clear_error(bad: object, builder: object) -> None:
    with pytest.raises(ModelError, match="invalid broker id"):
        builder(bad)  # type: ignore[operator]


@pytest.mark.parametrize("bad", ["", "a/b", "has space", "-x"])
def test_invalid_subscription_names_raise_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid subscription name"):
        keys.subscription_cursor("/ns/t", bad)


@pytest.mark.parametrize(
    ("ts", "topic", "revision", "message"),
    [
        (-1.0, "/ns/t", 1, "must be >= 0"),
        (float("nan"), "/ns/t", 1, "finite"),
        (1.0, "/ns/t", 0, "revision"),
        (1.0, "/ns/t", 10**20, "revision"),
        (True, "/ns/t", 1, "finite"),
        (1.0, "/ns/t:x", 1, "invalid topic"),
    ],
)
def test_invalid_history_parts_are_rejected(
    ts: float, topic: str, revision: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        keys.rebalancing_history(ts, topic, revision)


@pytest.mark.parametrize("bad", [-1, 10**20, 1.5, True])
def test_invalid_object_offsets_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="invalid object start offset"):
        keys.storage_object("/ns/t", bad)  # type: ignore[arg-type]


@given(BROKER, TOPICS)
def test_parsers_invert_the_builders(broker: str, topic: TopicName) -> None:
    assert keys.parse_register_key(keys.register(broker)) == broker
    assert keys.parse_load_key(keys.load(broker)) == broker
    assert keys.parse_broker_state_key(keys.broker_state(broker)) == broker
    assert keys.parse_assignment_key(keys.broker_assignment(broker, topic)) == (broker, topic)
    assert keys.parse_unassigned_key(keys.unassigned(topic)) == topic
    assert keys.parse_subscription_cursor_key(keys.subscription_cursor(topic, "s.1")) == (
        topic,
        "s.1",
    )
    assert keys.parse_storage_object_key(keys.storage_object(topic, 99)) == (topic, 99)


@given(st.lists(st.tuples(st.integers(0, 10**12), st.integers(1, 10**20 - 1)), min_size=2))
def test_history_keys_sort_by_time_then_revision(entries: list[tuple[int, int]]) -> None:
    # Millisecond timestamps: the key keeps millisecond precision exactly.
    t = TopicName("ns", "orders")
    by_key = sorted(entries, key=lambda e: keys.rebalancing_history(e[0] / 1000, t, e[1]))
    assert by_key == sorted(entries)
    for ms, revision in entries:
        key = keys.rebalancing_history(ms / 1000, t, revision)
        assert keys.parse_history_key(key) == (ms / 1000, revision, t)


def test_history_keys_of_the_earlier_scheme_are_still_read() -> None:
    assert keys.parse_history_key("/cluster/rebalancing_history/000000000100000-000003") == (
        100.0,
        3,
        None,
    )


@given(st.lists(st.integers(0, 10**20 - 1), min_size=2, unique=True))
def test_object_keys_sort_by_start_offset(starts: list[int]) -> None:
    by_key = sorted(starts, key=lambda s: keys.storage_object("/ns/t", s))
    assert by_key == sorted(starts)


@pytest.mark.parametrize(
    ("parser", "key"),
    [
        (keys.parse_register_key, "/cluster/load/b1"),
        (keys.parse_register_key, "/cluster/register/"),
        (keys.parse_register_key, "/cluster/register/b1/extra"),
        (keys.parse_assignment_key, "/cluster/brokers/b1/state"),
        (keys.parse_assignment_key, "/cluster/brokers/b1/ns/t/x"),
        (keys.parse_assignment_key, "/cluster/brokers/b1/n s/t"),
        (keys.parse_broker_state_key, "/cluster/brokers/b1/mode"),
        (keys.parse_unassigned_key, "/cluster/unassigned/ns"),
        (keys.parse_unassigned_key, "/cluster/unassigned/ns//t"),
        (keys.parse_load_key, "/cluster/load/b/1"),
        (keys.parse_history_key, "/cluster/rebalancing_history/123-1"),
        (keys.parse_history_key, "/cluster/rebalancing_history/x"),
        (keys.parse_history_key, "/cluster/rebalancing_history/000000000000001-1-ns:t"),
        (keys.parse_history_key, f"/cluster/rebalancing_history/000000000000001-{1:020}-ns:t:x"),
        (keys.parse_history_key, f"/cluster/rebalancing_history/000000000000001-{1:020}-n s:t"),
        (keys.parse_storage_object_key, "/storage/topics/ns/t/objects/42"),
        (keys.parse_storage_object_key, "/storage/topics/ns/t/state"),
        (keys.parse_subscription_cursor_key, "/topics/ns/t/meta"),
        (keys.parse_subscription_cursor_key, "/topics/ns/t/subscriptions/s/offset"),
    ],
)
def test_parsers_reject_foreign_keys_naming_them(parser: object, key: str) -> None:
    with pytest.raises(keys.KeyLayoutError) as info:
        parser(key)  # type: ignore[operator]
    assert repr(key) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_assignment_prefix_covers_state_but_parser_tells_them_apart() -> None:
    prefix = keys.broker_assignments_prefix("b1")
    state, assignment = keys.broker_state("b1"), keys.broker_assignment("b1", "/ns/t")
    assert state.startswith(prefix) and assignment.startswith(prefix)
    assert keys.parse_broker_state_key(state) == "b1"
    with pytest.raises(keys.KeyLayoutError):
        keys.parse_assignment_key(state)
    with pytest.raises(keys.KeyLayoutError):
        keys.parse_broker_state_key(assignment)


def test_ownership_record_and_namespace_keys() -> None:
    assert keys.topic_owner("/default/t1") == "/cluster/owners/default/t1"
    assert str(keys.parse_topic_owner_key("/cluster/owners/default/t1")) == "/default/t1"
    with pytest.raises(keys.KeyLayoutError):
        keys.parse_topic_owner_key("/cluster/owners/default")
    assert keys.namespace_topics_prefix("demo") == "/topics/demo/"
    with pytest.raises(ValueError, match="invalid namespace"):
        keys.namespace_topics_prefix("a/b")
    assert str(keys.parse_topic_meta_key("/topics/ns/t/meta")) == "/ns/t"
    with pytest.raises(keys.KeyLayoutError):
        keys.parse_topic_meta_key("/topics/ns/t/subscriptions")
    assert keys.is_broker_state_key("/cluster/brokers/b1/state")
    assert not keys.is_broker_state_key("/cluster/brokers/b1/ns/state")


def test_reachability_keys_round_trip() -> None:
    from ballast.metadata import keys as k

    assert k.parse_reachability_key(k.gateway_registration("gw-a")) == ("gateway", "gw-a", None)
    assert k.parse_reachability_key(k.unreachable_report("gw-a", "b2")) == ("report", "gw-a", "b2")
    assert k.parse_reachability_key(k.reachability_eviction("b2")) == ("evicted", None, "b2")
    with pytest.raises(k.KeyLayoutError):
        k.parse_reachability_key("/reachability/reports/gw-a")
