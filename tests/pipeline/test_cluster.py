"""The job on a real standalone Spark cluster gives the same tables as local[2].

A master and a worker are started from the installed pyspark (`bin/spark-class`) and the
job runs in a subprocess, since one Python process holds only one SparkContext. The
history is small (three brokers, an hour and a half of one-minute reports): the point is
that `--master` gives identical results, compaction included, not speed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from pyspark.find_spark_home import _find_spark_home
from pyspark.sql import SparkSession

from ballast.pipeline.generate import GeneratorSpec, generate_history
from ballast.pipeline.job import TABLES, AnalyzeOptions, run_analysis

KEYS = {
    "broker_windows": ["window_start", "broker_id"],
    "topic_windows": ["window_start", "topic"],
    "strategy_comparison": ["window_start", "strategy"],
    "quarantine": ["source", "kind", "raw"],
}
COLUMNAR_KEYS = {
    "topics": ["broker_id", "timestamp", "topic"],
    "brokers": ["broker_id", "timestamp"],
    "quarantine": ["source", "kind", "raw"],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(
    port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Spark daemon exited early:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"Spark daemon did not listen on {port}:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    spark_class = os.path.join(_find_spark_home(), "bin", "spark-class")
    logs = tmp_path_factory.mktemp("spark-logs")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    port = _free_port()
    started: list[subprocess.Popen[bytes]] = []
    try:
        master_log = logs / "master.log"
        master = subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                "0",
            ],
            stdout=master_log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        started.append(master)
        _wait_for_port(port, master, master_log)
        url = f"spark://127.0.0.1:{port}"
        worker_log = logs / "worker.log"
        started.append(
            subprocess.Popen(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "2",
                    "--memory",
                    "1g",
                    "--webui-port",
                    "0",
                    "--work-dir",
                    str(logs / "work"),
                ],
                stdout=worker_log.open("wb"),
                stderr=subprocess.STDOUT,
                env=env,
            )
        )
        deadline = time.monotonic() + 60
        while "Successfully registered with master" not in worker_log.read_text():
            if time.monotonic() > deadline or started[-1].poll() is not None:
                raise RuntimeError(f"worker did not register:\n{worker_log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield url
    finally:
        for process in reversed(started):
            process.terminate()
        for process in reversed(started):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# Cold JVMs (a worker's executor, the driver of the subprocess) dominate on a loaded
# 2-core machine: allow more than the suite's default 300 s.
@pytest.mark.timeout(900)
def test_standalone_cluster_matches_local(
    spark: SparkSession, standalone: str, tmp_path: Path
) -> None:
    history = tmp_path / "history"
    spec = GeneratorSpec(brokers=3, topics=12, hours=1.5, seed=11, interval_seconds=60)
    result = generate_history(spec, str(history))
    # Something for the quarantine too: a sink retry and a crash-truncated line.
    first = Path(result.files[0])
    lines = first.read_text().splitlines()
    first.write_text("\n".join([*lines, lines[3], lines[4][:50]]) + "\n")
    # The cluster compacts its own copy: compaction runs on the cluster too.
    cluster_history = tmp_path / "cluster-history"
    shutil.copytree(history, cluster_history)

    # The cluster's job runs while this process runs the same job on local[2]: most of
    # either is waiting (JVM start-up, scheduling), so together they cost little more
    # than the longer one.
    cluster_out = tmp_path / "cluster"
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ballast.cli.pipeline",
            "analyze",
            "--history",
            str(cluster_history),
            "--out",
            str(cluster_out),
            "--master",
            standalone,
            "--driver-memory",
            "1g",
            "--executor-memory",
            "512m",
            "--shuffle-partitions",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        local_out = tmp_path / "local"
        run_analysis(spark, AnalyzeOptions(history=str(history), out=str(local_out)))
        stdout, stderr = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, stderr[-3000:] + stdout[-3000:]
    assert "2 record(s) quarantined" in " ".join(stdout.split())

    for table in TABLES:
        local = pd.read_parquet(local_out / table).sort_values(KEYS[table]).reset_index(drop=True)
        cluster = (
            pd.read_parquet(cluster_out / table).sort_values(KEYS[table]).reset_index(drop=True)
        )
        assert len(local) > 0, table
        # Sums may be added in another order on other partitions: equal to 1e-9.
        pd.testing.assert_frame_equal(local, cluster, check_exact=False, rtol=1e-9, atol=1e-12)
    for table, keys in COLUMNAR_KEYS.items():
        local = pd.read_parquet(history / "_columnar" / table).sort_values(keys)
        cluster = pd.read_parquet(cluster_history / "_columnar" / table).sort_values(keys)
        assert len(local) > 0, table
        pd.testing.assert_frame_equal(
            local.drop(columns=["report_id"], errors="ignore").reset_index(drop=True),
            cluster.drop(columns=["report_id"], errors="ignore").reset_index(drop=True),
            check_exact=True,  # the same floats: totals are added in list order on both
        )
    local_plan = json.loads((local_out / "plan.json").read_text())
    cluster_plan = json.loads((cluster_out / "plan.json").read_text())
    assert local_plan["plan"]["moves"] == cluster_plan["plan"]["moves"]
    assert local_plan["plan"]["after"]["cv"] == pytest.approx(
        cluster_plan["plan"]["after"]["cv"], rel=1e-9
    )
