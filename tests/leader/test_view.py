"""The cluster view: stale events change nothing, bad records leave it consistent."""

from __future__ import annotations

import pytest

from ballast.leader.view import BadRecord, ClusterView, classify
from ballast.metadata import keys
from ballast.metadata.records import RecordKind
from ballast.model import Assignment, MarkerReason, UnassignedMarker

REG = {"broker_url": "x:1"}


def test_classify_every_key_kind() -> None:
    assert classify(keys.register("b1")) == (RecordKind.REGISTRATION, "b1", None)
    assert classify(keys.broker_state("b1")) == (RecordKind.STATE, "b1", None)
    assert classify(keys.broker_assignment("b1", "/ns/t")) == (RecordKind.ASSIGNMENT, "b1", "/ns/t")
    assert classify(keys.unassigned("/ns/t")) == (RecordKind.MARKER, None, "/ns/t")
    assert classify(keys.load("b1")) == (RecordKind.LOAD, "b1", None)
    assert classify(keys.LEADER)[0] is RecordKind.LEADER
    assert classify(keys.rebalancing_history(1.0, "/ns/t", 1))[0] is RecordKind.HISTORY
    assert classify(keys.topic_meta("/ns/t")) == (RecordKind.TOPIC, None, "/ns/t")
    assert classify(keys.subscription_cursor("/ns/t", "s"))[0] is RecordKind.OTHER
    with pytest.raises(BadRecord):
        classify("/cluster/unassigned/only-one-part")


def test_stale_events_are_ignored() -> None:
    view = ClusterView()
    key = keys.broker_assignment("b1", "/ns/t")
    assert view.apply("put", key, Assignment(1.0).to_dict(), 10) is not None
    assert view.apply("delete", key, None, 12) is not None
    # The echo of an older put arrives late: nothing changes.
    assert view.apply("put", key, Assignment(1.0).to_dict(), 11) is None
    assert view.owner("/ns/t") is None


def test_bad_value_is_rejected_and_forgotten() -> None:
    view = ClusterView()
    marker_key = keys.unassigned("/ns/t")
    view.apply("put", marker_key, UnassignedMarker().to_dict(), 5)
    with pytest.raises(BadRecord) as exc:
        view.apply("put", marker_key, {"reason": "teleport"}, 6)
    assert exc.value.kind == "marker"
    assert "/ns/t" not in view.markers  # nothing acts on the stale marker


def test_snapshot_counts_topics_in_flight_on_their_target() -> None:
    view = ClusterView()
    for b in ("b1", "b2"):
        view.apply("put", keys.register(b), REG, 1)
    view.apply("put", keys.broker_assignment("b1", "/ns/a"), Assignment(1.0).to_dict(), 2)
    moving = UnassignedMarker(MarkerReason.REBALANCE, "b1", "b2", 3.0, ready=False)
    view.apply("put", keys.unassigned("/ns/b"), moving.to_dict(), 3)
    assert view.snapshot().assignments == {"b1": ("/ns/a",), "b2": ("/ns/b",)}
    assert view.snapshot(pending=False).assignments == {"b1": ("/ns/a",), "b2": ()}
    assert view.snapshot(exclude={"/ns/b"}).assignments["b2"] == ()


def test_load_report_must_match_its_key() -> None:
    view = ClusterView()
    with pytest.raises(BadRecord, match="does not match"):
        view.apply("put", keys.load("b1"), {"broker_id": "b2", "timestamp": 1.0}, 4)
