"""Fixtures of the data-plane tests: a clean real etcd store and a data-plane cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ballast.metadata.etcd import EtcdStore
from tests.etcd_fixtures import EtcdServer, etcd_server
from tests.server.helpers import DataCluster, data_config, wipe

__all__ = ["etcd_server"]


@pytest.fixture
async def etcd_store(etcd_server: EtcdServer) -> AsyncIterator[EtcdStore]:
    """A clean etcd store."""
    async with EtcdStore(etcd_server.client_url) as store:
        await wipe(store)
        yield store
        await wipe(store)


@pytest.fixture
async def cluster(etcd_store: EtcdStore, tmp_path: Path) -> AsyncIterator[DataCluster]:
    """One data-plane broker (``b1``); tests may start more."""
    async with DataCluster(etcd_store, data_config(tmp_path)) as c:
        await c.start_broker("b1")
        yield c
