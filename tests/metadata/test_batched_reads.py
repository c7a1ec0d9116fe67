"""`BatchedReads`: concurrent point reads share one `get_many`; a bad value or a cancelled
reader affects only its own readers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from ballast.metadata import MemoryStore, MetadataError, ValueDecodeError
from ballast.metadata.batched import BatchedReads


class Counting(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []
        self.gate: asyncio.Event | None = None

    async def get_many(self, keys: Sequence[str]) -> list[Any]:
        self.batches.append(list(keys))
        if self.gate is not None:
            await self.gate.wait()
        return await super().get_many(keys)


async def test_reads_of_the_moment_go_in_one_round_trip() -> None:
    store = Counting()
    for i in range(3):
        await store.put(f"/k{i}", i)
    reads = BatchedReads(store)
    found = await asyncio.gather(*(reads.get(f"/k{i}") for i in (0, 1, 2, 1)), reads.get("/none"))
    assert [kv.value if kv else None for kv in found] == [0, 1, 2, 1, None]
    assert store.batches == [["/k0", "/k1", "/k2", "/none"]]  # /k1 asked twice, read once
    assert (await reads.get("/k1")).value == 1  # type: ignore[union-attr]
    assert len(store.batches) == 2


async def test_a_slow_batch_holds_no_read_back_until_every_slot_is_busy() -> None:
    """A few batches go out at once (a read a client waits for does not queue behind a
    slow one); once they are all out, what is asked meanwhile goes together."""
    store = Counting()
    await store.put("/k", 1)
    reads = BatchedReads(store)
    store.gate = asyncio.Event()
    out = []
    for i in range(4):  # one at a time: each goes out on its own
        out.append(asyncio.ensure_future(reads.get(f"/slow/{i}")))
        await asyncio.sleep(0.01)
    assert len(store.batches) == 4
    waiting = []
    for key in ("/k", "/a", "/k"):  # every slot busy: these wait, and go together
        waiting.append(asyncio.ensure_future(reads.get(key)))
        await asyncio.sleep(0.01)
    assert len(store.batches) == 4
    store.gate.set()
    assert await asyncio.gather(*out) == [None] * 4
    assert [kv.value if kv else None for kv in await asyncio.gather(*waiting)] == [1, None, 1]
    assert store.batches[4:] == [["/k", "/a"]]


async def test_more_keys_than_one_transaction_go_in_several() -> None:
    store = Counting()
    reads = BatchedReads(store)
    assert await asyncio.gather(*(reads.get(f"/many/{i}") for i in range(300))) == [None] * 300
    assert [len(b) for b in store.batches] == [128, 128, 44]


async def test_a_value_that_is_not_json_fails_its_own_readers_only() -> None:
    store = Counting()
    await store.put("/good", "yes")
    await store.put_raw("/bad", b"\x00not json")
    reads = BatchedReads(store)
    good, bad = await asyncio.gather(reads.get("/good"), reads.get("/bad"), return_exceptions=True)
    assert good.value == "yes"  # type: ignore[union-attr]
    assert isinstance(bad, ValueDecodeError) and bad.key == "/bad"


async def test_a_cancelled_reader_leaves_the_others_their_answer() -> None:
    store = Counting()
    await store.put("/k", 1)
    reads = BatchedReads(store)
    store.gate = asyncio.Event()
    gone = asyncio.ensure_future(reads.get("/k"))
    kept = asyncio.ensure_future(reads.get("/k"))
    await asyncio.sleep(0.01)
    gone.cancel()
    store.gate.set()
    assert (await kept).value == 1  # type: ignore[union-attr]
    assert gone.cancelled()


async def test_the_stores_failure_is_every_readers() -> None:
    store = Counting()
    reads = BatchedReads(store)
    await store.close()
    results = await asyncio.gather(reads.get("/a"), reads.get("/b"), return_exceptions=True)
    assert all(isinstance(r, MetadataError) for r in results)
    with pytest.raises(MetadataError):
        await reads.get("/c")
