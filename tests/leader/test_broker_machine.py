"""`BrokerMachine`: a broker's reaction to changes of its prefix, as events in, effects out.

The same machine runs in `BrokerNode` (tests/cluster/test_broker.py drives it on a store
and a topic host) and in the simulator's brokers; here it is checked on its own, and the
simulator is checked to bounce an assignment that reaches a draining broker.
"""

from __future__ import annotations

from dataclasses import replace

from ballast.leader.broker_machine import (
    BrokerMachine,
    GiveBack,
    Load,
    Reject,
    SealHandoff,
    Unload,
)
from ballast.leader.intents import Placement
from ballast.leader.transactions import placement_write
from ballast.metadata import Compare, Delete, Put, WatchEvent, keys
from ballast.metadata.core import StoreCore
from ballast.metadata.records import assignment_value, owner_value
from ballast.metadata.store import swap
from ballast.model import Assignment, BrokerMode, BrokerState, MarkerReason, UnassignedMarker
from ballast.simulate.engine import Simulator
from ballast.simulate.scenario import load_scenario

NOW = 1_700_000_000.0


def put(key: str, value: object, revision: int = 7) -> WatchEvent:
    return WatchEvent("put", key, value, revision)


def test_an_assignment_is_loaded_once_with_its_consumed_marker() -> None:
    machine = BrokerMachine("b1")
    marker = UnassignedMarker(MarkerReason.FAILOVER, from_broker="b2", to_broker="b1")
    event = put(keys.broker_assignment("b1", "/ns/t"), assignment_value(Assignment(NOW), marker))
    assert machine.watched(event, NOW) == [Load("/ns/t", marker)]
    machine.loaded("/ns/t")
    assert machine.watched(event, NOW) == []  # served already


def test_a_bad_assignment_is_rejected_and_loaded_anyway() -> None:
    machine = BrokerMachine("b1")
    effects = machine.watched(put(keys.broker_assignment("b1", "/ns/t"), {"epoch": "x"}), NOW)
    assert [type(e) for e in effects] == [Reject, Load]
    assert effects[1] == Load("/ns/t", None)


def test_nothing_is_loaded_while_unregistered() -> None:
    machine = BrokerMachine("b1", registered=False)
    assert machine.watched(put(keys.broker_assignment("b1", "/ns/t"), None), NOW) == []


def test_a_draining_broker_bounces_with_one_guarded_transaction() -> None:
    machine = BrokerMachine("b1")
    draining = BrokerState(BrokerMode.DRAINING, "admin").to_dict()
    assert machine.watched(put(keys.broker_state("b1"), draining), NOW) == []
    key = keys.broker_assignment("b1", "/ns/late")
    [bounce] = machine.watched(put(key, Assignment(NOW).to_dict(), revision=12), NOW)
    marker = UnassignedMarker(
        MarkerReason.DRAIN_REDIRECT, from_broker="b1", timestamp=NOW, ready=True
    )
    assert bounce == GiveBack(
        "/ns/late",
        (Compare.mod_revision_equals(key, 12), Compare.absent(keys.unassigned("/ns/late"))),
        (
            Delete(key),
            Delete(keys.topic_owner("/ns/late")),
            Put(keys.unassigned("/ns/late"), marker.to_dict()),
        ),
    )
    # The state deleted: active again.
    assert machine.watched(WatchEvent("delete", keys.broker_state("b1"), None, 13), NOW) == []
    assert machine.mode is BrokerMode.ACTIVE


def test_a_bad_state_keeps_the_mode() -> None:
    machine = BrokerMachine("b1", state=BrokerState(BrokerMode.DRAINING))
    [reject] = machine.watched(put(keys.broker_state("b1"), {"mode": "sideways"}), NOW)
    assert isinstance(reject, Reject) and reject.kind == "broker_state"
    assert machine.mode is BrokerMode.DRAINING


def test_a_foreign_key_and_an_undecodable_value_are_rejected() -> None:
    machine = BrokerMachine("b1")
    [foreign] = machine.watched(put("/cluster/brokers/b1/x", 1), NOW)
    assert foreign == Reject("key", "ignoring foreign key '/cluster/brokers/b1/x'")
    error = WatchEvent("error", keys.broker_assignment("b1", "/ns/t"), None, 3, "not JSON")
    assert machine.watched(error, NOW) == [Reject("assignment", "bad assignment value: not JSON")]


def test_an_unassigned_topic_is_unloaded_and_only_our_waiting_marker_made_ready() -> None:
    machine = BrokerMachine("b1")
    machine.loaded("/ns/t")
    event = WatchEvent("delete", keys.broker_assignment("b1", "/ns/t"), None, 9)
    assert machine.watched(event, NOW) == [Unload("/ns/t", serving=True)]
    assert machine.serving == set()
    assert machine.watched(event, NOW) == [Unload("/ns/t", serving=False)]

    waiting = UnassignedMarker(MarkerReason.REBALANCE, "b1", "b2", NOW, ready=False)
    ready = machine.ready_marker(waiting.to_dict(), unsealed="disk full")
    assert (
        ready
        == UnassignedMarker(
            MarkerReason.REBALANCE, "b1", "b2", NOW, ready=True, unsealed="disk full"
        ).to_dict()
    )
    other = UnassignedMarker(MarkerReason.REBALANCE, "b3", "b2", NOW, ready=False)
    assert machine.ready_marker(other.to_dict()) is None
    assert machine.ready_marker(ready) is None  # ready already


def test_the_simulated_draining_broker_bounces_a_late_assignment() -> None:
    # Before the shared machine, simulated brokers served whatever reached them.
    sim = Simulator(load_scenario("scale-out", {"duration_hours": 0.1}))
    sim.run()
    store: StoreCore = sim.store
    store.put(keys.broker_state("broker-5"), BrokerState(BrokerMode.DRAINING, "test").to_dict())
    sim._pump()
    key = keys.broker_assignment("broker-5", "/default/late")
    store.put(key, Assignment(sim.now).to_dict())
    sim._brokers_react()
    assert store.get(key) is None
    kv = store.get(keys.unassigned("/default/late"))
    assert kv is not None
    marker = UnassignedMarker.from_dict(kv.value)
    assert (marker.reason, marker.from_broker, marker.ready) == (
        MarkerReason.DRAIN_REDIRECT,
        "broker-5",
        True,
    )
    assert "/default/late" not in sim.assignments["broker-5"]


def test_a_topic_that_cannot_be_served_is_released_with_an_unload_marker() -> None:
    machine = BrokerMachine("b1")
    key = keys.broker_assignment("b1", "/ns/t")
    marker = UnassignedMarker(MarkerReason.UNLOAD, from_broker="b1", timestamp=NOW, ready=False)
    assert machine.release("/ns/t", 21, NOW) == GiveBack(
        "/ns/t",
        (Compare.mod_revision_equals(key, 21), Compare.absent(keys.unassigned("/ns/t"))),
        (
            Delete(key),
            Delete(keys.topic_owner("/ns/t")),
            Put(keys.unassigned("/ns/t"), marker.to_dict()),
        ),
    )


def test_the_seal_hands_a_move_to_the_destination_it_names() -> None:
    """Placed as the leader places (`placement_write`), guarded on the destination's
    registration too; a move without a destination (or back to this broker) is made ready
    for the leader instead; a marker not waiting for this broker is left alone."""
    machine = BrokerMachine("b1")
    topic = "/ns/t"
    move = UnassignedMarker(MarkerReason.REBALANCE, "b1", "b2", NOW, ready=False)
    handoff = machine.handoff(topic, move.to_dict(), 41, NOW + 1)
    ready = replace(move, ready=True)
    compares, ops = placement_write(Placement(topic, "b2", 41, ready), NOW + 1)
    assert handoff == SealHandoff(
        (*compares, Compare.present(keys.register("b2"))), tuple(ops), "b2", ready
    )
    assert Delete(keys.unassigned(topic)) in ops
    assert Put(keys.topic_owner(topic), owner_value("b2")) in ops

    unload = UnassignedMarker(MarkerReason.UNLOAD, "b1", None, NOW, ready=False)
    for marker in (unload, replace(unload, to_broker="b1")):
        made_ready = replace(marker, ready=True)
        guard, write = swap(keys.unassigned(topic), 7, made_ready.to_dict())
        assert machine.handoff(topic, marker.to_dict(), 7, NOW) == SealHandoff(
            tuple(guard), tuple(write), None, made_ready
        )
    assert machine.handoff(topic, replace(move, from_broker="b3").to_dict(), 7, NOW) is None
    assert machine.handoff(topic, ready.to_dict(), 7, NOW) is None
