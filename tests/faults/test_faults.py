"""The short fault-injection suite of ``make test``: one run of the cases that lost
acknowledged messages before acknowledgements waited for object storage, and of the gray
failure that made clients wait for an owner they could not reach (``make faults`` runs
every case ten times). See `tests.faults.harness` for the set-up and the checker."""

from __future__ import annotations

import pytest

from tests.faults.harness import CASES, run_case

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "case",
    [
        "sigkill_host_lost",
        "zombie_above_ttl",
        "unload_during_stall",
        "object_store_outage",
        "crash_before_commit",
        "crash_before_shared_commit",
    ],
)
async def test_acknowledged_means_kept(case: str) -> None:
    outcome = await run_case(case)
    assert outcome.acknowledged > 100, outcome  # the fault happened under real traffic
    assert outcome.lost == 0, outcome.lost_examples
    assert outcome.conflicts == 0 and outcome.reordered == 0, outcome


async def test_an_owner_the_gateway_cannot_reach_is_not_waited_for() -> None:
    """Network namespaces: only the gateway's (and the other brokers') path to the owner
    drops every packet, while the owner keeps its lease in etcd. The gateway notices the
    silence (keepalive), reports it, the leader drains the owner: clients flow again
    within the registration TTL + 5 s, nothing acknowledged is lost."""
    case = "blackhole_gateway_path"
    outcome = await run_case(case)
    assert outcome.acknowledged > 100, outcome
    assert outcome.lost == 0, outcome.lost_examples
    assert outcome.conflicts == 0 and outcome.reordered == 0, outcome
    bound = CASES[case].flowing_bound_s
    assert bound is not None and outcome.flowing_s <= bound, outcome
