"""The simulator and the live leader make the same decisions.

The simulator drives `LeaderMachine` on a simulated store and brokers and records every
event it feeds it; the same events replayed into the machine of a live `LeaderSession`
(built exactly as when a broker is elected) give the same effects, write for write, and
hence the same moves and failover placements.
"""

from __future__ import annotations

import pytest

from ballast.clock import FakeClock
from ballast.cluster.election import LeaderElection, Term
from ballast.cluster.load_manager import LeaderSession, LoadManager
from ballast.config import BallastConfig
from ballast.leader import effects_text
from ballast.metadata.memory import MemoryStore
from ballast.simulate.engine import EPOCH, LEADER, Simulator
from ballast.simulate.scenario import load_scenario


@pytest.mark.parametrize("name", ["scale-out", "broker-failure"])
async def test_simulator_and_a_replay_into_the_live_leader_decide_alike(name: str) -> None:
    scenario = load_scenario(name, {"duration_hours": 4})
    sim = Simulator(scenario)
    result = sim.run()
    assert len(sim.inputs) == len(sim.outputs)

    clock = FakeClock(EPOCH)
    config = BallastConfig(load_manager=scenario.load_manager)
    async with MemoryStore(clock) as store:
        election = LeaderElection(store, clock, LEADER, 10.0)
        manager = LoadManager(
            store, clock, config, election, rankings_interval=scenario.sample_every_seconds
        )
        session = LeaderSession(manager, Term(LEADER, 1, EPOCH))
        for i, (event, expected) in enumerate(zip(sim.inputs, sim.outputs, strict=True)):
            got = session.machine.step(event)
            assert effects_text(got) == effects_text(expected), f"step {i}: {event!r}"
            assert (got.decision, got.moved) == (expected.decision, expected.moved), f"step {i}"

    assert session.history.moves == tuple(result.moves)
    if name == "scale-out":
        assert result.moves  # the replay covered real decisions
    else:
        assert len(result.failovers) == 150
