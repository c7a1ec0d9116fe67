"""Where offsets continue on open: a pure decision over the evidence."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ballast.storage import SealedState, StartSource, choose_start
from ballast.storage.seal import StateError, gap_end_after, merge_gaps


def sealed(last: int, broker: str = "a") -> SealedState:
    return SealedState(True, last, broker, 1.0)


def claimed(last: int, broker: str = "b") -> SealedState:
    return SealedState(False, last, broker, 2.0)


def reserved(
    last: int, through: int, broker: str = "b", gaps: tuple[tuple[int, int], ...] = ()
) -> SealedState:
    return SealedState(False, last, broker, 2.0, reserved_through=through, gaps=gaps)


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


def test_crash_with_disk_loss_continues_after_the_reservation() -> None:
    # The owner reserved 0..9999, acknowledged up to 49, uploaded up to 19, lost its disk.
    decision = choose_start(reserved(-1, 9999), catalog_end=19, local_end=None)
    assert (decision.next_offset, decision.source, decision.gap) == (
        10000,
        StartSource.RESERVATION,
        (20, 9999),
    )
    assert "reservation=9999" in decision.reason and "20..9999" in decision.reason


def test_crash_on_the_same_broker_keeps_its_wal_and_skips_the_rest_of_the_reservation() -> None:
    decision = choose_start(reserved(-1, 9999), catalog_end=19, local_end=49)
    assert (decision.next_offset, decision.source, decision.discard_local, decision.gap) == (
        10000,
        StartSource.RESERVATION,
        False,
        (50, 9999),
    )


def test_a_released_reservation_continues_without_a_gap() -> None:
    decision = choose_start(reserved(21, 30), catalog_end=21, local_end=30)
    assert (decision.next_offset, decision.source, decision.gap) == (
        31,
        StartSource.LOCAL_WAL,
        None,
    )
    # Nothing used beyond the catalog: the catalog is reported, not the reservation.
    decision = choose_start(reserved(21, 21), catalog_end=21, local_end=None)
    assert (decision.next_offset, decision.source, decision.gap) == (22, StartSource.CATALOG, None)


def test_local_segments_inside_a_recorded_gap_are_discarded() -> None:
    # This broker's un-uploaded 20..30 were skipped by the next owner: never resurrect them.
    state = reserved(9999, 10010, gaps=((20, 9999),))
    decision = choose_start(state, catalog_end=19, local_end=30)
    assert decision.discard_local and decision.next_offset == 10011
    assert decision.gap == (10000, 10010)  # 20..9999 were skipped already


def test_a_seal_ignores_the_reservation_and_skips_nothing() -> None:
    state = SealedState(True, 21, "a", 1.0, reserved_through=None, gaps=((5, 7),))
    decision = choose_start(state, catalog_end=21, local_end=None)
    assert (decision.next_offset, decision.gap) == (22, None)


def test_gaps_merge_and_are_stepped_over() -> None:
    gaps = merge_gaps([(10, 12), None, (3, 4), (13, 20), (5, 5), (30, 31)])
    assert gaps == ((3, 5), (10, 20), (30, 31))
    assert [gap_end_after(gaps, o) for o in (2, 3, 5, 6, 10, 20, 21, 31, 32)] == [
        2,
        6,
        6,
        6,
        21,
        21,
        21,
        32,
        32,
    ]


gaps_strategy = st.lists(
    st.tuples(st.integers(0, 100), st.integers(0, 20)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=3,
).map(merge_gaps)


@given(
    state=st.none()
    | st.builds(
        SealedState,
        st.booleans(),
        st.integers(-1, 100),
        st.just("b1"),
        st.just(0.0),
        st.none() | st.integers(-1, 150),
        gaps_strategy,
    ),
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
        # A crashed owner may have assigned anything it had reserved.
        if state is not None and state.reserved_through is not None:
            used.append(state.reserved_through)
    assert all(decision.next_offset > e for e in used)
    # Kept local segments continue exactly at the next offset, or at a declared gap that
    # reaches it; a gap never covers what object storage or kept segments hold.
    # Between the last offset held (object storage, kept segments) and the next offset,
    # everything is skipped: by this decision's gap or by a gap recorded before.
    kept = local_end is not None and not decision.discard_local
    if state is None or not state.sealed:
        held = max(
            catalog_end if catalog_end is not None else -1,
            local_end if kept and local_end is not None else -1,
        )
        skipped = set(range(*decision.gap)) | {decision.gap[1]} if decision.gap else set()
        recorded = {o for s, e in (state.gaps if state else ()) for o in range(s, e + 1)}
        assert set(range(held + 1, decision.next_offset)) <= skipped | recorded
    if decision.gap is not None:
        start, end = decision.gap
        assert end == decision.next_offset - 1 and start <= end
        assert catalog_end is None or start > catalog_end
        assert not kept or local_end is None or start > local_end


def test_state_round_trips_and_rejects_bad_fields() -> None:
    state = sealed(21)
    assert SealedState.from_dict(state.to_dict()) == state
    assert "reserved_through" not in state.to_dict() and "gaps" not in state.to_dict()
    claim = reserved(21, 10021, gaps=((3, 9), (12, 12)))
    assert claim.to_dict()["gaps"] == [[3, 9], [12, 12]]
    assert SealedState.from_dict(claim.to_dict()) == claim
    with pytest.raises(StateError, match="reserved_through"):
        SealedState.from_dict({**claim.to_dict(), "reserved_through": "x"})
    with pytest.raises(StateError, match=r"gaps\[0\]"):
        SealedState.from_dict({**claim.to_dict(), "gaps": [[5, 2]]})
    with pytest.raises(StateError, match="sealed"):
        SealedState.from_dict({"last_committed_offset": 1, "broker_id": "a"})
    with pytest.raises(StateError, match="last_committed_offset"):
        SealedState.from_dict({"sealed": True, "last_committed_offset": "x", "broker_id": "a"})
    with pytest.raises(StateError, match="broker_id"):
        SealedState.from_dict({"sealed": True, "last_committed_offset": 1, "broker_id": "a/b"})
    with pytest.raises(StateError, match="JSON object"):
        SealedState.from_dict([1])
