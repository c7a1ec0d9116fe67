"""The layers stay clean: the pure ones load no etcd client, no Spark, no shell.

Each check imports modules in a fresh interpreter (this process has loaded everything)
and lists what it loaded that it must not.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FORBIDDEN_BELOW_THE_SHELL = ("grpc", "aetcd", "pyspark", "ballast.cluster", "ballast.server")


def loaded(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({prefixes!r}))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    found: list[str] = json.loads(out.stdout)
    return found


@pytest.mark.parametrize("module", ["ballast.leader", "ballast.balance", "ballast.simulate.engine"])
def test_the_pure_layers_load_no_store_client_and_no_shell(module: str) -> None:
    assert loaded([module], FORBIDDEN_BELOW_THE_SHELL) == []


def test_the_live_leader_does_not_load_the_spark_pipeline() -> None:
    assert loaded(["ballast.cluster.load_manager"], ("ballast.pipeline", "pyspark")) == []


def test_the_stores_still_load_on_first_use() -> None:
    from ballast.metadata import EtcdStore, MemoryStore, open_store

    assert (EtcdStore.__module__, MemoryStore.__module__, open_store.__module__) == (
        "ballast.metadata.etcd",
        "ballast.metadata.memory",
        "ballast.metadata.factory",
    )
