from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ballast.model import (
    Assignment,
    BrokerMode,
    BrokerState,
    InvalidTopicName,
    LoadReport,
    MarkerReason,
    ModelError,
    Move,
    TopicLoad,
    TopicName,
    UnassignedMarker,
)

NAME = st.from_regex(r"[a-z0-9][a-z0-9_.\-]{0,20}", fullmatch=True)
RATE = st.floats(0, 1e9, allow_nan=False)


@st.composite
def reports(draw: st.DrawFn) -> LoadReport:
    topics = tuple(
        TopicLoad(
            f"/{draw(NAME)}/{draw(NAME)}",
            draw(RATE),
            draw(RATE),
            draw(st.integers(0, 99)),
            draw(st.integers(0, 99)),
            draw(st.integers(0, 9)),
            draw(st.integers(0, 10**9)),
        )
        for _ in range(draw(st.integers(0, 5)))
    )
    return LoadReport(
        draw(NAME),
        draw(st.floats(0, 2e9)),
        draw(st.floats(0, 100)),
        draw(st.floats(0, 100)),
        draw(RATE),
        draw(RATE),
        topics,
    )


@given(reports())
def test_load_report_round_trip(report: LoadReport) -> None:
    again = LoadReport.from_json(report.to_json())
    assert again == report
    assert again.total_backlog == sum(t.backlog for t in report.topics)


@given(reports())
def test_a_sparse_load_report_round_trips_and_leaves_out_only_zeros(report: LoadReport) -> None:
    sparse = report.to_dict(sparse=True)
    assert LoadReport.from_dict(json.loads(json.dumps(sparse))) == report
    for topic, full in zip(sparse["topics"], report.to_dict()["topics"], strict=True):
        assert topic == {k: v for k, v in full.items() if v or k == "topic"}


def test_other_round_trips() -> None:
    marker = UnassignedMarker(MarkerReason.REBALANCE, "a", "b", 12.5, ready=False)
    assert UnassignedMarker.from_dict(json.loads(json.dumps(marker.to_dict()))) == marker
    move = Move("/ns/t", "a", "b", "LoadImbalance", 15.3, 99.0)
    assert Move.from_dict(move.to_dict()) == move
    state = BrokerState(BrokerMode.DRAINING, "maintenance")
    assert BrokerState.from_dict(state.to_dict()) == state
    assert Assignment.from_dict(Assignment(3.0, 2).to_dict()) == Assignment(3.0, 2)


def test_empty_marker_means_new_topic() -> None:
    assert UnassignedMarker.from_dict(None) == UnassignedMarker()
    assert UnassignedMarker.from_dict({}).reason is MarkerReason.NEW


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("default/t", "expected the form /namespace/topic"),
        ("/default", "expected the form /namespace/topic"),
        ("/a/b/c", "expected the form /namespace/topic"),
        ("/de fault/t", "namespace part 'de fault'"),
        ("/default/", "topic part ''"),
        ("/ns/-x", "topic part '-x'"),
    ],
)
def test_invalid_topic_names_are_explained(name: str, fragment: str) -> None:
    with pytest.raises(InvalidTopicName, match=fragment):
        TopicName.parse(name)


def test_topic_name_parts() -> None:
    t = TopicName.parse("/default/orders-1")
    assert (t.namespace, t.name, str(t)) == ("default", "orders-1", "/default/orders-1")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"broker_id": "b1"', "malformed JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"timestamp": 1}', "load_report.broker_id: missing field"),
        ('{"broker_id": "b1", "timestamp": "x"}', "load_report.timestamp: expected a number"),
        ('{"broker_id": "b1", "timestamp": 1, "cpu_percent": 140}', "cpu_percent: must be within"),
        (
            '{"broker_id": "b1", "timestamp": 1, "topics": [{"topic": "/a/b", "msg_rate": -1}]}',
            r"load_report.topics\[0\].msg_rate: must be a non-negative",
        ),
        (
            '{"broker_id": "b1", "timestamp": 1, "topics": [{"topic": "bad"}]}',
            r"load_report.topics\[0\].topic",
        ),
        ('{"broker_id": "a/b", "timestamp": 1}', "load_report.broker_id: invalid broker id"),
    ],
)
def test_malformed_reports_name_the_field(text: str, fragment: str) -> None:
    with pytest.raises(ModelError, match=fragment):
        LoadReport.from_json(text)


def test_marker_with_unknown_reason_lists_allowed_values() -> None:
    with pytest.raises(ModelError, match=r"marker\.reason: 'moved' is not one of: new, unload"):
        UnassignedMarker.from_dict({"reason": "moved"})
