"""Fixtures for the metadata tests: a store of each kind and a private key prefix per test."""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

# tests/ is not a package; make the shared etcd helpers importable from here.
_TESTS_DIR = str(Path(__file__).resolve().parents[1])
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from core_store import CoreStore  # noqa: E402
from etcd_fixtures import (  # noqa: E402
    EtcdServer,
    etcd_cluster,
    etcd_server,
    fresh_etcd_server,
)

from ballast.metadata import EtcdStore, MemoryStore  # noqa: E402

__all__ = ["etcd_cluster", "etcd_server", "fresh_etcd_server"]


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses (tests share one etcd server)."""
    return f"/test-{uuid.uuid4().hex[:12]}/"


@pytest.fixture(params=["memory", "core", "etcd"])
async def store(
    request: pytest.FixtureRequest, etcd_server: EtcdServer
) -> AsyncIterator[MemoryStore | CoreStore | EtcdStore]:
    """Each contract test runs against `MemoryStore`, its synchronous core (the
    simulator's store) and `EtcdStore`."""
    s: MemoryStore | CoreStore | EtcdStore
    if request.param == "memory":
        s = MemoryStore()
    elif request.param == "core":
        s = CoreStore()
    else:
        s = EtcdStore(etcd_server.client_url, timeout=5)
    async with s:
        yield s


@pytest.fixture
async def etcd_store(etcd_server: EtcdServer) -> AsyncIterator[EtcdStore]:
    """An `EtcdStore` on the shared session server."""
    async with EtcdStore(etcd_server.client_url, timeout=5) as s:
        yield s
