"""The gateway's gRPC server on h2, driven by a real `grpc.aio` client channel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from ballast.server.h2grpc import CallContext, H2GrpcServer

_MAX = 64 * 1024


class _Service:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.stream_closed = asyncio.Event()
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
    _, server, channel = served
    echo = channel.unary_unary("/t.S/Echo")
    assert await echo(b"before") == b"before"
    running = asyncio.ensure_future(channel.unary_unary("/t.S/Slow")(b"running"))
    await asyncio.sleep(0.1)
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
