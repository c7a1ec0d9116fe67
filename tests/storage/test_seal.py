"""Where offsets continue on open: a pure decision over the evidence."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ballast.storage import SealedState, StartSource, choose_start
from ballast.storage.seal import StateError


def sealed(last: int, broker: str = "a") -> SealedState:
    return SealedState(True, last, broker, 1.0)


def claimed(last: int, broker: str = "b") -> SealedState:
    return SealedState(False, last, broker, 2.0)


def test_sealed_state_continues_after_the_last_committed_offset() -> None:
    decision = choose_start(sealed(21), catalog_end=21, local_end=None)
    assert (decision.next_offset, decision.source, decision.discard_local) == (
        22,
        StartSource.SEALED,
        False,
    )
    assert "sealed by a at offset 21" in decision.reason


def test_sealed_state_discards_this_brokers_old_segments() -> None:
    decision = choose_start(sealed(21), catalog_end=21, local_end=15)
    assert decision.next_offset == 22 and decision.discard_local


def test_objects_beyond_the_seal_are_never_reused() -> None:
    decision = choose_start(sealed(21), catalog_end=30, local_end=None)
    assert decision.next_offset == 31 and decision.source is StartSource.SEALED


def test_crash_continues_after_the_catalog() -> None:
    decision = choose_start(claimed(21), catalog_end=24, local_end=None)
    assert (decision.next_offset, decision.source) == (25, StartSource.CATALOG)


def test_crash_on_the_same_broker_continues_after_its_wal() -> None:
    decision = choose_start(claimed(-1), catalog_end=9, local_end=29)
    assert (decision.next_offset, decision.source, decision.discard_local) == (
        30,
        StartSource.LOCAL_WAL,
        False,
    )


def test_stale_local_wal_behind_the_catalog_is_discarded() -> None:
    decision = choose_start(claimed(0), catalog_end=40, local_end=12)
    assert (decision.next_offset, decision.source, decision.discard_local) == (
        41,
        StartSource.CATALOG,
        True,
    )


def test_tie_prefers_the_local_wal_and_keeps_it() -> None:
    decision = choose_start(None, catalog_end=9, local_end=9)
    assert decision.source is StartSource.LOCAL_WAL and not decision.discard_local


def test_owner_record_is_a_lower_bound() -> None:
    decision = choose_start(claimed(21), catalog_end=None, local_end=None)
    assert (decision.next_offset, decision.source) == (22, StartSource.OWNER_RECORD)


def test_brand_new_topic_starts_at_zero() -> None:
    decision = choose_start(None, None, None)
    assert (decision.next_offset, decision.source) == (0, StartSource.EMPTY)


@given(
    state=st.none()
    | st.builds(SealedState, st.booleans(), st.integers(-1, 100), st.just("b1"), st.just(0.0)),
    catalog_end=st.none() | st.integers(0, 100),
    local_end=st.none() | st.integers(0, 100),
)
def test_never_an_offset_any_evidence_shows_as_used(
    state: SealedState | None, catalog_end: int | None, local_end: int | None
) -> None:
    decision = choose_start(state, catalog_end, local_end)
    used = [
        e for e in (catalog_end, state.last_committed_offset if state else None) if e is not None
    ]
    if state is None or not state.sealed:
        used += [local_end] if local_end is not None else []
    assert all(decision.next_offset > e for e in used)
    # Kept local segments must continue exactly at the next offset.
    if local_end is not None and not decision.discard_local:
        assert decision.next_offset == local_end + 1


def test_state_round_trips_and_rejects_bad_fields() -> None:
    state = sealed(21)
    assert SealedState.from_dict(state.to_dict()) == state
    with pytest.raises(StateError, match="sealed"):
        SealedState.from_dict({"last_committed_offset": 1, "broker_id": "a"})
    with pytest.raises(StateError, match="last_committed_offset"):
        SealedState.from_dict({"sealed": True, "last_committed_offset": "x", "broker_id": "a"})
    with pytest.raises(StateError, match="broker_id"):
        SealedState.from_dict({"sealed": True, "last_committed_offset": 1, "broker_id": "a/b"})
    with pytest.raises(StateError, match="JSON object"):
        SealedState.from_dict([1])
