"""The layers stay clean: the pure ones load no etcd client, no Spark, no shell; the data
plane decodes records without the leader; no module imports itself through another.

Each check imports modules in a fresh interpreter (this process has loaded everything)
and lists what it loaded that it must not.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

FORBIDDEN_BELOW_THE_SHELL = (
    "grpc",
    "aetcd",
    "pyspark",
    "ballast.cluster",
    "ballast.broker",
    "ballast.gateway",
    "ballast.wire",
)


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


def test_the_data_plane_decodes_records_without_the_leader() -> None:
    modules = ["ballast.metadata.records", "ballast.gateway.gateway", "ballast.broker.service"]
    assert loaded(modules, ("ballast.leader", "ballast.balance")) == []


def test_the_stores_still_load_on_first_use() -> None:
    from ballast.metadata import EtcdStore, MemoryStore, open_store

    assert (EtcdStore.__module__, MemoryStore.__module__, open_store.__module__) == (
        "ballast.metadata.etcd",
        "ballast.metadata.memory",
        "ballast.metadata.factory",
    )


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, function-local imports included (they hide cycles),
    `if TYPE_CHECKING:` blocks excluded (they never run)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def test_no_module_imports_itself_through_another() -> None:
    root = Path(__file__).resolve().parents[2] / "src"
    modules = {}
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph = {m: {t for t in imports_of(p) if t in modules and t != m} for m, p in modules.items()}
    cycles = []
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        # Depth-first; a module met again on the current path closes a cycle.
        for target in sorted(graph[module]):
            if target in path:
                cycles.append(" -> ".join((*path[path.index(target) :], target)))
            elif target not in done:
                visit(target, (*path, target))
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, (module,))
    assert cycles == []


SHELLS = ("ballast.cluster", "ballast.cli", "ballast.console")
# What each process's package must not import (its `__init__` says why).
PACKAGE_RULES = {
    "wire": ("ballast.broker", "ballast.gateway", "ballast.registry", *SHELLS),
    "registry": ("ballast.broker", "ballast.gateway", *SHELLS),
    "gateway": ("ballast.broker", "ballast.registry", *SHELLS),
    "broker": ("ballast.gateway", *SHELLS),
}


@pytest.mark.parametrize("package", sorted(PACKAGE_RULES))
def test_each_process_package_imports_only_what_its_docstring_allows(package: str) -> None:
    root = Path(__file__).resolve().parents[2] / "src" / "ballast" / package
    found = {
        f"{path.name}: {target}"
        for path in root.glob("*.py")
        for target in imports_of(path)
        if target.startswith(PACKAGE_RULES[package])
    }
    assert sorted(found) == []
