"""The gateway's gRPC server on h2, driven by a real `grpc.aio` client channel."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import hpack
import pytest

from ballast.wire.h2grpc import CallContext, H2GrpcServer

_MAX = 64 * 1024


class _Service:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.stream_closed = asyncio.Event()
        self.slow_began = asyncio.Event()
        self.seen_metadata: tuple[Any, ...] = ()
        self.handlers = {
            "/t.S/Echo": grpc.unary_unary_rpc_method_handler(self.echo),
            "/t.S/Upper": grpc.unary_unary_rpc_method_handler(
                self.upper, request_deserializer=bytes.decode, response_serializer=str.encode
            ),
            "/t.S/Refuse": grpc.unary_unary_rpc_method_handler(self.refuse),
            "/t.S/Fail": grpc.unary_unary_rpc_method_handler(self.fail),
            "/t.S/Hang": grpc.unary_unary_rpc_method_handler(self.hang),
            "/t.S/Slow": grpc.unary_unary_rpc_method_handler(self.slow),
            "/t.S/Many": grpc.unary_stream_rpc_method_handler(self.many),
        }

    async def echo(self, request: bytes, context: CallContext) -> bytes:
        self.seen_metadata = context.invocation_metadata()
        return request

    async def upper(self, request: str, context: CallContext) -> str:
        return request.upper()

    async def refuse(self, request: bytes, context: CallContext) -> bytes:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not you: 100% sure")

    async def fail(self, request: bytes, context: CallContext) -> bytes:
        raise RuntimeError("boom")

    async def hang(self, request: bytes, context: CallContext) -> bytes:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b""

    async def slow(self, request: bytes, context: CallContext) -> bytes:
        self.slow_began.set()
        await asyncio.sleep(0.3)
        return request

    async def many(self, request: bytes, context: CallContext) -> AsyncIterator[bytes]:
        count, size = (int(part) for part in request.split(b","))
        try:
            for i in range(count):
                yield bytes([i % 256]) * size
        finally:
            self.stream_closed.set()


@pytest.fixture
async def served() -> AsyncIterator[tuple[_Service, H2GrpcServer, grpc.aio.Channel]]:
    service = _Service()
    server = H2GrpcServer(service.handlers.get, max_receive=_MAX, ssl_context=None)
    port = await server.start("127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield service, server, channel
    finally:
        await channel.close()
        await server.stop(0.1)


async def test_unary_calls_carry_bytes_metadata_and_serializers(served: Any) -> None:
    service, _, channel = served
    echo = channel.unary_unary("/t.S/Echo")
    replies = await asyncio.gather(*(echo(f"m{i}".encode()) for i in range(50)))
    assert replies == [f"m{i}".encode() for i in range(50)]
    await echo(b"x", metadata=(("authorization", "Bearer t"), ("trace-bin", b"\x00\x01")))
    seen = dict(service.seen_metadata)
    assert seen["authorization"] == "Bearer t"
    assert seen["trace-bin"] == b"\x00\x01"
    assert await channel.unary_unary("/t.S/Echo")(b"") == b""
    upper = channel.unary_unary(
        "/t.S/Upper", request_serializer=str.encode, response_deserializer=bytes.decode
    )
    assert await upper("quiet") == "QUIET"


async def test_aborts_errors_and_unknown_methods_get_their_status(served: Any) -> None:
    _, _, channel = served
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await channel.unary_unary("/t.S/Refuse")(b"")
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details() == "not you: 100% sure"
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await channel.unary_unary("/t.S/Fail")(b"")
    assert failed.value.code() is grpc.StatusCode.UNKNOWN
    assert "boom" in (failed.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await channel.unary_unary("/t.S/Nope")(b"")
    assert unknown.value.code() is grpc.StatusCode.UNIMPLEMENTED
    # The connection is still good after each of them.
    assert await channel.unary_unary("/t.S/Echo")(b"ok") == b"ok"


async def test_an_oversized_request_is_refused_and_others_go_on(served: Any) -> None:
    _, _, channel = served
    echo = channel.unary_unary("/t.S/Echo")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await echo(b"x" * (_MAX + 1))
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in (refused.value.details() or "")
    assert await echo(b"y" * _MAX) == b"y" * _MAX


async def test_deadlines_and_cancellation_reach_the_handler(served: Any) -> None:
    service, server, channel = served
    hang = channel.unary_unary("/t.S/Hang")
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await hang(b"", timeout=0.2)
    assert late.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(service.cancelled.wait(), 5)
    service.cancelled.clear()
    call = hang(b"")
    await asyncio.sleep(0.1)
    call.cancel()
    await asyncio.wait_for(service.cancelled.wait(), 5)
    await asyncio.sleep(0.05)
    assert not any(c.calls for c in server.connections)  # nothing kept of either call


async def test_a_long_stream_waits_for_the_clients_windows(served: Any) -> None:
    """10 MiB, more than any window the client opens at first: all of it, in order."""
    service, _, channel = served
    many = channel.unary_stream("/t.S/Many")
    got = [item async for item in many(b"160,65536")]
    assert len(got) == 160
    assert all(item == bytes([i % 256]) * 65536 for i, item in enumerate(got))
    # A client that stops reading half-way: the handler's stream is closed.
    service.stream_closed.clear()
    call = many(b"1000000,1024")
    async for _ in call:
        break
    call.cancel()
    await asyncio.wait_for(service.stream_closed.wait(), 5)


async def test_stop_lets_running_calls_finish_within_the_grace(served: Any) -> None:
    service, server, channel = served
    echo = channel.unary_unary("/t.S/Echo")
    assert await echo(b"before") == b"before"
    running = asyncio.ensure_future(channel.unary_unary("/t.S/Slow")(b"running"))
    await service.slow_began.wait()  # the call runs on the server
    await server.stop(2.0)
    assert await running == b"running"
    with pytest.raises(grpc.aio.AioRpcError) as after:
        await echo(b"after", timeout=2)
    assert after.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_a_taken_port_is_an_os_error() -> None:
    first = H2GrpcServer({}.get, max_receive=_MAX, ssl_context=None)
    port = await first.start("127.0.0.1", 0)
    try:
        with pytest.raises(OSError):
            await H2GrpcServer({}.get, max_receive=_MAX, ssl_context=None).start("127.0.0.1", port)
    finally:
        await first.stop(0)


# -- a client that writes frames by hand: what grpc.aio never sends ------------------------

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _raw_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">BHBBI", len(payload) >> 16, len(payload) & 0xFFFF, kind, flags, stream) + (
        payload
    )


class _RawClient:
    """Frames written by hand; the server's frames read back and decoded."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()

    @classmethod
    async def connect(cls, port: int) -> _RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # Its SETTINGS and an ACK of the server's (sent before the server reads anything):
        # until then the server's larger windows do not hold (RFC 9113 §6.5.3).
        writer.write(_PREFACE + _raw_frame(4, 0, 0, b"") + _raw_frame(4, 1, 0, b""))
        return cls(reader, writer)

    def request_block(self, path: str) -> bytes:
        return bytes(self.encoder.encode(
            [(":method", "POST"), (":scheme", "http"), (":path", path),
             (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")]
        ))  # fmt: skip

    async def frames(self, until: Callable[[int, int, int, bytes], bool]) -> list[Any]:
        """Frames read until `until(kind, flags, stream, payload)` holds (or the end)."""
        seen: list[Any] = []
        while True:
            try:
                head = await asyncio.wait_for(self.reader.readexactly(9), 5)
            except asyncio.IncompleteReadError:
                return seen
            high, low, kind, flags, stream = struct.unpack(">BHBBI", head)
            payload = await self.reader.readexactly((high << 16) | low)
            if kind == 1:  # headers: decoded
                seen.append((kind, flags, stream, dict(self.decoder.decode(payload, raw=True))))
            else:
                seen.append((kind, flags, stream, payload))
            if until(kind, flags, stream, payload):
                return seen

    def close(self) -> None:
        self.writer.close()


def _ended(stream: int) -> Callable[[int, int, int, bytes], bool]:
    return lambda kind, flags, s, _: kind == 1 and s == stream and bool(flags & 1)


def _goaway(kind: int, flags: int, stream: int, payload: bytes) -> bool:
    return kind == 7


def _message(payload: bytes) -> bytes:
    return struct.pack(">BI", 0, len(payload)) + payload


async def test_padding_continuation_and_pings_as_the_protocol_allows(served: Any) -> None:
    _, server, _ = served
    port = server._server.sockets[0].getsockname()[1]
    client = await _RawClient.connect(port)
    try:
        # HEADERS padded and with a priority, its block continued in CONTINUATION; the
        # message in a padded DATA frame.
        block = client.request_block("/t.S/Echo")
        head = bytes([3]) + b"\x00\x00\x00\x00\x10" + block[:5] + b"\x00" * 3
        client.writer.write(
            _raw_frame(1, 0x08 | 0x20, 1, head)  # PADDED | PRIORITY, no END_HEADERS
            + _raw_frame(9, 0x04, 1, block[5:])  # CONTINUATION, END_HEADERS
            + _raw_frame(6, 0, 0, b"pingpong")
            + _raw_frame(0, 0x08 | 0x01, 1, bytes([2]) + _message(b"padded") + b"\x00\x00")
        )
        frames = await client.frames(_ended(1))
        assert (6, 1, 0, b"pingpong") in frames  # the PING answered
        data = [f[3] for f in frames if f[0] == 0 and f[2] == 1]
        assert data == [_message(b"padded")]
        assert frames[-1][3][b"grpc-status"] == b"0"
    finally:
        client.close()


async def test_a_client_breaking_the_protocol_loses_only_its_own_connection(
    served: Any,
) -> None:
    _, server, channel = served
    port = server._server.sockets[0].getsockname()[1]
    echo = channel.unary_unary("/t.S/Echo")
    assert await echo(b"before") == b"before"
    breaches = [
        b"GET / HTTP/1.1\r\n\r\n",  # not HTTP/2
        _raw_frame(0, 0x01, 5, _message(b"x")),  # DATA on a stream never opened
        _raw_frame(1, 0x04, 2, b""),  # a client opening an even stream
        _raw_frame(1, 0x04, 1, b"\xff\xff\xff\xff"),  # a header block that is no HPACK
        _raw_frame(1, 0x00, 1, b"") + _raw_frame(6, 0, 0, b"pingpong"),  # block cut
        _raw_frame(0, 0, 1, b"x" * 20000),  # a frame above 16 KiB
    ]
    for breach in breaches:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client = _RawClient(reader, writer)
        try:
            preface = b"" if breach.startswith(b"GET") else _PREFACE + _raw_frame(4, 0, 0, b"")
            writer.write(preface + breach)
            frames = await client.frames(_goaway)
            assert frames[-1][0] == 7, breach
            code = struct.unpack(">I", frames[-1][3][4:8])[0]
            assert code != 0, breach
            assert await reader.read() == b""  # and the connection ends
        finally:
            client.close()
    assert await echo(b"after") == b"after"  # the well-behaved client never noticed


async def test_a_refused_stream_and_data_after_an_answer_keep_the_connection(
    served: Any,
) -> None:
    """A request bigger than the limit is answered while its bytes still come; those are
    dropped and the next call on the same connection is served."""
    _, server, _ = served
    port = server._server.sockets[0].getsockname()[1]
    client = await _RawClient.connect(port)
    try:
        big = _message(b"z" * (_MAX + 20000))  # refused at its 5th frame of 6
        client.writer.write(_raw_frame(1, 0x04, 1, client.request_block("/t.S/Echo")))
        for start in range(0, len(big), 16384):
            last = start + 16384 >= len(big)
            client.writer.write(_raw_frame(0, 0x01 if last else 0, 1, big[start : start + 16384]))
        client.writer.write(
            _raw_frame(1, 0x04, 3, client.request_block("/t.S/Echo"))
            + _raw_frame(0, 0x01, 3, _message(b"next"))
        )
        frames = await client.frames(_ended(3))
        ends = {f[2]: f[3] for f in frames if f[0] == 1 and f[1] & 1}
        assert ends[1][b"grpc-status"] == b"8"  # RESOURCE_EXHAUSTED
        assert ends[3][b"grpc-status"] == b"0"
        # A reset of 1's unread rest, if it still had one, says NO_ERROR; and no GOAWAY.
        assert all(f[3] == struct.pack(">I", 0) for f in frames if f[0] == 3)
        assert not [f for f in frames if f[0] == 7]
    finally:
        client.close()
