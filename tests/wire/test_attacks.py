"""The published HTTP/2 denial-of-service patterns against a client port (issue 37).

Each attack runs from its own connection(s) while a legitimate `danube-client` producer
sends on another; `Watch.check` then asserts that producer was served within
`LATENCY_BOUND` throughout, that the server's memory grew less than `RSS_BOUND` and that its
log carries no traceback. Each test also asserts what the protection did to the attacker
(GOAWAY and its code, a refusal, a closed connection) and that the server counted it.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time

import hpack
import pytest
from danube.proto import DanubeApi_pb2 as pb

from tests.wire.clients import (
    ACK,
    CANCEL,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    HEADERS,
    LOOKUP,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    EngineClient,
    RawClient,
    frame,
    header_block,
    message,
    send_some,
    unread_socket,
)
from tests.wire.conftest import TOPIC, WIRE, Front, Watch

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(120)]

LOOKUP_BODY = message(pb.TopicLookupRequest(topic=TOPIC).SerializeToString())


@pytest.mark.parametrize("with_body", [False, True], ids=["headers", "headers+data"])
async def test_rapid_reset_gets_goaway_enhance_your_calm(
    front: Front, watch: Watch, with_body: bool
) -> None:
    """CVE-2023-44487: streams opened and reset at once, as fast as the socket takes them."""
    async with watch:
        attacker = await RawClient.connect(front.url)
        goaway = asyncio.create_task(attacker.goaway(timeout=30))  # read as it comes
        stream = 1
        for _ in range(100):  # up to 10 000 streams; the server stops it long before
            batch = []
            for sid in range(stream, stream + 200, 2):
                batch.append(frame(HEADERS, END_HEADERS, sid, attacker.block(LOOKUP)))
                if with_body:
                    batch.append(frame(DATA, END_STREAM, sid, LOOKUP_BODY))
                batch.append(frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL)))
            stream += 200
            attacker.write(b"".join(batch))
            await asyncio.sleep(0)  # the reader's turn (drain does not yield)
            if not await attacker.drain() or goaway.done():
                break
        code = await goaway
        attacker.close()
    watch.check()
    assert code == ENHANCE_YOUR_CALM
    assert (await watch.counted()).get("rapid_reset", 0) >= 1


async def test_a_ping_flood_from_a_client_that_never_reads(front: Front, watch: Watch) -> None:
    """CVE-2019-9512: PINGs written without reading the answers; the answers must not pile
    up in the server (it stops reading, or ends the connection)."""
    async with watch:
        sock = unread_socket(front.url)
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, ACK, 0))
        pings = frame(PING, 0, 0, b"12345678") * 1000
        sent, refused, began = 0, 0, time.monotonic()
        while time.monotonic() - began < 5 and refused < 50:
            taken = send_some(sock, pings)
            if taken < 0:
                break  # closed by the server
            sent += taken
            refused = refused + 1 if taken == 0 else 0
            await asyncio.sleep(0.01 if taken == 0 else 0)
        sock.close()
    watch.check()
    counted = await watch.counted()
    assert counted.get("flood", 0) + counted.get("write_paused", 0) >= 1, counted
    assert sent < 64 * 1024 * 1024  # the server stopped taking them


async def test_a_settings_flood_gets_goaway_enhance_your_calm(front: Front, watch: Watch) -> None:
    """CVE-2019-9515: SETTINGS frames, each needing an ACK, faster than the limit."""
    async with watch:
        attacker = await RawClient.connect(front.url)
        one = frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65535))
        attacker.write(one * 500)
        await attacker.drain()
        code = await attacker.goaway()
        attacker.close()
    watch.check()
    assert code == ENHANCE_YOUR_CALM
    assert (await watch.counted()).get("settings_flood", 0) >= 1


async def test_settings_with_thousands_of_entries_over_thousands_of_streams(
    front: Front, watch: Watch
) -> None:
    """One SETTINGS frame of 2 730 INITIAL_WINDOW_SIZE entries (each walking every open
    stream) after 1 000 streams were opened: refused at the frame, quickly."""
    async with watch:
        attacker = await RawClient.connect(front.url)
        opened = [
            frame(HEADERS, END_HEADERS, sid, attacker.block(LOOKUP)) for sid in range(1, 2001, 2)
        ]
        attacker.write(b"".join(opened))
        entries = b"".join(struct.pack(">HI", 4, 65535 + i % 2) for i in range(2730))
        began = time.monotonic()
        attacker.write(frame(SETTINGS, 0, 0, entries))
        await attacker.drain()
        code = await attacker.goaway()
        took = time.monotonic() - began
        attacker.close()
    watch.check()
    assert code is not None and code != 0
    assert took < 2.0


async def test_error_answers_are_bounded_and_never_echo_the_request(front: Front) -> None:
    """CVE-2019-9514's amplification: an unknown method named by 4 000 characters is
    answered UNIMPLEMENTED with a short, sanitised prefix of its name only."""
    client = await EngineClient.connect(front.url)
    try:
        path = "/x.Y/<script>" + "A" * 4000  # (libnghttp2 resets a path of control bytes)
        answer = await client.answer(client.request(path, LOOKUP_BODY))
        assert answer.status == 12  # UNIMPLEMENTED
        assert len(answer.details) < 200
        assert b"AAAA" * 30 not in answer.details
        assert b"%3Cscript%3E" in answer.details  # quoted, as every grpc-message
        assert sum(len(k) + len(v) for k, v in answer.headers.items()) < 400
    finally:
        await client.close()


async def test_an_error_answer_flood_from_a_client_that_never_reads(
    front: Front, watch: Watch
) -> None:
    """Requests for an unknown method, each a few bytes (the path from the HPACK table),
    written without reading the answers: refusals spend the connection's reset budget, so
    the connection ends (GOAWAY ENHANCE_YOUR_CALM) once it makes too many."""
    async with watch:
        sock = unread_socket(front.url)
        encoder = hpack.Encoder()
        sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, ACK, 0))
        path = "/nope.Nope/" + "N" * 200
        sid, sent, refused, began = 1, 0, 0, time.monotonic()
        while time.monotonic() - began < 5 and refused < 50 and sid < 2**30:
            batch = b"".join(
                frame(HEADERS, END_HEADERS | END_STREAM, s, header_block(encoder, path))
                for s in range(sid, sid + 400, 2)
            )
            taken = send_some(sock, batch)
            if taken < 0:
                break
            if taken < len(batch):  # the rest would cut a frame: this connection is done
                refused = 50
            sid += 400
            sent += max(taken, 0)
            await asyncio.sleep(0)
        sock.close()
    watch.check()
    counted = await watch.counted()
    assert counted.get("unknown_method", 0) >= 1
    assert counted.get("rapid_reset", 0) >= 1, counted
    assert sent < 4 * 1024 * 1024


async def test_a_flood_of_valid_requests_on_one_connection_shares_the_loop(
    front: Front, watch: Watch
) -> None:
    """4 000 lookups written at once on one connection (within its concurrent streams;
    thousands of requests fit in one read): served, while the legitimate client on another
    connection is too."""
    async with watch:
        attacker = await RawClient.connect(front.url)
        requests = b"".join(
            frame(HEADERS, END_HEADERS, sid, attacker.block(LOOKUP))
            + frame(DATA, END_STREAM, sid, LOOKUP_BODY)
            for sid in range(1, 8_001, 2)
        )
        window = frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 30))  # room for answers
        attacker.write(window + requests)
        await attacker.drain()
        answered = 0
        async with asyncio.timeout(60):
            while answered < 4_000:
                head = await attacker.reader.readexactly(9)
                high, low, kind, flags, _ = struct.unpack(">BHBBI", head)
                await attacker.reader.readexactly((high << 16) | low)
                if kind == HEADERS and flags & END_STREAM:
                    answered += 1
        attacker.close()
    watch.check()
    assert answered == 4_000


async def test_malformed_requests_are_stream_errors_on_a_connection_that_goes_on(
    front: Front, watch: Watch
) -> None:
    """A 400-digit grpc-timeout, -bin metadata that is not base64, a body that is no
    protobuf, an unknown method: each answered on its own stream; the next call on the
    same connection is served."""
    async with watch:
        client = await EngineClient.connect(front.url)
        try:
            timeout = client.request(LOOKUP, LOOKUP_BODY, [("grpc-timeout", "9" * 400 + "S")])
            binary = client.request(LOOKUP, LOOKUP_BODY, [("trace-bin", "!!not base64!!")])
            garbage = client.request(LOOKUP, message(b"\xff\xff\xff\xff\x0f"))
            unknown = client.request("/danube.Discovery/Nothing", LOOKUP_BODY)
            answers = [await client.answer(s) for s in (timeout, binary, garbage, unknown)]
            assert [a.status for a in answers] == [3, 3, 3, 12], [a.details for a in answers]
            fine = await client.answer(client.request(LOOKUP, LOOKUP_BODY))
            assert fine.status == 0, fine.details
            assert client.goaway is None
        finally:
            await client.close()
    watch.check()
    counted = await watch.counted()
    for event in ("bad_timeout", "bad_metadata", "unknown_method"):
        assert counted.get(event, 0) >= 1, (event, counted)
    # A gateway parses in its wire layer; a broker's handlers parse (and count) their own.
    malformed = counted.get("malformed_request", 0) + counted.get("rejected:malformed_request", 0)
    assert malformed >= 1, counted


async def _hold_body(url: str, size: int, seconds: float) -> tuple[int, int | None]:
    """A request declaring `size` bytes whose body is sent as fast as the server gives
    credit and never finished; (bytes the server took, its gRPC status if it answered)."""
    client = await EngineClient.connect(url)
    try:
        stream = client.request(LOOKUP, struct.pack(">BI", 0, size), end=False)
        chunk = b"z" * 65536
        sent, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline and sent < size - len(chunk):
            answer = client.answers[stream]
            if answer.done.is_set() or client.ended.is_set():
                break
            if client.h2.queued_body_size(stream) < len(chunk):
                client.h2.send_data(stream, chunk)
                client.flush()
                sent += len(chunk)
            else:
                await asyncio.sleep(0.01)  # no credit: the server holds back
        taken = sent - client.h2.queued_body_size(stream)
        return taken, client.answers[stream].status
    finally:
        await client.close()


async def test_request_bodies_held_open_stay_within_the_budget(front: Front, watch: Watch) -> None:
    """32 connections × 7 MiB bodies never finished: the port holds at most its budget
    (16 MiB here); flow-control credit stops, what goes past it is refused, and what is
    held is refused once it has waited the handshake timeout."""
    async with watch:
        results = await asyncio.gather(
            *(_hold_body(front.url, 7 * 1024 * 1024, 3.0) for _ in range(32))
        )
    watch.check()
    taken = sum(t for t, _ in results)
    # RESOURCE_EXHAUSTED past the budget; DEADLINE_EXCEEDED once a body has not arrived
    # within the handshake timeout (1 s here: its bytes go back to the budget).
    refused = [s for _, s in results if s in (4, 8)]
    # What the server read is the budget plus the credit given before it filled (a
    # connection window each at most), never the 224 MiB asked for.
    assert taken < WIRE["request_budget_bytes"] + 32 * 4 * 1024 * 1024, taken
    assert refused or taken <= WIRE["request_budget_bytes"] + 32 * 1024 * 1024


async def test_slowloris_connections_are_closed_after_the_handshake_timeout(
    front: Front, watch: Watch
) -> None:
    """300 connections that send half a preface and then nothing."""
    async with watch:
        attackers = await asyncio.gather(
            *(RawClient.connect(front.url, preface=False) for _ in range(300))
        )
        for attacker in attackers:
            attacker.write(PREFACE[:10])
        began = time.monotonic()
        closed = await asyncio.gather(*(a.closed(timeout=8) for a in attackers))
        took = time.monotonic() - began
        for attacker in attackers:
            attacker.close()
    watch.check()
    assert all(closed)
    assert took < WIRE["handshake_timeout_seconds"] + 5
    assert (await watch.counted()).get("handshake_timeout", 0) >= 300


async def test_thousands_of_idle_connections(front: Front, watch: Watch) -> None:
    """2 000 connections that each make one call and then sit idle: served meanwhile, and
    closed (GOAWAY) after the idle timeout."""

    async def one_call() -> RawClient:
        # Its call written as soon as it connects: were it to wait for the rest of its
        # batch on a loaded machine, the server would close it as a slowloris instead.
        attacker = await RawClient.connect(front.url)
        attacker.write(
            frame(HEADERS, END_HEADERS, 1, attacker.block(LOOKUP))
            + frame(DATA, END_STREAM, 1, LOOKUP_BODY)
        )
        return attacker

    async with watch:
        attackers: list[RawClient] = []
        for _ in range(20):
            attackers += await asyncio.gather(*(one_call() for _ in range(100)))
        closed = await asyncio.gather(*(a.closed(timeout=15) for a in attackers))
        for attacker in attackers:
            attacker.close()
    watch.check()
    assert all(closed)
    assert (await watch.counted()).get("idle_timeout", 0) >= 2000


async def test_zero_window_readers_get_no_data_and_cost_nothing(front: Front, watch: Watch) -> None:
    """50 connections of 20 calls each whose windows are 0: no DATA is ever sent them."""
    async with watch:
        clients = [
            await EngineClient.connect(front.url, {4: 0}, auto_window_update=False)
            for _ in range(50)
        ]
        streams = [[c.request(LOOKUP, LOOKUP_BODY) for _ in range(20)] for c in clients]
        await asyncio.sleep(1.0)  # time enough for every answer that could be sent
        for client, opened in zip(clients, streams, strict=True):
            for stream in opened:
                assert not client.answers[stream].data
        for client in clients:
            await client.close()
    watch.check()


async def test_a_continuation_flood_gets_goaway(front: Front, watch: Watch) -> None:
    """CVE-2024-27316 and kin: a header block continued for ever."""
    async with watch:
        attacker = await RawClient.connect(front.url)
        block = attacker.block(LOOKUP)
        attacker.write(frame(HEADERS, 0, 1, block))
        filler = frame(CONTINUATION, 0, 1, b"\x40\x01a\x01b") * 2000
        attacker.write(filler)
        await attacker.drain()
        code = await attacker.goaway()
        attacker.close()
    watch.check()
    assert code is not None and code != 0


async def test_an_hpack_bomb_gets_goaway_or_a_reset(front: Front, watch: Watch) -> None:
    """A 4 000-byte header put in the dynamic table once, then named 16 000 times by one
    byte each: 64 MB of decoded headers from 16 KB on the wire."""
    async with watch:
        attacker = await RawClient.connect(front.url)
        block = attacker.block(LOOKUP)
        value = b"v" * 4000
        insert = b"\x40\x06x-bomb" + _hpack_len(len(value)) + value
        refs = b"\xbe" * 16000  # index 62: the entry just inserted
        payload = block + insert + refs
        chunks = [payload[i : i + 16000] for i in range(0, len(payload), 16000)]
        frames = [frame(HEADERS, END_HEADERS if len(chunks) == 1 else 0, 1, chunks[0])]
        for i, chunk in enumerate(chunks[1:], 1):
            frames.append(frame(CONTINUATION, END_HEADERS if i == len(chunks) - 1 else 0, 1, chunk))
        attacker.write(b"".join(frames) + frame(DATA, END_STREAM, 1, LOOKUP_BODY))
        await attacker.drain()
        ended = await _goaway_or_reset(attacker, 1)
        attacker.close()
    watch.check()
    assert ended


def _hpack_len(size: int) -> bytes:
    """An HPACK string length (7-bit prefix, no Huffman)."""
    if size < 127:
        return bytes([size])
    out, size = bytearray([127]), size - 127
    while size >= 128:
        out.append(size & 0x7F | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out)


async def _goaway_or_reset(attacker: RawClient, stream: int) -> bool:
    """Whether the server ends the stream with RST_STREAM or the connection with GOAWAY
    (rather than answering it)."""
    try:
        async with asyncio.timeout(10):
            while True:
                head = await attacker.reader.readexactly(9)
                high, low, kind, _, sid = struct.unpack(">BHBBI", head)
                await attacker.reader.readexactly((high << 16) | low)
                if kind == 7 or (kind == RST_STREAM and sid == stream):
                    return True
                if kind == HEADERS and sid == stream:
                    return False
    except (asyncio.IncompleteReadError, ConnectionError):
        return True


@pytest.mark.parametrize(
    "garbage",
    [
        random.Random(37).randbytes(2000),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        frame(DATA, 0, 0, b"x"),
    ],
    ids=["random", "http1", "data-on-stream-0"],
)
async def test_protocol_garbage_ends_only_its_own_connection(
    front: Front, watch: Watch, garbage: bytes
) -> None:
    async with watch:
        attacker = await RawClient.connect(front.url, preface=not garbage.startswith(b"GET"))
        attacker.write(garbage)
        await attacker.drain()
        closed = await attacker.closed()
        attacker.close()
    watch.check()
    assert closed
