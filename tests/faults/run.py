"""Run the fault-injection cases N times each and print JSON (``make faults``).

    python -m tests.faults.run [--runs 10] [--cases a,b]

Per case: runs, acknowledged, lost, conflicts, duplicates, the longest producer and
consumer pause (max over runs) and the failed runs' details; for a case with a
time-to-flowing bound (the gray failures), the longest time to flowing and in how many
runs it stayed within the bound; any figure a case measures (e.g. new_leader_s), max.
Exits 1 if anything acknowledged was lost (or an offset carried two payloads) in any run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from tests.faults.harness import CASES, Outcome, run_case


def summary(outcomes: list[Outcome], bound: float | None = None) -> dict[str, Any]:
    measures = sorted({key for o in outcomes for key in o.measures})
    return {
        "runs": len(outcomes),
        "acknowledged": sum(o.acknowledged for o in outcomes),
        "lost": sum(o.lost for o in outcomes),
        "conflicts": sum(o.conflicts for o in outcomes),
        "reordered": sum(o.reordered for o in outcomes),
        "duplicates": sum(o.duplicates for o in outcomes),
        "send_errors": sum(o.send_errors for o in outcomes),
        "producer_pause_max_s": max((o.producer_pause_s for o in outcomes), default=0.0),
        "consumer_pause_max_s": max((o.consumer_pause_s for o in outcomes), default=0.0),
        "failover_max_s": max((o.failover_s for o in outcomes), default=0.0),
        **(
            {
                "flowing_max_s": max((o.flowing_s for o in outcomes), default=0.0),
                "flowing_bound_s": bound,
                "flowing_within_bound": sum(o.flowing_s <= bound for o in outcomes),
            }
            if bound is not None
            else {}
        ),
        **{
            f"{key}_max": max((o.measures.get(key, 0.0) for o in outcomes), default=0.0)
            for key in measures
        },
        "failed_runs": [
            {"lost": o.lost, "conflicts": o.conflicts, "examples": o.lost_examples}
            for o in outcomes
            if not o.ok
        ],
    }


async def main_async(cases: list[str], runs: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for case in cases:
        outcomes: list[Outcome] = []
        for n in range(runs):
            started = time.monotonic()
            try:
                outcome = await run_case(case)
            except Exception as exc:  # a harness failure is reported, not hidden
                print(f"{case} run {n + 1}: harness error: {exc!r}", file=sys.stderr, flush=True)
                outcome = Outcome(case, lost=-1, lost_examples=[repr(exc)])
            outcomes.append(outcome)
            print(
                f"{case} run {n + 1}/{runs}: acknowledged {outcome.acknowledged}, lost "
                f"{outcome.lost}, duplicates {outcome.duplicates}, pauses "
                f"{outcome.producer_pause_s}s/{outcome.consumer_pause_s}s"
                + (
                    f", flowing {outcome.flowing_s}s"
                    if CASES[case].flowing_bound_s is not None
                    else ""
                )
                + "".join(f", {k} {v}s" for k, v in outcome.measures.items())
                + " "
                f"({time.monotonic() - started:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
        results[case] = summary(outcomes, CASES[case].flowing_bound_s)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10, help="runs per case (default 10)")
    parser.add_argument(
        "--cases", default="all", help=f"comma-separated cases, or all: {', '.join(CASES)}"
    )
    args = parser.parse_args()
    cases = list(CASES) if args.cases == "all" else args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    results = asyncio.run(main_async(cases, args.runs))
    print(json.dumps(results, indent=2))
    if any(r["lost"] != 0 or r["conflicts"] != 0 for r in results.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
