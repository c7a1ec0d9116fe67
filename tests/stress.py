"""Run the whole suite several times under load and report every test that failed once.

    python -m tests.stress [--runs 5] [--hogs 1] [--workers 2] [-- PYTEST_ARGS...]

Each run is the suite as `make unit` runs it (`pytest -n WORKERS`) while HOGS processes
spin on the CPU beside it: on a small machine that is what exposes a test that races
instead of waiting on the event it means. Progress on stderr; one JSON document on stdout:
per run its exit code, seconds and failed tests, and every test that failed in any run
with the runs it failed in. Exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def _spin() -> None:
    while True:
        pass


def run_suite(workers: int, extra: list[str], log: Path) -> dict[str, Any]:
    """One run of the suite; its output goes to `log`."""
    started = time.monotonic()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra]
    if workers:
        command[3:3] = ["-n", str(workers), "--dist", "worksteal"]  # as `make unit`
    with log.open("w") as out:
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT)
    text = log.read_text()
    tail = text.strip().splitlines()[-1:] or [""]
    return {
        "exit_code": code,
        "seconds": round(time.monotonic() - started),
        "failed": sorted(set(FAILED.findall(text))),
        "summary": tail[0],
        "log": str(log),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of the whole suite")
    parser.add_argument("--hogs", type=int, default=1, help="CPU-spinning processes beside it")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (0: serial)")
    parser.add_argument("--logs", default="stress-logs", help="directory for each run's output")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args()
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    runs = []
    try:
        for n in range(1, args.runs + 1):
            result = run_suite(args.workers, args.pytest_args, logs / f"run{n}.log")
            runs.append(result)
            failed = ", ".join(result["failed"]) or "none failed"
            print(
                f"run {n}/{args.runs}: {result['summary']} ({result['seconds']} s); {failed}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        for hog in hogs:
            hog.terminate()
    flaky: dict[str, list[int]] = {}
    for n, result in enumerate(runs, 1):
        for test in result["failed"]:
            flaky.setdefault(test, []).append(n)
    print(json.dumps({"runs": runs, "hogs": args.hogs, "failed_tests": flaky}, indent=2))
    return 1 if any(r["exit_code"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
