"""Sealed state and the choice of where a topic's offsets continue.

The state key (``keys.storage_state(topic)``) holds one `SealedState`. A graceful unload
writes ``sealed: true`` with the last committed offset. Opening a topic overwrites it with
``sealed: false`` and the owner's id, so a sealed state is trusted exactly once: if the
new owner later crashes, the next owner does not continue from a stale seal but falls back
to the evidence (object catalog, local WAL, the unsealed record).

`choose_start` is the decision, a pure function of that evidence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ballast.model import ModelError, validate_broker_id

__all__ = ["SealedState", "StartDecision", "StartSource", "StateError", "choose_start"]


class StateError(ValueError):
    """A stored storage state that does not fit the format; names the field."""


@dataclass(frozen=True)
class SealedState:
    """The value at ``/storage/topics/{ns}/{topic}/state``.

    `sealed` true: the topic was unloaded gracefully and everything up to
    `last_committed_offset` is in object storage. `sealed` false: `broker_id` owns (or
    owned, if it crashed) the topic since `timestamp`, having started after
    `last_committed_offset`.
    """

    sealed: bool
    last_committed_offset: int
    broker_id: str
    timestamp: float

    def to_dict(self) -> dict[str, Any]:
        """JSON form stored in the metadata store."""
        return {
            "sealed": self.sealed,
            "last_committed_offset": self.last_committed_offset,
            "broker_id": self.broker_id,
            "timestamp": self.timestamp,
        }

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
        return cls(sealed, last, broker_id, float(timestamp))


class StartSource(StrEnum):
    """Which evidence fixed a topic's next offset on open."""

    SEALED = "sealed"  # a graceful seal by the previous owner
    CATALOG = "catalog"  # the object catalog (previous owner crashed)
    LOCAL_WAL = "local_wal"  # this broker's own WAL (it owned the topic and crashed)
    OWNER_RECORD = "owner_record"  # the unsealed state a crashed owner wrote when it opened
    EMPTY = "empty"  # a brand-new topic


@dataclass(frozen=True)
class StartDecision:
    """Where appends continue, why, and whether local segments must go."""

    next_offset: int
    source: StartSource
    discard_local: bool
    reason: str


def choose_start(
    state: SealedState | None,
    catalog_end: int | None,
    local_end: int | None,
) -> StartDecision:
    """Decide the next offset from the evidence; never an offset that may have been used.

    - A seal is authoritative: continue after its last committed offset. Local segments
      are then redundant (the seal drained them into object storage) and are discarded.
    - Without a seal, continue after the highest offset any evidence shows. Local segments
      are kept only if they hold that highest offset (they continue exactly there);
      otherwise everything in them is already in object storage.
    """
    if state is not None and state.sealed:
        next_offset = state.last_committed_offset + 1
        reason = f"sealed by {state.broker_id} at offset {state.last_committed_offset}"
        if catalog_end is not None and catalog_end >= next_offset:
            # Objects beyond the seal can only come from a fenced-off owner; never reuse them.
            next_offset = catalog_end + 1
            reason += f"; object catalog reaches {catalog_end}"
        return StartDecision(next_offset, StartSource.SEALED, local_end is not None, reason)
    candidates: list[tuple[int, StartSource]] = []
    if local_end is not None:
        candidates.append((local_end, StartSource.LOCAL_WAL))
    if catalog_end is not None:
        candidates.append((catalog_end, StartSource.CATALOG))
    if state is not None and state.last_committed_offset >= 0:
        candidates.append((state.last_committed_offset, StartSource.OWNER_RECORD))
    if not candidates:
        return StartDecision(0, StartSource.EMPTY, False, "no sealed state, objects or WAL")
    # Highest offset wins; on a tie the local WAL is preferred (it keeps its segments).
    highest, source = max(candidates, key=lambda c: (c[0], c[1] is StartSource.LOCAL_WAL))
    discard = local_end is not None and local_end != highest
    parts = [f"{s.value}={end}" for end, s in candidates]
    reason = f"not sealed ({', '.join(parts)}); continuing after {highest}"
    if state is not None:
        reason += f"; last owner {state.broker_id}"
    return StartDecision(highest + 1, source, discard, reason)
