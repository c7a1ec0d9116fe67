"""Brokers refuse an object store that the cluster's other brokers cannot read."""

from __future__ import annotations

from pathlib import Path

import pytest

from ballast.clock import FakeClock
from ballast.metadata import MemoryStore, keys
from ballast.storage import (
    FsspecObjectStore,
    ObjectStoreMismatchError,
    verify_shared_object_store,
)

from .helpers import FlakyObjectStore


async def test_the_first_broker_records_the_store_and_the_others_must_read_its_probe(
    tmp_path: Path, metadata: MemoryStore, clock: FakeClock
) -> None:
    shared = FsspecObjectStore(str(tmp_path / "shared"))
    await verify_shared_object_store(metadata, shared, "b1", clock)
    record = await metadata.get(keys.OBJECT_STORE)
    assert record is not None and record.value["broker_id"] == "b1"
    assert record.value["url"].startswith(str((tmp_path / "shared").resolve()))
    # The same directory, opened by another broker: fine (and nothing is rewritten).
    await verify_shared_object_store(
        metadata, FsspecObjectStore(str(tmp_path / "shared")), "b2", clock
    )
    assert (await metadata.get(keys.OBJECT_STORE)) == record
    # Another directory (another host's default): refused, naming both and the setting.
    other = FsspecObjectStore(str(tmp_path / "b3" / "objects"))
    with pytest.raises(ObjectStoreMismatchError) as refused:
        await verify_shared_object_store(metadata, other, "b3", clock)
    message = str(refused.value)
    assert f"broker b3: its object store {(tmp_path / 'b3' / 'objects').resolve()}" in message
    assert f"cluster's object store {(tmp_path / 'shared').resolve()}" in message
    assert "first used by broker b1" in message and "storage.object_store" in message


async def test_an_unreachable_store_is_refused_with_its_error(
    tmp_path: Path, metadata: MemoryStore, clock: FakeClock
) -> None:
    down = FlakyObjectStore(FsspecObjectStore(str(tmp_path / "s")), fail_puts=10)
    with pytest.raises(ObjectStoreMismatchError, match="cannot write a probe to the object store"):
        await verify_shared_object_store(metadata, down, "b1", clock)
    assert await metadata.get(keys.OBJECT_STORE) is None


async def test_a_malformed_record_names_the_key(
    tmp_path: Path, metadata: MemoryStore, clock: FakeClock
) -> None:
    await metadata.put(keys.OBJECT_STORE, {"url": 3})
    with pytest.raises(ObjectStoreMismatchError, match="/storage/object_store: malformed"):
        await verify_shared_object_store(
            metadata, FsspecObjectStore(str(tmp_path / "s")), "b1", clock
        )
