"""Shared fixtures of the storage tests: real stores, a fake clock, small limits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ballast.clock import FakeClock
from ballast.metadata import MemoryStore
from ballast.storage import FsspecObjectStore, StorageConfig


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def metadata(clock: FakeClock) -> AsyncIterator[MemoryStore]:
    async with MemoryStore(clock) as store:
        yield store


@pytest.fixture
def object_store(tmp_path: Path) -> FsspecObjectStore:
    return FsspecObjectStore(str(tmp_path / "objects"))


@pytest.fixture
def config() -> StorageConfig:
    # Small sizes so that rolls, multi-object uploads and sparse indexes all happen.
    return StorageConfig(
        segment_bytes=1024,
        cache_messages=16,
        index_interval_bytes=512,
        read_batch_bytes=2048,
        max_object_bytes=2048,
        upload_threshold_bytes=1 << 20,
        upload_retry_initial_seconds=0.001,
        upload_retry_max_seconds=0.01,
        retention_seconds=60.0,
    )


@pytest.fixture
def kw(
    object_store: FsspecObjectStore, metadata: MemoryStore, clock: FakeClock, config: StorageConfig
) -> dict[str, Any]:
    """What every `ReliableTopic` of a test shares (`make_topic(..., **kw)`)."""
    return {"objects": object_store, "metadata": metadata, "clock": clock, "config": config}
