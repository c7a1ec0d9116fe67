"""Objects in object storage: their format (sans-I/O) and the fsspec-backed store.

An object holds a contiguous offset range of one topic, as frames in the WAL's record
format, followed by a sparse offset index and a fixed-size footer::

    b"BALLOBJ1" | frame * n | index entry * k | footer
    index entry = u64 offset | u64 position        (position: byte offset in the object)
    footer      = u64 start | u64 end | u64 index_position | u32 index_count
                  | u32 index_crc | u32 footer_crc | b"BALLEND1"

The footer and the index let a reader start in the middle of a large object with two
range requests instead of downloading it whole. `ObjectBuilder` makes the bytes;
`ObjectFooter` and `ObjectIndex` parse them; `read_object` is the few lines of I/O that
stream records from a store.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import struct
import zlib
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import fsspec

from ballast.storage.codec import Record, RecordDecoder, encode_record

__all__ = [
    "FOOTER_SIZE",
    "HEADER_MAGIC",
    "CorruptObjectError",
    "FsspecObjectStore",
    "ObjectBuilder",
    "ObjectFooter",
    "ObjectIndex",
    "ObjectNotFoundError",
    "ObjectPart",
    "ObjectStore",
    "ObjectStoreError",
    "read_object",
]

HEADER_MAGIC = b"BALLOBJ1"
FOOTER_MAGIC = b"BALLEND1"
_FOOTER_HEAD = struct.Struct(">QQQII")
_FOOTER = struct.Struct(">QQQIII8s")
FOOTER_SIZE = _FOOTER.size
_INDEX_ENTRY = struct.Struct(">QQ")
# Local objects up to this size are written inline (an acknowledgement waits for them).
_INLINE_PUT_BYTES = 256 * 1024


class ObjectStoreError(Exception):
    """An object store operation failed (network, permissions, missing bucket…)."""


class ObjectNotFoundError(ObjectStoreError):
    """The named object does not exist."""


class CorruptObjectError(ValueError):
    """An object's bytes do not match the format; names the object and the defect."""


@dataclass(frozen=True, slots=True)
class ObjectFooter:
    """The fixed-size trailer of an object."""

    start: int
    end: int
    index_position: int
    index_count: int
    index_crc: int

    def encode(self) -> bytes:
        """The footer bytes, with their own CRC."""
        head = _FOOTER_HEAD.pack(
            self.start, self.end, self.index_position, self.index_count, self.index_crc
        )
        return head + struct.pack(">I", zlib.crc32(head)) + FOOTER_MAGIC

    @classmethod
    def parse(cls, data: bytes, name: str = "object") -> ObjectFooter:
        """Parse the last `FOOTER_SIZE` bytes of an object."""
        if len(data) != FOOTER_SIZE:
            raise CorruptObjectError(f"{name}: footer is {len(data)} bytes, need {FOOTER_SIZE}")
        start, end, index_position, index_count, index_crc, footer_crc, magic = _FOOTER.unpack(data)
        if magic != FOOTER_MAGIC:
            raise CorruptObjectError(f"{name}: bad footer magic {magic!r}")
        if zlib.crc32(data[: _FOOTER_HEAD.size]) != footer_crc:
            raise CorruptObjectError(f"{name}: footer CRC mismatch")
        if end < start:
            raise CorruptObjectError(f"{name}: footer range {start}..{end} is empty")
        return cls(start, end, index_position, index_count, index_crc)

    @property
    def index_size(self) -> int:
        """Bytes of the index that precedes the footer."""
        return self.index_count * _INDEX_ENTRY.size


@dataclass(frozen=True, slots=True)
class ObjectIndex:
    """Sparse (offset → byte position) index; positions point at frame boundaries."""

    offsets: tuple[int, ...]
    positions: tuple[int, ...]

    @classmethod
    def parse(cls, data: bytes, footer: ObjectFooter, name: str = "object") -> ObjectIndex:
        """Parse and verify the index bytes described by `footer`."""
        if len(data) != footer.index_size:
            raise CorruptObjectError(
                f"{name}: index is {len(data)} bytes, footer says {footer.index_size}"
            )
        if zlib.crc32(data) != footer.index_crc:
            raise CorruptObjectError(f"{name}: index CRC mismatch")
        offsets: list[int] = []
        positions: list[int] = []
        for offset, position in _INDEX_ENTRY.iter_unpack(data):
            offsets.append(offset)
            positions.append(position)
        if not offsets or offsets[0] != footer.start:
            raise CorruptObjectError(f"{name}: index does not start at offset {footer.start}")
        return cls(tuple(offsets), tuple(positions))

    def position_for(self, offset: int) -> int:
        """Byte position of the indexed frame at or before `offset`."""
        i = bisect.bisect_right(self.offsets, offset) - 1
        return self.positions[max(i, 0)]


class ObjectBuilder:
    """Accumulates a contiguous run of records and produces the object's bytes."""

    def __init__(self, index_interval_bytes: int = 64 * 1024) -> None:
        self._parts: list[bytes] = [HEADER_MAGIC]
        self._size = len(HEADER_MAGIC)
        self._index: list[bytes] = []
        self._index_interval = index_interval_bytes
        self._last_indexed_position = -index_interval_bytes
        self._start: int | None = None
        self._end: int | None = None
        self._count = 0

    @property
    def start(self) -> int | None:
        """First offset added, or None while empty."""
        return self._start

    @property
    def end(self) -> int | None:
        """Last offset added, or None while empty."""
        return self._end

    @property
    def count(self) -> int:
        """Number of records added."""
        return self._count

    @property
    def size(self) -> int:
        """Bytes so far, without index and footer."""
        return self._size

    def add(self, record: Record) -> None:
        """Append the next record; offsets must be contiguous."""
        self.add_frame(record.offset, encode_record(record))

    def add_frame(self, offset: int, frame: bytes) -> None:
        """Append an already-encoded frame holding `offset`."""
        if self._end is not None and offset != self._end + 1:
            raise ValueError(f"object offsets must be contiguous: got {offset} after {self._end}")
        if self._start is None:
            self._start = offset
        if self._size - self._last_indexed_position >= self._index_interval:
            self._index.append(_INDEX_ENTRY.pack(offset, self._size))
            self._last_indexed_position = self._size
        self._parts.append(frame)
        self._size += len(frame)
        self._end = offset
        self._count += 1

    def finish(self) -> bytes:
        """The complete object: header, frames, index, footer."""
        if self._start is None or self._end is None:
            raise ValueError("an object needs at least one record")
        index = b"".join(self._index)
        footer = ObjectFooter(
            self._start, self._end, self._size, len(self._index), zlib.crc32(index)
        )
        return b"".join([*self._parts, index, footer.encode()])


@dataclass(frozen=True)
class StoredObject:
    """An object as a listing of the store shows it."""

    name: str
    size: int
    modified: float  # seconds since the epoch (the store's clock)


@runtime_checkable
class ObjectStore(Protocol):
    """Where objects live: names are relative paths like ``ns/topic/000…-000….bobj``."""

    @property
    def url(self) -> str:
        """Where the store points, for logs and error messages."""
        ...

    async def put(self, name: str, data: bytes) -> None:
        """Write an object whole (overwrites)."""
        ...

    async def get(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        """Read an object, or the byte range [start, end); raises ObjectNotFoundError."""
        ...

    async def delete(self, name: str) -> None:
        """Delete an object; deleting a missing object is not an error."""
        ...

    async def list(self, prefix: str) -> list[StoredObject]:
        """The objects whose names start with `prefix` (a directory: ``a/b/``)."""
        ...


class FsspecObjectStore:
    """An `ObjectStore` on any fsspec filesystem: a local directory or ``s3://bucket/prefix``.

    fsspec calls are blocking (s3fs runs its own event loop thread), so each runs in a
    worker thread and never stalls the broker's loop.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self._url = url
        fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        self._fs = fs
        self._root = root.rstrip("/")
        protocols = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
        self._local = "file" in protocols or "local" in protocols
        self._made: set[str] = set()  # local directories known to exist
        if self._local:
            fs.makedirs(self._root, exist_ok=True)

    @property
    def url(self) -> str:
        """The URL this store was opened with."""
        return self._url

    def _path(self, name: str) -> str:
        if not name or name.startswith("/") or ".." in name.split("/"):
            raise ValueError(f"invalid object name {name!r}: expected a relative path")
        return f"{self._root}/{name}"

    async def put(self, name: str, data: bytes) -> None:
        """Write `data` at `name`."""
        path = self._path(name)
        try:
            if self._local and len(data) <= _INLINE_PUT_BYTES:
                # Acknowledgements wait for this write: a small local file is written at
                # once, without a round trip through a worker thread.
                self._put_local(path, data)
            else:
                await asyncio.to_thread(self._put_sync, path, data)
        except Exception as exc:  # s3fs/botocore raise more than OSError
            raise ObjectStoreError(f"writing {name!r} to {self._url} failed: {exc}") from exc

    def _put_sync(self, path: str, data: bytes) -> None:
        if self._local:
            self._put_local(path, data)
        else:
            self._fs.pipe_file(path, data)

    def _put_local(self, path: str, data: bytes) -> None:
        directory = path.rsplit("/", 1)[0]
        if directory not in self._made:
            os.makedirs(directory, exist_ok=True)
            self._made.add(directory)
        with open(path, "wb") as out:
            out.write(data)

    async def get(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        """Read `name` whole or the byte range [start, end)."""
        path = self._path(name)
        try:
            # Keywords: s3fs's cat_file takes a version id as its second positional argument.
            data = await asyncio.to_thread(self._fs.cat_file, path, start=start, end=end)
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"object {name!r} not found in {self._url}") from exc
        except Exception as exc:
            raise ObjectStoreError(f"reading {name!r} from {self._url} failed: {exc}") from exc
        return bytes(data)

    async def delete(self, name: str) -> None:
        """Delete `name` if it exists."""
        path = self._path(name)
        try:
            await asyncio.to_thread(self._fs.rm_file, path)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise ObjectStoreError(f"deleting {name!r} from {self._url} failed: {exc}") from exc

    async def list(self, prefix: str) -> list[StoredObject]:
        """The objects under the directory `prefix` (none if it does not exist)."""
        path = self._path(prefix.rstrip("/"))
        try:
            found = await asyncio.to_thread(self._fs.find, path, detail=True)
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise ObjectStoreError(f"listing {prefix!r} in {self._url} failed: {exc}") from exc
        out = []
        for full, info in sorted(found.items()):
            if info.get("type") == "directory":
                continue
            name = full[len(self._root) + 1 :] if full.startswith(self._root) else full
            out.append(StoredObject(name, int(info.get("size") or 0), _modified(info)))
        return out


def _modified(info: Mapping[str, Any]) -> float:
    """The modification time in an fsspec listing (a local file's ``mtime``, S3's
    ``LastModified``); 0 when the store does not say (never swept as old: see callers)."""
    value = info.get("mtime", info.get("LastModified"))
    if isinstance(value, int | float):
        return float(value)
    timestamp = getattr(value, "timestamp", None)
    return float(timestamp()) if callable(timestamp) else 0.0


class ObjectPart:
    """A read-only view of the `size` bytes at `base` of every object of `store`: one
    topic's part of an object the commit stream shared by several topics (each part is
    laid out as a whole object, so `read_object` reads it through this view unchanged)."""

    def __init__(self, store: ObjectStore, base: int, size: int) -> None:
        self._store = store
        self._base = base
        self._size = size

    @property
    def url(self) -> str:
        """The underlying store's URL."""
        return self._store.url

    async def put(self, name: str, data: bytes) -> None:
        raise ObjectStoreError(f"{name}: a part of a shared object is read-only")

    async def get(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        """The part's bytes [start, end) (relative to the part), or the whole part."""
        lo = self._base + (start or 0)
        hi = self._base + (self._size if end is None else min(end, self._size))
        return await self._store.get(name, lo, hi)

    async def delete(self, name: str) -> None:
        raise ObjectStoreError(f"{name}: a part of a shared object is deleted with the object")

    async def list(self, prefix: str) -> list[StoredObject]:
        raise ObjectStoreError(f"{prefix}: a part of a shared object lists nothing")


async def read_object(
    store: ObjectStore,
    name: str,
    size: int,
    from_offset: int,
    *,
    chunk_size: int = 1024 * 1024,
) -> AsyncGenerator[Record, None]:
    """Stream the records of object `name` (of `size` bytes) from `from_offset` on.

    Small objects are fetched in one request; large ones by footer, index, then the frames
    from the indexed position in `chunk_size` range requests. Every record is CRC-checked
    and the offsets must run contiguously over the footer's range.
    """
    if size < len(HEADER_MAGIC) + FOOTER_SIZE:
        raise CorruptObjectError(f"{name}: {size} bytes is too small for an object")
    whole: bytes | None = None
    if size <= chunk_size:
        whole = await store.get(name)
        if len(whole) != size:
            raise CorruptObjectError(f"{name}: {len(whole)} bytes, descriptor says {size}")
        tail = whole[size - FOOTER_SIZE :]
    else:
        tail = await store.get(name, size - FOOTER_SIZE, size)
    footer = ObjectFooter.parse(tail, name)
    if footer.index_position + footer.index_size + FOOTER_SIZE != size:
        raise CorruptObjectError(f"{name}: footer layout does not match size {size}")
    if whole is not None:
        if whole[: len(HEADER_MAGIC)] != HEADER_MAGIC:
            raise CorruptObjectError(f"{name}: bad header magic")
        index_bytes = whole[footer.index_position : footer.index_position + footer.index_size]
    else:
        index_bytes = await store.get(
            name, footer.index_position, footer.index_position + footer.index_size
        )
    index = ObjectIndex.parse(index_bytes, footer, name)
    if from_offset > footer.end:
        return
    position = index.position_for(from_offset)
    decoder = RecordDecoder(start_position=position)
    expected: int | None = None
    while position < footer.index_position:
        upto = min(position + chunk_size, footer.index_position)
        chunk = whole[position:upto] if whole is not None else await store.get(name, position, upto)
        if not chunk:
            raise CorruptObjectError(f"{name}: object ends early at byte {position}")
        position = upto
        result = decoder.feed(chunk)
        if result.corruption is not None:
            raise CorruptObjectError(
                f"{name}: corrupt record at byte {result.corruption.position}: "
                f"{result.corruption.reason}"
            )
        for record in result.records:
            if expected is not None and record.offset != expected:
                raise CorruptObjectError(
                    f"{name}: offset {record.offset} follows {expected - 1}, not contiguous"
                )
            expected = record.offset + 1
            if record.offset >= from_offset:
                yield record
    if decoder.buffered:
        raise CorruptObjectError(f"{name}: truncated record before the index")
    if expected != footer.end + 1:
        raise CorruptObjectError(f"{name}: records end at {expected}, footer says {footer.end}")
