"""The record codec: bytes in, records out; records in, bytes out. No I/O.

One frame on disk (WAL segments) and in objects (object storage)::

    u32 body_length | u32 crc32(body) | body
    body = u64 offset | f64 timestamp | u8 flags
           [u32 key_length | key]                              if flags & FLAG_KEY
           [u16 count | (u16 name_length | name | u32 value_length | value) * count]
                                                               if flags & FLAG_HEADERS
           payload (the rest of the body)

All integers are big-endian. The CRC covers the whole body, so a torn write or a flipped
bit anywhere in a record is detected. `RecordDecoder.feed` follows the sans-I/O pattern of
h11: the caller owns the file or socket and feeds whatever bytes it has; the decoder returns
the complete records, keeps a partial frame for the next feed ("need more", never an
error), and reports a corrupt frame as a distinct result with its stream position so the
WAL can truncate exactly there.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

__all__ = [
    "FRAME_HEADER_SIZE",
    "MAX_BODY_SIZE",
    "Corruption",
    "DecodeResult",
    "Message",
    "Record",
    "RecordDecoder",
    "decode_records",
    "encode_record",
    "frame_size",
]

_FRAME_HEADER = struct.Struct(">II")
_BODY_FIXED = struct.Struct(">QdB")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")

FRAME_HEADER_SIZE = _FRAME_HEADER.size
# A length above this is not a record but garbage (a corrupt length field): report it at
# once instead of waiting forever for gigabytes that will never come.
MAX_BODY_SIZE = 64 * 1024 * 1024 + 1024
_MIN_BODY_SIZE = _BODY_FIXED.size

FLAG_KEY = 0x01
FLAG_HEADERS = 0x02
_KNOWN_FLAGS = FLAG_KEY | FLAG_HEADERS

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Record:
    """One message of a reliable topic, identified by its offset."""

    offset: int
    timestamp: float
    payload: bytes
    key: bytes | None = None
    headers: Headers = ()

    @property
    def size(self) -> int:
        """Payload bytes plus key bytes: what throughput figures count."""
        return len(self.payload) + (len(self.key) if self.key is not None else 0)


@dataclass(frozen=True, slots=True)
class Message:
    """What a producer appends: a record without its offset and timestamp yet."""

    payload: bytes
    key: bytes | None = None
    headers: Headers = ()


@dataclass(frozen=True, slots=True)
class Corruption:
    """A frame that can never decode: `position` is where it starts in the fed stream."""

    position: int
    reason: str


@dataclass(frozen=True, slots=True)
class DecodeResult:
    """What one `feed` produced.

    `records` are the complete, verified records. If `corruption` is None the decoder
    needs more data to go on (`buffered` bytes of a partial frame are held back; 0 means the
    stream ended on a frame boundary). Otherwise the stream is corrupt from
    `corruption.position` and the decoder accepts no more data.
    """

    records: tuple[Record, ...]
    corruption: Corruption | None
    buffered: int

    @property
    def need_more(self) -> bool:
        """True when decoding can continue with more bytes."""
        return self.corruption is None


def encode_record(record: Record) -> bytes:
    """Encode one record as a frame (header + body)."""
    if record.offset < 0:
        raise ValueError(f"record offset must be >= 0, got {record.offset}")
    flags = 0
    parts: list[bytes] = [b""]  # placeholder for the fixed part, filled once flags are known
    if record.key is not None:
        flags |= FLAG_KEY
        parts.append(_U32.pack(len(record.key)))
        parts.append(record.key)
    if record.headers:
        flags |= FLAG_HEADERS
        parts.append(_U16.pack(len(record.headers)))
        for name, value in record.headers:
            raw_name = name.encode()
            parts.append(_U16.pack(len(raw_name)))
            parts.append(raw_name)
            parts.append(_U32.pack(len(value)))
            parts.append(value)
    parts[0] = _BODY_FIXED.pack(record.offset, record.timestamp, flags)
    parts.append(record.payload)
    body = b"".join(parts)
    if len(body) > MAX_BODY_SIZE:
        raise ValueError(
            f"record at offset {record.offset} is {len(body)} bytes encoded; "
            f"the limit is {MAX_BODY_SIZE}: split the payload"
        )
    return _FRAME_HEADER.pack(len(body), zlib.crc32(body)) + body


def frame_size(record: Record) -> int:
    """Encoded size of `record` in bytes, without encoding it."""
    size = FRAME_HEADER_SIZE + _BODY_FIXED.size + len(record.payload)
    if record.key is not None:
        size += 4 + len(record.key)
    if record.headers:
        size += 2 + sum(6 + len(name.encode()) + len(value) for name, value in record.headers)
    return size


def _decode_body(body: memoryview) -> Record:
    """Parse a CRC-verified body; raises ValueError if its structure is inconsistent."""
    offset, timestamp, flags = _BODY_FIXED.unpack_from(body, 0)
    if flags & ~_KNOWN_FLAGS:
        raise ValueError(f"unknown flags 0x{flags:02x}")
    pos = _BODY_FIXED.size
    end = len(body)
    key: bytes | None = None
    headers: Headers = ()
    if flags & FLAG_KEY:
        (key_len,) = _U32.unpack_from(body, pos)
        pos += 4
        if pos + key_len > end:
            raise ValueError("key runs past the end of the record")
        key = bytes(body[pos : pos + key_len])
        pos += key_len
    if flags & FLAG_HEADERS:
        (count,) = _U16.unpack_from(body, pos)
        pos += 2
        items: list[tuple[str, bytes]] = []
        for _ in range(count):
            (name_len,) = _U16.unpack_from(body, pos)
            pos += 2
            name = bytes(body[pos : pos + name_len]).decode()
            pos += name_len
            (value_len,) = _U32.unpack_from(body, pos)
            pos += 4
            if pos + value_len > end:
                raise ValueError("header value runs past the end of the record")
            items.append((name, bytes(body[pos : pos + value_len])))
            pos += value_len
        headers = tuple(items)
    return Record(offset, timestamp, bytes(body[pos:end]), key, headers)


class RecordDecoder:
    """Incremental frame decoder: `feed(bytes)` returns the records completed so far.

    `position` is the stream position just past the last good record, i.e. where a torn or
    corrupt tail begins: the WAL truncates its segment there.
    """

    def __init__(self, start_position: int = 0) -> None:
        self._buf = bytearray()
        self._pos = 0  # read position inside _buf
        self._base = start_position  # stream position of _buf[0]
        self._corruption: Corruption | None = None

    @property
    def position(self) -> int:
        """Stream position just past the last complete, verified record."""
        return self._base + self._pos

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held back until more data arrives."""
        return len(self._buf) - self._pos

    @property
    def corruption(self) -> Corruption | None:
        """The corruption found so far, if any (the decoder is then stuck)."""
        return self._corruption

    def feed(self, data: bytes | bytearray | memoryview) -> DecodeResult:
        """Add `data` to the stream and return every record it completes."""
        if self._corruption is not None:
            return DecodeResult((), self._corruption, self.buffered)
        if self._pos and self._pos >= len(self._buf) // 2:
            # Compact so the buffer does not grow with the whole stream.
            del self._buf[: self._pos]
            self._base += self._pos
            self._pos = 0
        self._buf += data
        records: list[Record] = []
        buf = self._buf
        view = memoryview(buf)
        try:
            while True:
                pos = self._pos
                if len(buf) - pos < FRAME_HEADER_SIZE:
                    break
                length, crc = _FRAME_HEADER.unpack_from(buf, pos)
                if length < _MIN_BODY_SIZE or length > MAX_BODY_SIZE:
                    self._corruption = Corruption(
                        self._base + pos, f"frame length {length} out of range"
                    )
                    break
                end = pos + FRAME_HEADER_SIZE + length
                if end > len(buf):
                    break
                body = view[pos + FRAME_HEADER_SIZE : end]
                if zlib.crc32(body) != crc:
                    self._corruption = Corruption(self._base + pos, "CRC mismatch")
                    break
                try:
                    records.append(_decode_body(body))
                except (ValueError, struct.error, UnicodeDecodeError) as exc:
                    self._corruption = Corruption(self._base + pos, f"malformed body: {exc}")
                    break
                self._pos = end
        finally:
            view.release()
        return DecodeResult(tuple(records), self._corruption, self.buffered)


def decode_records(data: bytes | bytearray | memoryview) -> list[Record]:
    """Decode a buffer that must hold whole frames only; raises ValueError otherwise."""
    decoder = RecordDecoder()
    result = decoder.feed(data)
    if result.corruption is not None:
        raise ValueError(
            f"corrupt record at byte {result.corruption.position}: {result.corruption.reason}"
        )
    if result.buffered:
        raise ValueError(f"truncated record: {result.buffered} trailing bytes")
    return list(result.records)
