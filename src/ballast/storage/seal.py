"""Sealed state and the choice of where a topic's offsets continue.

The state key (``keys.storage_state(topic)``) holds one `SealedState`. A graceful unload
writes ``sealed: true`` with the last committed offset. Opening a topic overwrites it with
``sealed: false``, the owner's id and its offset reservation (`reserved_through`: the owner
assigns no offset beyond it without first extending it, fenced on its claim), so a sealed
state is trusted exactly once: if the new owner later crashes, the next owner does not
continue from a stale seal but falls back to the evidence (object catalog, local WAL, the
unsealed record and its reservation).

Continuing after the reservation means that a crash never makes the topic reuse an offset,
even when the crashed owner's disk is gone with its un-uploaded messages. The offsets
skipped that way are recorded as `gaps` in the state, carried from owner to owner, so
readers step over them instead of waiting for offsets that will never exist.

`choose_start` is the decision, a pure function of that evidence.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ballast.model import ModelError, validate_broker_id

__all__ = [
    "Gap",
    "SealedState",
    "StartDecision",
    "StartSource",
    "StateError",
    "choose_start",
    "gap_end_after",
    "merge_gaps",
]

# An inclusive range of offsets that were skipped and will never hold a message.
Gap = tuple[int, int]


class StateError(ValueError):
    """A stored storage state that does not fit the format; names the field."""


@dataclass(frozen=True)
class SealedState:
    """The value at ``/storage/topics/{ns}/{topic}/state``.

    `sealed` true: the topic was unloaded gracefully and everything up to
    `last_committed_offset` is in object storage. `sealed` false: `broker_id` owns (or
    owned, if it crashed) the topic since `timestamp`, having started after
    `last_committed_offset`, and may assign offsets up to `reserved_through` (None in
    states written before reservations existed). `gaps`: offsets skipped by earlier
    owners, sorted and disjoint.
    """

    sealed: bool
    last_committed_offset: int
    broker_id: str
    timestamp: float
    reserved_through: int | None = None
    gaps: tuple[Gap, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON form stored in the metadata store."""
        data: dict[str, Any] = {
            "sealed": self.sealed,
            "last_committed_offset": self.last_committed_offset,
            "broker_id": self.broker_id,
            "timestamp": self.timestamp,
        }
        if self.reserved_through is not None:
            data["reserved_through"] = self.reserved_through
        if self.gaps:
            data["gaps"] = [[start, end] for start, end in self.gaps]
        return data

    @classmethod
    def from_dict(cls, data: Any, ctx: str = "storage_state") -> SealedState:
        """Validate a stored state; raises `StateError` naming the bad field."""
        if not isinstance(data, Mapping):
            raise StateError(f"{ctx}: expected a JSON object, got {type(data).__name__}")
        sealed = data.get("sealed")
        if not isinstance(sealed, bool):
            raise StateError(f"{ctx}.sealed: expected true or false, got {sealed!r}")
        last = data.get("last_committed_offset")
        if isinstance(last, bool) or not isinstance(last, int) or last < -1:
            raise StateError(
                f"{ctx}.last_committed_offset: expected an integer >= -1, got {last!r}"
            )
        try:
            broker_id = validate_broker_id(data.get("broker_id"), f"{ctx}.broker_id")
        except ModelError as exc:
            raise StateError(str(exc)) from None
        timestamp = data.get("timestamp", 0.0)
        if isinstance(timestamp, bool) or not isinstance(timestamp, int | float):
            raise StateError(f"{ctx}.timestamp: expected a number, got {timestamp!r}")
        reserved = data.get("reserved_through")
        if reserved is not None and (
            isinstance(reserved, bool) or not isinstance(reserved, int) or reserved < -1
        ):
            raise StateError(f"{ctx}.reserved_through: expected an integer >= -1, got {reserved!r}")
        return cls(
            sealed,
            last,
            broker_id,
            float(timestamp),
            reserved,
            _parse_gaps(data.get("gaps", []), f"{ctx}.gaps"),
        )


def _parse_gaps(value: Any, ctx: str) -> tuple[Gap, ...]:
    if not isinstance(value, list):
        raise StateError(f"{ctx}: expected a list of [start, end] pairs, got {value!r}")
    gaps: list[Gap] = []
    for i, item in enumerate(value):
        if (
            not isinstance(item, list | tuple)
            or len(item) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in item)
            or not 0 <= item[0] <= item[1]
        ):
            raise StateError(f"{ctx}[{i}]: expected [start, end] with 0 <= start <= end")
        gaps.append((item[0], item[1]))
    return merge_gaps(gaps)


def merge_gaps(gaps: Iterable[Gap | None]) -> tuple[Gap, ...]:
    """Sorted, disjoint gaps: overlapping or adjacent ranges are joined; None is ignored."""
    merged: list[Gap] = []
    for start, end in sorted(g for g in gaps if g is not None):
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


def gap_end_after(gaps: Sequence[Gap], offset: int) -> int:
    """`offset`, or the first offset after the gap containing it (gaps sorted, disjoint)."""
    i = bisect.bisect_right(gaps, offset, key=lambda g: g[0]) - 1
    if i >= 0 and gaps[i][0] <= offset <= gaps[i][1]:
        return gaps[i][1] + 1
    return offset


class StartSource(StrEnum):
    """Which evidence fixed a topic's next offset on open."""

    SEALED = "sealed"  # a graceful seal by the previous owner
    CATALOG = "catalog"  # the object catalog (previous owner crashed)
    LOCAL_WAL = "local_wal"  # this broker's own WAL (it owned the topic and crashed)
    OWNER_RECORD = "owner_record"  # the unsealed state a crashed owner wrote when it opened
    RESERVATION = "reservation"  # the offsets a crashed owner had reserved (a gap follows)
    EMPTY = "empty"  # a brand-new topic


@dataclass(frozen=True)
class StartDecision:
    """Where appends continue, why, whether local segments must go, and what is skipped.

    `gap` is the range between the last offset still held (object storage or kept local
    segments) and `next_offset`, when there is one: those offsets may have been assigned
    by a crashed owner whose copy is gone, or never assigned; either way no message will
    ever be found there.
    """

    next_offset: int
    source: StartSource
    discard_local: bool
    reason: str
    gap: Gap | None = None


def choose_start(
    state: SealedState | None,
    catalog_end: int | None,
    local_end: int | None,
) -> StartDecision:
    """Decide the next offset from the evidence; never an offset that may have been used.

    - A seal is authoritative: continue after its last committed offset. Local segments
      are then redundant (the seal drained them into object storage) and are discarded.
    - Without a seal, continue after the highest offset any evidence shows, including the
      crashed owner's reservation: it may have assigned (and acknowledged) anything up to
      it, even if its copy is gone with its disk. Local segments are kept only if they
      hold messages that are nowhere else: beyond the catalog and not inside a range that
      an earlier owner already declared skipped. What lies between the last message held
      and the next offset, and is not a recorded gap already, is the decision's `gap`.
    """
    if state is not None and state.sealed:
        next_offset = state.last_committed_offset + 1
        reason = f"sealed by {state.broker_id} at offset {state.last_committed_offset}"
        if catalog_end is not None and catalog_end >= next_offset:
            # Objects beyond the seal can only come from a fenced-off owner; never reuse them.
            next_offset = catalog_end + 1
            reason += f"; object catalog reaches {catalog_end}"
        return StartDecision(next_offset, StartSource.SEALED, local_end is not None, reason)
    stored = catalog_end if catalog_end is not None else -1
    keep_local = (
        local_end is not None
        and local_end >= stored
        # Skipped by a later owner: its recorded gap covers our last offset.
        and not (state is not None and gap_end_after(state.gaps, local_end) != local_end)
        # A state from before reservations: the old rule (the owner record bounds it).
        and not (
            state is not None
            and state.reserved_through is None
            and local_end < state.last_committed_offset
        )
    )
    # (offset, source, rank): on a tie the lowest rank wins; kept local segments first.
    candidates: list[tuple[int, StartSource, int]] = []
    if local_end is not None:
        candidates.append((local_end, StartSource.LOCAL_WAL, 0 if keep_local else 9))
    if catalog_end is not None:
        candidates.append((catalog_end, StartSource.CATALOG, 1))
    if state is not None and state.last_committed_offset >= 0:
        candidates.append((state.last_committed_offset, StartSource.OWNER_RECORD, 2))
    if state is not None and state.reserved_through is not None and state.reserved_through >= 0:
        candidates.append((state.reserved_through, StartSource.RESERVATION, 3))
    if not candidates:
        return StartDecision(0, StartSource.EMPTY, False, "no sealed state, objects or WAL")
    highest, source, _ = min(candidates, key=lambda c: (-c[0], c[2]))
    held = max(stored, local_end if keep_local and local_end is not None else -1)
    # Only what is newly skipped: a recorded gap right after the data is skipped already.
    first_unheld = gap_end_after(state.gaps, held + 1) if state is not None else held + 1
    gap = (first_unheld, highest) if highest >= first_unheld else None
    parts = [f"{s.value}={end}" for end, s, _ in candidates]
    reason = f"not sealed ({', '.join(parts)}); continuing after {highest}"
    if state is not None:
        reason += f"; last owner {state.broker_id}"
    if gap is not None:
        reason += f"; offsets {gap[0]}..{gap[1]} are skipped (held nowhere)"
    discard = local_end is not None and not keep_local
    return StartDecision(highest + 1, source, discard, reason, gap)
