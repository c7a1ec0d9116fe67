"""The record codec: whole, byte by byte, truncated, with trailing data, corrupt."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast.storage.codec import (
    FRAME_HEADER_SIZE,
    Record,
    RecordDecoder,
    decode_records,
    encode_record,
    frame_size,
)

RECORDS = [
    Record(0, 1_700_000_000.25, b"hello"),
    Record(1, 1_700_000_000.5, b"", key=b"k1"),
    Record(2, 1_700_000_001.0, b"\x00" * 300, headers=(("trace", b"abc"), ("empty", b""))),
    Record(3, 1_700_000_002.0, b"x", key=b"", headers=(("\u00e9t\u00e9", b"\xff\xfe"),)),
]
STREAM = b"".join(encode_record(r) for r in RECORDS)


def test_whole_stream_decodes_every_record() -> None:
    decoder = RecordDecoder()
    result = decoder.feed(STREAM)
    assert list(result.records) == RECORDS
    assert result.need_more and result.buffered == 0
    assert decoder.position == len(STREAM)


def test_byte_by_byte_gives_the_same_records() -> None:
    decoder = RecordDecoder()
    out: list[Record] = []
    for i in range(len(STREAM)):
        result = decoder.feed(STREAM[i : i + 1])
        assert result.corruption is None
        out.extend(result.records)
    assert out == RECORDS
    assert decoder.buffered == 0


def test_truncated_record_means_need_more_at_every_cut() -> None:
    frame = encode_record(RECORDS[2])
    for cut in range(1, len(frame)):
        decoder = RecordDecoder()
        result = decoder.feed(frame[:cut])
        assert result.records == (), cut
        assert result.need_more, cut
        assert result.buffered == cut
        assert decoder.position == 0
        # The rest completes it.
        assert decoder.feed(frame[cut:]).records == (RECORDS[2],)


def test_trailing_partial_frame_is_held_back() -> None:
    extra = encode_record(Record(4, 0.0, b"tail"))
    decoder = RecordDecoder()
    result = decoder.feed(STREAM + extra[:7])
    assert list(result.records) == RECORDS
    assert result.buffered == 7
    assert decoder.position == len(STREAM)


def test_corrupt_crc_is_a_distinct_result_with_its_position() -> None:
    damaged = bytearray(STREAM)
    second = len(encode_record(RECORDS[0]))
    damaged[second + FRAME_HEADER_SIZE + 3] ^= 0x40  # a bit inside the second body
    decoder = RecordDecoder()
    result = decoder.feed(bytes(damaged))
    assert result.records == (RECORDS[0],)
    assert result.corruption is not None
    assert result.corruption.position == second
    assert "CRC" in result.corruption.reason
    assert not result.need_more
    # The decoder stays stuck: feeding more yields nothing new.
    again = decoder.feed(encode_record(Record(9, 0.0, b"later")))
    assert again.records == () and again.corruption == result.corruption


def test_absurd_length_is_corrupt_not_need_more() -> None:
    header = struct.pack(">II", 0xFFFF_FFF0, 0)
    result = RecordDecoder().feed(header)
    assert result.corruption is not None and "length" in result.corruption.reason


def test_too_short_length_is_corrupt() -> None:
    result = RecordDecoder().feed(struct.pack(">II", 3, 0) + b"abc")
    assert result.corruption is not None


def test_decoder_reports_stream_positions_from_its_start() -> None:
    decoder = RecordDecoder(start_position=1000)
    damaged = encode_record(RECORDS[0]) + b"\x00" * FRAME_HEADER_SIZE
    result = decoder.feed(damaged)
    assert result.corruption is not None
    assert result.corruption.position == 1000 + len(encode_record(RECORDS[0]))


def test_decode_records_rejects_truncation_and_corruption() -> None:
    assert decode_records(STREAM) == RECORDS
    with pytest.raises(ValueError, match="truncated"):
        decode_records(STREAM[:-1])
    with pytest.raises(ValueError, match="corrupt"):
        decode_records(b"\x00" * 16)


def test_frame_size_matches_encoding() -> None:
    for record in RECORDS:
        assert frame_size(record) == len(encode_record(record))


def test_negative_offset_is_refused() -> None:
    with pytest.raises(ValueError, match="offset"):
        encode_record(Record(-1, 0.0, b""))


records_strategy = st.lists(
    st.builds(
        Record,
        offset=st.integers(0, 2**63),
        timestamp=st.floats(allow_nan=False, allow_infinity=False),
        payload=st.binary(max_size=64),
        key=st.none() | st.binary(max_size=8),
        headers=st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=3).map(
            tuple
        ),
    ),
    max_size=8,
)


@settings(max_examples=60, deadline=None)
@given(records=records_strategy, cuts=st.lists(st.integers(0, 2000), max_size=6))
def test_any_split_of_the_stream_decodes_the_same(records: list[Record], cuts: list[int]) -> None:
    stream = b"".join(encode_record(r) for r in records)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    decoder = RecordDecoder()
    out: list[Record] = []
    for a, b in itertools.pairwise(points):
        result = decoder.feed(stream[a:b])
        assert result.corruption is None
        out.extend(result.records)
    assert out == records
    assert decoder.buffered == 0
