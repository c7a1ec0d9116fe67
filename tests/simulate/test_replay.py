"""The simulator and the live leader make the same decisions.

The simulator's leader is `LeaderMachine` with the shared perform loop (`leader.perform`)
on a `StoreCore`. Here the same scenario runs a second time with the live leader's shell
in its place: a `LeaderSession` (built exactly as when a broker is elected) performs every
`Ready` on a `MemoryStore` whose core is the simulator's store. Both runs give the same
effects, write for write, the same store and hence the same timeline, moves and failover
placements.
"""

from __future__ import annotations

import asyncio

import pytest

from ballast.cluster.election import LeaderElection, Term
from ballast.cluster.load_manager import LeaderSession, LoadManager
from ballast.config import BallastConfig
from ballast.leader import effects_text
from ballast.metadata.memory import MemoryStore
from ballast.simulate.engine import EPOCH, LEADER, Simulator
from ballast.simulate.scenario import load_scenario


class VirtualClock:
    """The simulator's virtual time, for the live shell (which never sleeps here)."""

    def __init__(self) -> None:
        self.sim: Simulator | None = None

    def now(self) -> float:
        return EPOCH if self.sim is None else self.sim.now

    async def sleep(self, seconds: float) -> None:
        raise AssertionError("the replayed leader session does not sleep")


@pytest.mark.parametrize("name", ["scale-out", "broker-failure"])
def test_simulator_and_the_live_leader_session_decide_alike(name: str) -> None:
    scenario = load_scenario(name, {"duration_hours": 4})
    pure = Simulator(scenario)
    expected = pure.run()
    assert len(pure.inputs) == len(pure.outputs)

    clock = VirtualClock()
    store = MemoryStore(clock)
    live = Simulator(scenario, store.core)
    clock.sim = live
    config = BallastConfig(load_manager=scenario.load_manager)
    election = LeaderElection(store, clock, LEADER, 10.0)
    manager = LoadManager(
        store, clock, config, election, rankings_interval=scenario.sample_every_seconds
    )
    session = LeaderSession(manager, Term(LEADER, live.term, EPOCH))
    with asyncio.Runner() as runner:
        live.leader = lambda event: runner.run(session.perform(session.machine.step(event)))
        result = live.run()
        runner.run(store.close())

    assert len(live.outputs) == len(pure.outputs)
    for i, (got, want) in enumerate(zip(live.outputs, pure.outputs, strict=True)):
        assert effects_text(got) == effects_text(want), f"ready {i}"
        assert (got.decision, got.moved) == (want.decision, want.moved), f"ready {i}"
    assert store.core.get_prefix("/").items == pure.store.get_prefix("/").items
    assert (result.samples, result.moves, result.failovers, result.drains, result.rules) == (
        expected.samples,
        expected.moves,
        expected.failovers,
        expected.drains,
        expected.rules,
    )
    assert session.history.moves == tuple(expected.moves)
    assert session.steps == len(pure.outputs)
    if name == "scale-out":
        assert expected.moves  # the replay covered real decisions
    else:
        assert len(expected.failovers) == 150
