"""The shipped Grafana dashboard against a real Prometheus (Debian's `prometheus`) scraping
real broker processes on a real etcd, discovered through `ballast admin prometheus-targets`:
every series a dashboard panel queries exists."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ballast.cli.main import app
from ballast.clock import SystemClock
from ballast.cluster import AdminClient
from ballast.metadata import keys
from ballast.metadata.etcd import EtcdStore
from tests.cluster.conftest import wipe
from tests.etcd_fixtures import EtcdServer, free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
METRIC = re.compile(r"\bballast_[a-z0-9_]+")

pytestmark = [
    pytest.mark.timeout(90),
]


def dashboard_metrics() -> set[str]:
    """Every ``ballast_*`` series name the dashboard's queries use."""
    text = (resources.files("ballast.console") / "grafana" / "ballast-dashboard.json").read_text()
    names: set[str] = set()
    for panel in json.loads(text)["panels"]:
        for target in panel.get("targets", []):
            names.update(METRIC.findall(target["expr"]))
    return names


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@contextlib.contextmanager
def brokers(etcd_url: str, tmp: Path, ids: tuple[str, ...]) -> Iterator[dict[str, int]]:
    """Broker processes with the data plane and a metrics port each; killed on exit."""
    procs: list[subprocess.Popen[bytes]] = []
    ports = {b: free_port() for b in ids}
    try:
        for broker, port in ports.items():
            config = tmp / f"{broker}.yaml"
            config.write_text(
                yaml.safe_dump(
                    {
                        "load_manager": {"load_report_interval_seconds": 0.3},
                        "broker": {
                            "registration_ttl_seconds": 5,
                            "leader_ttl_seconds": 5,
                            "broker_url": "127.0.0.1:0",
                        },
                        "history": {"enabled": False},
                        "metrics": {"enabled": True, "port": port},
                        "storage": {"data_dir": str(tmp / "data")},
                    }
                )
            )
            proc = subprocess.Popen(
                [sys.executable, "-m", "ballast.cluster.run", "--etcd", etcd_url,
                 "--config", str(config), "--id", broker, "--log-level", "WARNING"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp,
            )  # fmt: skip
            procs.append(proc)
        for proc, broker in zip(procs, ids, strict=True):
            assert proc.stdout is not None
            line = proc.stdout.readline().decode().strip()
            assert line == f"BROKER-STARTED {broker}", f"broker {broker}: {line!r}"
        yield ports
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def prometheus(tmp: Path, targets: Path) -> Iterator[str]:
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "ballast",
                        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
                    }
                ],
            }
        )
    )
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _get(f"{url}/-/ready") is not None, 20, "prometheus ready")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            body = resp.read()
    except OSError:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        time.sleep(0.2)


def series_missing(url: str, names: set[str]) -> set[str]:
    missing = set()
    for name in sorted(names):
        query = urllib.parse.urlencode({"match[]": f'{{__name__="{name}"}}'})
        answer = _get(f"{url}/api/v1/series?{query}")
        if not answer or not answer.get("data"):
            missing.add(name)
    return missing


def test_every_series_the_dashboard_queries_exists(etcd_server: EtcdServer, tmp_path: Path) -> None:
    names = dashboard_metrics()
    assert len(names) >= 20  # balance, moves, failures, assignments, load, data plane

    async def clean() -> None:
        async with EtcdStore(etcd_server.client_url) as store:
            await wipe(store)

    run(clean())
    with brokers(etcd_server.client_url, tmp_path, ("m1", "m2")) as ports:

        async def activity() -> None:
            async with EtcdStore(etcd_server.client_url) as store:
                admin = AdminClient(store, SystemClock())
                await admin.create_topics(f"/default/m{i}" for i in range(6))
                # A report that does not match its key: the leader rejects and counts it.
                await store.put(keys.load("m9"), {"broker_id": "m1", "timestamp": 1.0})

        run(activity())
        targets = tmp_path / "targets.json"
        result = CliRunner().invoke(
            app,
            ["admin", "prometheus-targets", "--etcd", etcd_server.client_url, "-o", str(targets)],
        )
        assert result.exit_code == 0, result.output
        groups = json.loads(targets.read_text())
        assert sorted(g["targets"][0] for g in groups) == sorted(
            f"127.0.0.1:{p}" for p in ports.values()
        )
        assert {g["labels"]["broker"] for g in groups} == {"m1", "m2"}
        with prometheus(tmp_path, targets) as url:
            missing: set[str] = set(names)

            def all_there() -> bool:
                nonlocal missing
                missing = series_missing(url, missing)
                return not missing

            try:
                wait_for(all_there, 30, "every dashboard series in Prometheus")
            except AssertionError:
                pytest.fail(f"series the dashboard queries but Prometheus lacks: {missing}")

            def both_up() -> bool:
                up = _get(f"{url}/api/v1/query?query=up")
                results = up["data"]["result"] if up else []
                return sorted(r["metric"]["broker"] for r in results if r["value"][1] == "1") == [
                    "m1",
                    "m2",
                ]

            wait_for(both_up, 10, "both brokers scraped (up == 1)")
    run(clean())
