"""The wire layer's own limits, on a server in this process with limits small enough to
reach: connections in all and per peer, the write buffer's hard limit, the calls running
at once, streaming requests larger than a window, and the config that sets them."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from typing import Any

import grpc
import hpack
import pytest

from ballast.config import ConfigError, parse_config
from ballast.wire.h2grpc import CallContext, H2GrpcServer, WireLimits
from tests.wire.clients import (
    ACK,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PREFACE,
    SETTINGS,
    WINDOW_UPDATE,
    RawClient,
    frame,
    header_block,
    message,
    unread_socket,
)

pytestmark = pytest.mark.timeout(60)


class _Service:
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.handlers = {
            "/t.S/Echo": grpc.unary_unary_rpc_method_handler(self.echo),
            "/t.S/Wait": grpc.unary_unary_rpc_method_handler(self.wait),
            "/t.S/Big": grpc.unary_stream_rpc_method_handler(self.big),
            "/t.S/Chat": grpc.stream_stream_rpc_method_handler(self.chat),
        }

    async def echo(self, request: bytes, context: CallContext) -> bytes:
        return request

    async def wait(self, request: bytes, context: CallContext) -> bytes:
        await self.release.wait()
        return request

    async def big(self, request: bytes, context: CallContext) -> AsyncIterator[bytes]:
        for _ in range(64):
            yield b"b" * (1 << 20)

    async def chat(self, requests: AsyncIterator[bytes], context: CallContext) -> Any:
        async for request in requests:
            yield len(request).to_bytes(8, "big") + request[:4]


async def _serve(limits: WireLimits, **options: Any) -> tuple[_Service, H2GrpcServer, str]:
    service = _Service()
    server = H2GrpcServer(
        service.handlers.get, max_receive=8 << 20, ssl_context=None, limits=limits, **options
    )
    port = await server.start("127.0.0.1", 0)
    return service, server, f"127.0.0.1:{port}"


async def _served(client: RawClient) -> bool:
    """Whether the server speaks HTTP/2 on this connection (its SETTINGS come)."""
    try:
        async with asyncio.timeout(5):
            head = await client.reader.readexactly(9)
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    return head[3] == SETTINGS


async def test_connections_beyond_the_per_peer_and_total_limits_are_closed() -> None:
    _, server, url = await _serve(WireLimits(max_connections_per_peer=3, max_connections=5))
    try:
        first = [await RawClient.connect(url) for _ in range(3)]
        assert all([await _served(c) for c in first])
        extra = await RawClient.connect(url)
        assert not await _served(extra)  # a fourth from the same address
        assert server.counts["connections_refused_peer"] == 1
        first[0].close()
        async with asyncio.timeout(5):
            while len(server.connections) > 2:  # its slot is given back
                await asyncio.sleep(0.01)
        again = await RawClient.connect(url)
        assert await _served(again)
        for client in [*first, extra, again]:
            client.close()
    finally:
        await server.stop(0)
    _, server, url = await _serve(WireLimits(max_connections=2))
    try:
        clients = [await RawClient.connect(url) for _ in range(3)]
        assert [await _served(c) for c in clients] == [True, True, False]
        assert server.counts["connections_refused"] == 1
        for client in clients:
            client.close()
    finally:
        await server.stop(0)


async def test_a_client_that_never_reads_a_stream_is_closed_past_the_hard_limit() -> None:
    """It opens large windows and reads nothing: the server stops reading it, its handler
    waits, and once the bytes written for it pass the hard limit the connection is closed."""
    limits = WireLimits(write_buffer_high_bytes=16 << 10, write_buffer_max_bytes=256 << 10)
    _, server, url = await _serve(limits)
    try:
        sock = unread_socket(url)
        encoder = hpack.Encoder()
        big_window = struct.pack(">HI", 4, (1 << 31) - 1)
        sock.sendall(
            PREFACE
            + frame(SETTINGS, 0, 0, big_window)
            + frame(SETTINGS, ACK, 0)
            + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", (1 << 31) - 1 - 65535))
            + frame(HEADERS, END_HEADERS, 1, header_block(encoder, "/t.S/Big"))
            + frame(DATA, END_STREAM, 1, message(b""))
        )
        async with asyncio.timeout(10):
            while "write_buffer_closed" not in server.counts:
                await asyncio.sleep(0.02)
        assert server.counts.get("write_paused", 0) >= 1
        sock.close()
        async with asyncio.timeout(5):
            while server.connections:
                await asyncio.sleep(0.02)
    finally:
        await server.stop(0)


async def test_calls_beyond_the_servers_limit_are_refused_resource_exhausted() -> None:
    service, server, url = await _serve(WireLimits(), max_calls=1)
    channel = grpc.aio.insecure_channel(url)
    try:
        waiting = asyncio.ensure_future(channel.unary_unary("/t.S/Wait")(b"first"))
        async with asyncio.timeout(5):
            while server.running < 1:
                await asyncio.sleep(0.01)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await channel.unary_unary("/t.S/Echo")(b"second")
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert server.counts["calls_refused"] == 1
        service.release.set()
        assert await waiting == b"first"
        assert await channel.unary_unary("/t.S/Echo")(b"third") == b"third"
    finally:
        await channel.close()
        await server.stop(0)


async def test_a_streaming_request_carries_messages_larger_than_its_window() -> None:
    """The gateways' link streams: messages each way, some above the 1 MiB stream window
    (credit is given for a message still coming, not only for whole ones)."""
    _, server, url = await _serve(WireLimits())
    channel = grpc.aio.insecure_channel(url, options=[("grpc.max_send_message_length", 8 << 20)])
    try:
        sizes = [10, 3 << 20, 0, 70_000, 5 << 20, 1]

        async def requests() -> AsyncIterator[bytes]:
            for size in sizes:
                yield bytes([size % 251]) * size

        call = channel.stream_stream("/t.S/Chat")(requests())
        replies = [reply async for reply in call]
        assert [int.from_bytes(r[:8], "big") for r in replies] == sizes
        assert server.budget.used == 0  # nothing held once the call ended
    finally:
        await channel.close()
        await server.stop(0)


async def test_a_request_whose_message_never_arrives_is_refused_and_its_bytes_go_back() -> None:
    """Slowloris on a stream: headers and half a message, then nothing."""
    _, server, url = await _serve(WireLimits(handshake_timeout_seconds=0.3))
    client = await RawClient.connect(url)
    try:
        client.write(
            frame(HEADERS, END_HEADERS, 1, client.block("/t.S/Echo"))
            + frame(DATA, 0, 1, struct.pack(">BI", 0, 1000) + b"x" * 500)
        )
        async with asyncio.timeout(5):
            while server.budget.used == 0:  # held while it comes
                await asyncio.sleep(0.01)
            while "request_timeout" not in server.counts:
                await asyncio.sleep(0.02)
        assert server.budget.used == 0
        client.write(
            frame(HEADERS, END_HEADERS, 3, client.block("/t.S/Echo"))
            + frame(DATA, END_STREAM, 3, message(b"next"))
        )  # the connection goes on
        statuses: dict[int, bytes] = {}
        decoder = hpack.Decoder()
        async with asyncio.timeout(5):
            while 3 not in statuses:
                head = await client.reader.readexactly(9)
                high, low, kind, flags, stream = struct.unpack(">BHBBI", head)
                payload = await client.reader.readexactly((high << 16) | low)
                if kind == HEADERS:  # every block decoded: HPACK's table is shared
                    headers = dict(decoder.decode(payload, raw=True))
                    if flags & END_STREAM:
                        statuses[stream] = headers[b"grpc-status"]
        assert statuses == {1: b"4", 3: b"0"}  # DEADLINE_EXCEEDED, then OK
    finally:
        client.close()
        await server.stop(0)


def test_the_wire_section_is_checked_and_reaches_the_limits() -> None:
    config = parse_config({"wire": {"max_resets_per_second": 7, "idle_timeout_seconds": 0}})
    limits = WireLimits.of(config.wire)
    assert limits.max_resets_per_second == 7 and limits.idle_timeout_seconds == 0
    assert WireLimits.of(parse_config({}).wire) == WireLimits()  # the same defaults
    with pytest.raises(ConfigError, match="write_buffer_max_bytes"):
        parse_config(
            {"wire": {"write_buffer_high_bytes": 1 << 20, "write_buffer_max_bytes": 1 << 19}}
        )
    with pytest.raises(ConfigError, match="max_concurent"):
        parse_config({"wire": {"max_concurent_streams": 10}})
