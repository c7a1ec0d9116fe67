"""Fixtures for the control-plane tests: fast configurations and a store of each kind.

The etcd tests share one server (started once per session); every test begins by wiping
``/cluster/`` and ``/topics/``, since the key layout has no per-test prefix.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ballast.clock import SystemClock
from ballast.metadata import MetadataStore, keys
from ballast.metadata.etcd import EtcdStore
from ballast.metadata.memory import MemoryStore
from tests.etcd_fixtures import EtcdServer, etcd_server

__all__ = ["etcd_server"]


async def wipe(store: MetadataStore) -> None:
    """Remove every key the control plane uses."""
    for prefix in (keys.CLUSTER_PREFIX, keys.TOPICS_PREFIX):
        await store.delete_prefix(prefix)
    await store.delete(keys.OBJECT_STORE)  # each test has its own object store


@pytest.fixture(params=["memory", "etcd"])
async def store(
    request: pytest.FixtureRequest,
) -> AsyncIterator[MetadataStore]:
    """Each test runs on `MemoryStore` and on a real etcd (`EtcdStore`)."""
    if request.param == "memory":
        async with MemoryStore(SystemClock()) as memory:
            yield memory
        return
    server: EtcdServer = request.getfixturevalue("etcd_server")
    async with EtcdStore(server.client_url) as etcd:
        await wipe(etcd)
        yield etcd
        await wipe(etcd)


@pytest.fixture
async def etcd_store(etcd_server: EtcdServer) -> AsyncIterator[EtcdStore]:
    """A clean etcd store (for tests that only make sense on etcd)."""
    async with EtcdStore(etcd_server.client_url) as etcd:
        await wipe(etcd)
        yield etcd
        await wipe(etcd)
