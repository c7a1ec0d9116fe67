"""The object format (sans-I/O) and the fsspec object store on a local directory."""

from __future__ import annotations

import pytest

from ballast.storage import (
    CorruptObjectError,
    FsspecObjectStore,
    ObjectBuilder,
    ObjectNotFoundError,
    Record,
    read_object,
)
from ballast.storage.objects import FOOTER_SIZE, HEADER_MAGIC, ObjectFooter, ObjectIndex

from .helpers import payload


def build(start: int, count: int, *, interval: int = 256, size: int = 40) -> bytes:
    builder = ObjectBuilder(index_interval_bytes=interval)
    for offset in range(start, start + count):
        builder.add(Record(offset, 1.0, payload(offset).ljust(size, b".")))
    assert (builder.start, builder.end, builder.count) == (start, start + count - 1, count)
    return builder.finish()


def test_footer_and_index_describe_the_object() -> None:
    data = build(100, 50)
    assert data.startswith(HEADER_MAGIC)
    footer = ObjectFooter.parse(data[-FOOTER_SIZE:])
    assert (footer.start, footer.end) == (100, 149)
    index = ObjectIndex.parse(
        data[footer.index_position : footer.index_position + footer.index_size], footer
    )
    assert index.offsets[0] == 100 and len(index.offsets) > 3  # sparse: every ~256 bytes
    assert index.position_for(100) == len(HEADER_MAGIC)
    assert index.position_for(149) >= index.position_for(120) >= index.position_for(100)


def test_builder_refuses_gaps_and_empty_objects() -> None:
    builder = ObjectBuilder()
    with pytest.raises(ValueError, match="at least one"):
        builder.finish()
    builder.add(Record(5, 0.0, b"a"))
    with pytest.raises(ValueError, match="contiguous"):
        builder.add(Record(7, 0.0, b"b"))


def test_damaged_footer_is_detected() -> None:
    data = bytearray(build(0, 5))
    data[-FOOTER_SIZE + 2] ^= 0x01
    with pytest.raises(CorruptObjectError, match="footer CRC"):
        ObjectFooter.parse(bytes(data[-FOOTER_SIZE:]))
    with pytest.raises(CorruptObjectError, match="magic"):
        ObjectFooter.parse(bytes(data[-FOOTER_SIZE:-8]) + b"XXXXXXXX")


@pytest.mark.parametrize("chunk_size", [64, 1 << 20])  # range requests, then one whole read
@pytest.mark.parametrize("from_offset", [0, 1, 37, 99, 150])
async def test_read_object_from_any_offset(
    object_store: FsspecObjectStore, chunk_size: int, from_offset: int
) -> None:
    data = build(0, 100)
    await object_store.put("ns/t/obj", data)
    records = [
        r
        async for r in read_object(
            object_store, "ns/t/obj", len(data), from_offset, chunk_size=chunk_size
        )
    ]
    assert [r.offset for r in records] == list(range(from_offset, 100))
    assert all(r.payload.startswith(payload(r.offset)) for r in records)


async def test_read_object_detects_a_flipped_bit(object_store: FsspecObjectStore) -> None:
    data = bytearray(build(0, 20))
    data[len(HEADER_MAGIC) + 30] ^= 0x10
    await object_store.put("bad", bytes(data))
    with pytest.raises(CorruptObjectError, match="CRC"):
        [r async for r in read_object(object_store, "bad", len(data), 0)]


async def test_read_object_detects_a_size_mismatch(object_store: FsspecObjectStore) -> None:
    data = build(0, 20)
    await object_store.put("short", data[:-1])
    with pytest.raises(CorruptObjectError):
        [r async for r in read_object(object_store, "short", len(data), 0)]


async def test_local_store_put_get_range_delete(object_store: FsspecObjectStore) -> None:
    await object_store.put("a/b/c.bobj", b"0123456789")
    assert await object_store.get("a/b/c.bobj") == b"0123456789"
    assert await object_store.get("a/b/c.bobj", 2, 5) == b"234"
    await object_store.delete("a/b/c.bobj")
    await object_store.delete("a/b/c.bobj")  # deleting a missing object is fine
    with pytest.raises(ObjectNotFoundError, match=r"a/b/c\.bobj"):
        await object_store.get("a/b/c.bobj")


async def test_object_names_must_stay_inside_the_store(object_store: FsspecObjectStore) -> None:
    for bad in ("", "/abs", "a/../../etc"):
        with pytest.raises(ValueError, match="relative"):
            await object_store.put(bad, b"x")
