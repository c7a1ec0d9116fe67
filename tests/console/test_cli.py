"""`ballast console` as an operator runs it: a process on a real etcd, stopped by SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request

import pytest
from typer.testing import CliRunner

from ballast.cli.main import app
from tests.etcd_fixtures import EtcdServer

pytestmark = pytest.mark.timeout(60)


def test_console_serves_the_api_and_stops_cleanly_on_sigterm(etcd_server: EtcdServer) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ballast.cli.main", "console", "--etcd", etcd_server.client_url,
         "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()
        assert line.startswith("CONSOLE-STARTED http://127.0.0.1:"), line
        url = line.split()[1]
        with urllib.request.urlopen(f"{url}/api/summary", timeout=5) as resp:
            summary = json.loads(resp.read())
        assert {"brokers", "topics", "leader", "balance"} <= set(summary)
        with urllib.request.urlopen(f"{url}/", timeout=5) as resp:
            assert b"Ballast console" in resp.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_console_refuses_a_bad_listen_address() -> None:
    result = CliRunner().invoke(app, ["console", "--listen", "8080"])
    assert result.exit_code == 2
    assert "--listen '8080': expected HOST:PORT" in result.output


def test_console_help_explains_the_pages_and_the_api() -> None:
    result = CliRunner().invoke(app, ["console", "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0
    for phrase in ("live cluster view", "dry-run plan", "/openapi.json", "Bearer", "http_sd"):
        assert phrase in result.output
