"""A broker's reaction to its assignments, as a pure machine: changes in, effects out.

A broker watches its own prefix ``/cluster/brokers/{id}/`` (its state and its
assignments). `BrokerMachine` decides what each change means: an assignment to an active
broker is loaded; one that reaches a draining (or drained) broker is bounced (one guarded
transaction deletes it and writes a ``drain_redirect`` marker); a deleted assignment is
unloaded (sealed), and the move's marker that waits for this broker's seal is handed off
in the seal's own transaction (`handoff`): placed on the destination the move names, or
made ready for the leader to place. `cluster.broker.BrokerNode` performs the effects on
its topic host and the store; the simulator performs them on its simulated brokers and
its `StoreCore`, so both react alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ballast.leader.intents import Placement
from ballast.leader.transactions import placement_write
from ballast.metadata import Compare, Delete, Put, WatchEvent, keys
from ballast.metadata.records import parse_assignment_value, release_ops
from ballast.metadata.store import swap
from ballast.model import (
    BrokerId,
    BrokerMode,
    BrokerState,
    MarkerReason,
    ModelError,
    UnassignedMarker,
)


@dataclass(frozen=True)
class Load:
    """Serve `topic` (its assignment's consumed marker, if any, says where it came from);
    the shell calls `BrokerMachine.loaded` once the host serves it."""

    topic: str
    marker: UnassignedMarker | None


@dataclass(frozen=True)
class Unload:
    """Stop serving `topic` (`serving`: the host serves it and must seal it); once it is
    sealed, or was not served, its marker is made ready (`ready_marker`)."""

    topic: str
    serving: bool


@dataclass(frozen=True)
class GiveBack:
    """Hand an assignment back to the leader: one transaction deletes it (if unchanged)
    and writes the topic's marker (if none is pending). A draining broker bounces what
    still reaches it so; a broker that cannot serve a topic releases it so."""

    topic: str
    compares: tuple[Compare, ...]
    ops: tuple[Put | Delete, ...]


@dataclass(frozen=True)
class SealHandoff:
    """What a seal writes for its topic's marker (`BrokerMachine.handoff`): the conditions,
    the writes, and the broker they place the topic on (None: the marker made ready)."""

    compares: tuple[Compare, ...]
    ops: tuple[Put | Delete, ...]
    placed_on: BrokerId | None
    marker: UnassignedMarker


@dataclass(frozen=True)
class Reject:
    """A bad record (`kind` for the rejection counter), logged; the broker keeps going."""

    kind: str
    message: str


BrokerEffect = Load | Unload | GiveBack | Reject


@dataclass
class BrokerMachine:
    """What one broker serves and its mode, and its reaction to changes of its prefix.

    `registered`: the broker holds its registration; one that lost it loads nothing until
    it has registered again (and listed its assignments anew)."""

    broker_id: BrokerId
    registered: bool = True
    state: BrokerState = field(default_factory=BrokerState)
    serving: set[str] = field(default_factory=set)

    @property
    def mode(self) -> BrokerMode:
        return self.state.mode

    def watched(self, event: WatchEvent, now: float) -> list[BrokerEffect]:
        """React to one watch event under the broker's prefix."""
        if event.key == keys.broker_state(self.broker_id):
            if event.kind == "delete":
                self.state = BrokerState()
                return []
            if event.kind == "put":
                return self.set_state(event.value)
            return []
        try:
            _, name = keys.parse_assignment_key(event.key)
        except ValueError:
            return [Reject("key", f"ignoring foreign key {event.key!r}")]
        topic = str(name)
        if event.kind == "put":
            return self.assigned(topic, event.value, event.revision, now)
        if event.kind == "delete":
            return self.unassigned(topic)
        if event.kind == "error":
            return [Reject("assignment", f"bad assignment value: {event.error}")]
        return []

    def set_state(self, value: Any) -> list[BrokerEffect]:
        """Take the broker's state record (a bad one keeps the current mode)."""
        try:
            self.state = BrokerState.from_dict(value)
        except ModelError as exc:
            return [Reject("broker_state", f"bad state value, keeping {self.mode}: {exc}")]
        return []

    def assigned(self, topic: str, value: Any, revision: int, now: float) -> list[BrokerEffect]:
        """`topic` is assigned here (`value` None: its value could not be decoded)."""
        if topic in self.serving or not self.registered:
            return []
        if self.mode is not BrokerMode.ACTIVE:
            return [self._bounce(topic, revision, now)]
        try:
            _, marker = parse_assignment_value(value)
        except ModelError as exc:
            reject = Reject("assignment", f"bad assignment of {topic} (loading anyway): {exc}")
            return [reject, Load(topic, None)]
        return [Load(topic, marker)]

    def loaded(self, topic: str) -> None:
        """The host serves `topic` now."""
        self.serving.add(topic)

    def unassigned(self, topic: str) -> list[BrokerEffect]:
        """`topic`'s assignment here is gone: stop serving it."""
        serving = topic in self.serving
        self.serving.discard(topic)
        return [Unload(topic, serving)]

    def release(self, topic: str, revision: int, now: float) -> GiveBack:
        """Give `topic` (its assignment at `revision`) back because it cannot be served
        here: an unload marker waits for our seal attempt, then the leader places it."""
        marker = UnassignedMarker(
            MarkerReason.UNLOAD, from_broker=self.broker_id, timestamp=now, ready=False
        )
        return self._give_back(topic, revision, marker)

    def _bounce(self, topic: str, revision: int, now: float) -> GiveBack:
        marker = UnassignedMarker(
            MarkerReason.DRAIN_REDIRECT, from_broker=self.broker_id, timestamp=now, ready=True
        )
        return self._give_back(topic, revision, marker)

    def _give_back(self, topic: str, revision: int, marker: UnassignedMarker) -> GiveBack:
        key = keys.broker_assignment(self.broker_id, topic)
        return GiveBack(
            topic,
            (Compare.mod_revision_equals(key, revision), Compare.absent(keys.unassigned(topic))),
            (*release_ops(self.broker_id, topic), Put(keys.unassigned(topic), marker.to_dict())),
        )

    def handoff(self, topic: str, value: Any, revision: int, now: float) -> SealHandoff | None:
        """What the seal's own transaction writes for `topic`'s marker `value` (read at
        `revision`) if it waits for this broker's seal, else None. A move that names its
        destination (the rebalancer's, a plan's, ``unload --to``) is placed there at once,
        as the leader would place it (`placement_write`, and the destination still
        registered): the new owner learns of it from the seal itself, without a round
        through the leader. Any other marker is made ready for the leader to place. Raises
        `ModelError` on a bad marker.

        If the placement's conditions fail (the destination is gone), the seal is written
        alone and the marker made ready after it (`ready_marker`): the leader places it.
        """
        ready = self._made_ready(value)
        if ready is None:
            return None
        target = ready.to_broker
        if target is None or target == self.broker_id:
            compares, ops = swap(keys.unassigned(topic), revision, ready.to_dict())
            return SealHandoff(tuple(compares), tuple(ops), None, ready)
        compares, ops = placement_write(Placement(topic, target, revision, ready), now)
        return SealHandoff(
            (*compares, Compare.present(keys.register(target))), tuple(ops), target, ready
        )

    def ready_marker(self, value: Any, unsealed: str | None = None) -> dict[str, Any] | None:
        """The marker `value` made ready, if it waits for this broker's seal (else None);
        `unsealed` says why the topic was handed over unsealed. Raises `ModelError` on a
        bad marker."""
        ready = self._made_ready(value, unsealed)
        return None if ready is None else ready.to_dict()

    def _made_ready(self, value: Any, unsealed: str | None = None) -> UnassignedMarker | None:
        marker = UnassignedMarker.from_dict(value)
        if marker.from_broker != self.broker_id or marker.ready:
            return None
        return replace(marker, ready=True, unsealed=unsealed)
