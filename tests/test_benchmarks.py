"""Every benchmark runs: ``benchmarks/bench_*.py --quick`` in a subprocess, as `make bench`
runs them at full size.

A run passes when it exits 0 and prints one JSON document on stdout holding the keys its
entry in `EXPECTED` names. The benchmarks are found by glob: a new one fails here until
`EXPECTED` says what it reports. The figures themselves are not checked: a quick run on a
machine shared with the rest of the suite measures nothing, it only proves the code runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("bench_*.py"))
# A quick run takes seconds to ~40 s on the loaded 2-core test machine; beyond this it hangs.
QUICK_TIMEOUT = 150
# On a timeout the benchmark gets SIGINT (its `finally` blocks stop its brokers and etcd),
# then, this much later, its whole process group SIGKILL.
GRACE = 15

# Per benchmark, what its report must hold: dotted paths (a digit indexes a list).
EXPECTED: dict[str, tuple[str, ...]] = {
    "bench_acks_moves": ("messages", "moves", "duplicates_per_1000", "duplicates_of_acked", "lost"),
    "bench_cluster": ("benchmark", "memory/6.assignment", "etcd/6.failover"),
    "bench_console": ("api.cluster_view.p99_ms", "api.topic_page", "browser", "frame_compute_ms"),
    "bench_core": ("benchmark", "seconds", "by_strategy.fair"),
    "bench_dataplane": (
        "ceiling_msg_per_s.32",
        "schema_validation_32_producers.validation_cost",
        "reliable.32.msg_per_s",
        "end_to_end.reliable.p99_ms",
        "ack_modes.s3.local.32",
        "ack_modes.directory.durable_share_of_local_32",
        "moves.lost",
        "goals_32_producers",
        "broker_cpu_us_per_message",
        "gateway_cpu_us_per_message",
    ),
    "bench_failover": (
        "gateway_overhead.overhead_msg_per_s_percent",
        "gateway_overhead.relay_unary",
        "failover.recovered_topics",
        "failover.traffic.lost",
    ),
    "bench_grpc_floor": (
        "calls_per_s",
        "server_cpu_us_per_call",
        "caller_cpu_us_per_call",
        "servers.wire.server_cpu_us_per_call",
        "servers.ngh2.server_cpu_us_per_call",
        "servers.h2.server_cpu_us_per_call",
    ),
    "bench_metadata": ("memory.put_per_s_concurrent_64", "etcd.watch_latency_ms_p99"),
    "bench_moves": (
        "move_producer_pause_p99_s",
        "unload_consumer_pause_p99_s",
        "failover_flowing_after_reassignment_p99_s",
        "lost",
        "gateway_overhead_percent",
        "details.moves_and_kills",
    ),
    # --quick skips Spark (see its docstring): the pandas side only.
    "bench_pipeline": (
        "benchmark",
        "results.0.topic_rows",
        "results.0.pandas.seconds",
        "tuning.configurations",
        "tuning.in_process_configurations_per_minute",
    ),
    # --quick skips Spark (see its docstring): the local engine only.
    "bench_replicas": ("benchmark", "local.replica_moves", "local.lower_bound"),
    "bench_shedding": ("core.threshold.median_ms", "from_snapshot_threshold.moves"),
    "bench_topics": (
        "idle_after.open_fds",
        "etcd_keys_per_topic",
        "open.per_topic_p99_ms",
        "reliable.32_topics_32.broker_cpu_us_per_message",
        "active_topics.32.object_writes_per_s",
        "goals",
    ),
    "bench_storage": (
        "append.0.msgs_per_s",
        "tiered_read.wal",
        "tiered_read.object_storage",
        "seal.local",
    ),
}


def lookup(report: Any, path: str) -> Any:
    """The value at dotted `path` in `report`; KeyError naming the path when absent."""
    value = report
    for part in path.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise KeyError(f"{path!r}: no {part!r} in {json.dumps(value)[:300]}")
    return value


def run_quick(script: Path) -> subprocess.CompletedProcess[str]:
    """`script --quick`, its own process group (so nothing it started outlives a timeout)."""
    proc = subprocess.Popen(
        [sys.executable, str(script), "--quick"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=QUICK_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=GRACE)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        pytest.fail(
            f"{script.name} --quick ran over {QUICK_TIMEOUT} s; stderr ends:\n{stderr[-3000:]}"
        )
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_every_expected_entry_is_a_benchmark() -> None:
    stale = sorted(set(EXPECTED) - {p.stem for p in BENCHMARKS})
    assert not stale, f"EXPECTED names benchmarks that are gone: {stale}"


@pytest.mark.timeout(QUICK_TIMEOUT + GRACE + 30)
@pytest.mark.parametrize("script", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_quick_run(script: Path) -> None:
    expected = EXPECTED.get(script.stem)
    assert expected, f"{script.name} is not in EXPECTED: add the keys its --quick report must hold"
    result = run_quick(script)
    assert result.returncode == 0, (
        f"{script.name} --quick exited {result.returncode}; stderr ends:\n{result.stderr[-3000:]}"
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        pytest.fail(
            f"{script.name} --quick printed no JSON document ({exc}):\n{result.stdout[-2000:]}"
        )
    assert isinstance(report, dict), f"{script.name}: the report is not an object"
    for path in expected:
        lookup(report, path)
