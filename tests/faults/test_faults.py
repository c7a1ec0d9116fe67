"""The short fault-injection suite of ``make test``: one run of the cases that lost
acknowledged messages before acknowledgements waited for object storage (``make faults``
runs every case ten times). See `tests.faults.harness` for the set-up and the checker."""

from __future__ import annotations

import pytest

from tests.faults.harness import run_case

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
