"""What a leader round decided to write, as typed values (no store operations yet).

A round of `LeaderMachine` returns these intents; `leader.transactions` turns each into
guarded transactions (one chunker for all), and every write in flight is keyed by its id
to the part of the intent it carries, so its outcome is booked by type rather than by a
string and an untyped payload.

Every revision here is what the decision read: the transaction compares on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ballast.balance.pulsar.bundles import NamespaceBundles
from ballast.metadata import Compare, Delete, Put
from ballast.model import BrokerId, ClusterSnapshot, Move, UnassignedMarker


@dataclass(frozen=True)
class Repair:
    """Replace (or delete) an undecodable value under ``/cluster/``."""

    key: str
    record: str  # the record kind, for the note
    guard: Compare
    op: Put | Delete


@dataclass(frozen=True)
class Reassign:
    """One topic of a dead broker: its assignment's revision and the survivor (None: no
    survivor can take it, a ready marker waits for one)."""

    topic: str
    revision: int
    target: BrokerId | None


@dataclass(frozen=True)
class Failover:
    """Reassign a dead broker's topics directly (guarded by its registration's absence)."""

    dead: BrokerId
    topics: tuple[Reassign, ...]
    now: float


@dataclass(frozen=True)
class Release:
    """A marker waiting for the seal of a source that is gone becomes ready."""

    topic: str
    revision: int
    marker: UnassignedMarker


@dataclass(frozen=True)
class Force:
    """A marker whose living source has not sealed in time becomes ready, recorded as
    forced with `why`."""

    topic: str
    revision: int
    marker: UnassignedMarker
    why: str


@dataclass(frozen=True)
class Unload:
    """One topic to take off `broker` with `marker` (drain, unload of a split bundle)."""

    topic: str
    broker: BrokerId
    revision: int
    marker: UnassignedMarker


@dataclass(frozen=True)
class Drain:
    """Unload a draining broker's topics."""

    broker: BrokerId
    unloads: tuple[Unload, ...]


@dataclass(frozen=True)
class Drained:
    """A draining broker owns nothing and nothing waits for its seal."""

    broker: BrokerId
    state_revision: int


@dataclass(frozen=True)
class RecordOwner:
    """An assignment without its ownership record gets one."""

    topic: str
    broker: BrokerId
    assignment_revision: int


@dataclass(frozen=True)
class RemoveOwner:
    """An ownership record without its assignment is removed."""

    topic: str
    broker: BrokerId
    record_revision: int


@dataclass(frozen=True)
class UnloadSplit:
    """Unload the topics of bundles this leader split, so placement spreads the halves."""

    unloads: tuple[Unload, ...]


@dataclass(frozen=True)
class SplitBundles:
    """Write a namespace's new bundle layout (`revision` 0: none stored yet)."""

    namespace: str
    revision: int
    layout: NamespaceBundles
    added: int
    unload: tuple[tuple[str, BrokerId], ...]  # topics of the split bundles, and their owners
    why: tuple[str, ...]


@dataclass(frozen=True)
class DropMarker:
    """Delete a marker that cannot be placed (`reason` is the rejection kind)."""

    topic: str
    revision: int
    reason: str
    why: str
    compares: tuple[Compare, ...]


@dataclass(frozen=True)
class Placement:
    """A ready marker placed on `target`."""

    topic: str
    target: BrokerId
    revision: int
    marker: UnassignedMarker


@dataclass(frozen=True)
class Place:
    """Place ready markers: assignment and ownership record written, marker deleted."""

    placements: tuple[Placement, ...]
    now: float


@dataclass(frozen=True)
class Relocation:
    """One move of a rebalancing decision and the source assignment's revision."""

    move: Move
    revision: int


@dataclass(frozen=True)
class MoveTopics:
    """Write the moves of a rebalancing decision (release, marker, history record).

    `after` is the snapshot the decision expects once they are done (the estimates);
    `explanation` is noted once, with the first transaction."""

    relocations: tuple[Relocation, ...]
    after: ClusterSnapshot
    explanation: str | None
    now: float


Intent = (
    Repair
    | Failover
    | Release
    | Force
    | Drain
    | Drained
    | RecordOwner
    | RemoveOwner
    | UnloadSplit
    | SplitBundles
    | DropMarker
    | Place
    | MoveTopics
)
