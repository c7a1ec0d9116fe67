"""gRPC over HTTP/2 on asyncio: the gateway's client-facing server.

The gateway forwards bytes; what it costs is the server under it. `grpc.aio`'s server
spends most of its ~0.5 ms of CPU per unary call in its own machinery (a poller thread, a
task and several completion-queue hops per call) and writes each reply on its own, so the
client's channel wakes once per reply too; a general HTTP/2 library in Python (`h2`) still
spends ~0.2 ms per call in its state machines. This server speaks the part of HTTP/2 a
gRPC front needs and no more: one `asyncio.Protocol` per connection that cuts frames out
of what it reads, decodes request headers with `hpack` (the client's dynamic table), writes
its own few response header blocks as constant bytes (literals that never touch a
dynamic table), runs each call as a task and writes the replies of a loop iteration in
one socket write. Measured side by side in `benchmarks/bench_moves.py`.

It serves `grpc.RpcMethodHandler`s as `grpc.aio` does — unary-unary and unary-stream (all
the client protocol has), with their (de)serializers — and hands each a `CallContext`
with the part of `grpc.aio.ServicerContext` the gateway and its token check use
(`invocation_metadata`, `abort`, `peer`). Deadlines (``grpc-timeout``), cancellation
(RST_STREAM, a lost connection), flow control both ways, message and header size limits,
TLS with ALPN and a graceful stop (GOAWAY, then a grace period) are handled here; a
protocol error from a client ends its connection with GOAWAY and the error's code.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
import struct
from collections.abc import Callable
from typing import Any, NoReturn
from urllib.parse import quote

import grpc
import hpack

from ballast.server.errors import RpcFailure

__all__ = ["CallContext", "H2GrpcServer"]

log = logging.getLogger(__name__)

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Frame types and flags (RFC 9113 §6).
_DATA, _HEADERS, _PRIORITY, _RST_STREAM, _SETTINGS = 0, 1, 2, 3, 4
_PUSH_PROMISE, _PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = 5, 6, 7, 8, 9
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# Error codes.
_NO_ERROR, _PROTOCOL_ERROR, _FLOW_CONTROL_ERROR = 0, 1, 3
_FRAME_SIZE_ERROR, _REFUSED_STREAM, _COMPRESSION_ERROR = 6, 7, 9
# Settings.
_INITIAL_WINDOW_SIZE, _MAX_FRAME_SIZE, _MAX_CONCURRENT_STREAMS = 0x4, 0x5, 0x3

_FRAME = struct.Struct(">BHBBI")  # length (24 bits, as 8 + 16), type, flags, stream id
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")
_PREFIX = struct.Struct(">BI")  # a gRPC message: compressed flag, length

_MAX_FRAME = 16384  # what we accept (the protocol's default: not raised)
_DEFAULT_WINDOW = 65535
_WINDOW = 1 << 24  # what a connection may have in flight towards us (acked as read)
_STREAM_WINDOW = 1 << 20  # and each call
_MAX_STREAMS = 4096  # concurrent calls per connection (each consumer holds one stream)
_MAX_HEADER_BLOCK = 1 << 16  # bytes of one request's header block
_BUFFERED_MAX = 256 << 20  # request bytes of unfinished calls one connection may hold
_MAX_DETAILS = 4096  # bytes of a status message sent (one header frame in all)
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}

HandlerLookup = Callable[[str], Any]  # method -> grpc.RpcMethodHandler | None


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _FRAME.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


def _hpack_int(value: int, prefix: int, first: int = 0) -> bytes:
    """HPACK's integer (RFC 7541 §5.1) in a `prefix`-bit prefix, OR-ed into `first`."""
    limit = (1 << prefix) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header field literal without indexing, new name, no Huffman (§6.2.2)."""
    return b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value


# `:status: 200` (static index 8) and `content-type: application/grpc` (name index 31).
_RESPONSE_BLOCK = b"\x88" + _hpack_int(31, 4) + _hpack_int(16, 7) + b"application/grpc"
_OK_BLOCK = _literal(b"grpc-status", b"0")


def _status_block(code: grpc.StatusCode, details: str) -> bytes:
    block = _literal(b"grpc-status", str(code.value[0]).encode())
    if details:
        encoded = quote(details, safe=" ").encode()[:_MAX_DETAILS]
        block += _literal(b"grpc-message", encoded)
    return block


class _ConnectionError(Exception):
    """A protocol error: the connection ends with GOAWAY and `code`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class CallContext:
    """What a handler sees of its call (the subset of `grpc.aio.ServicerContext` used)."""

    __slots__ = ("_metadata", "_peer")

    def __init__(self, metadata: tuple[tuple[str, str | bytes], ...], peer: str) -> None:
        self._metadata = metadata
        self._peer = peer

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise RpcFailure(code, details, "aborted")


class _Call:
    __slots__ = (
        "body",
        "handler",
        "metadata",
        "method",
        "receiving",
        "sent",
        "stream_id",
        "task",
        "timeout",
        "unacked",
        "window",
    )

    def __init__(self, stream_id: int, window: int) -> None:
        self.stream_id = stream_id
        self.window = window  # what we may still send on this stream
        self.method = ""
        self.handler: Any = None
        self.body = bytearray()
        self.metadata: tuple[tuple[str, str | bytes], ...] = ()
        self.timeout: float | None = None
        self.task: asyncio.Task[None] | None = None
        self.receiving = True  # the client has not ended its side
        self.unacked = 0  # request bytes read and not yet given back in a WINDOW_UPDATE
        self.sent = False  # response headers written


class _Connection(asyncio.Protocol):
    def __init__(self, server: H2GrpcServer) -> None:
        self.server = server
        self.calls: dict[int, _Call] = {}
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.buffered = 0  # bytes of requests not yet whole
        self._in = bytearray()
        self._preface = False
        self._decoder = hpack.Decoder()
        self._block = bytearray()  # a header block continued in CONTINUATION frames
        self._block_stream = 0  # its stream (0: none pending)
        self._block_flags = 0
        self._last_stream = 0  # the highest stream the client opened
        self._send_window = _DEFAULT_WINDOW  # what we may still send on the connection
        self._stream_window = _DEFAULT_WINDOW  # the client's initial window per stream
        self._max_frame = _MAX_FRAME  # the largest frame the client takes
        self._recv_unacked = 0
        self._out: list[bytes] = []
        self._flush_due = False
        self._window = asyncio.Event()  # set (and replaced) when a send window grows

    # -- the socket ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"ipv4:{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.server.connections.add(self)
        settings = _SETTING.pack(_INITIAL_WINDOW_SIZE, _STREAM_WINDOW) + _SETTING.pack(
            _MAX_CONCURRENT_STREAMS, _MAX_STREAMS
        )
        self._out.append(_frame(_SETTINGS, 0, 0, settings))
        self._out.append(_frame(_WINDOW_UPDATE, 0, 0, _U32.pack(_WINDOW - _DEFAULT_WINDOW)))
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        for call in self.calls.values():
            if call.task is not None:
                call.task.cancel()
        self.calls.clear()
        self._wake_writers()

    def data_received(self, data: bytes) -> None:
        buf = self._in
        buf += data
        try:
            if not self._preface:
                if len(buf) < len(_PREFACE):
                    if not _PREFACE.startswith(bytes(buf)):
                        raise _ConnectionError(_PROTOCOL_ERROR, "not an HTTP/2 connection")
                    return
                if buf[: len(_PREFACE)] != _PREFACE:
                    raise _ConnectionError(_PROTOCOL_ERROR, "not an HTTP/2 connection")
                del buf[: len(_PREFACE)]
                self._preface = True
            pos, end = 0, len(buf)
            while end - pos >= 9:
                high, low, kind, flags, stream_id = _FRAME.unpack_from(buf, pos)
                size = (high << 16) | low
                if size > _MAX_FRAME:
                    raise _ConnectionError(_FRAME_SIZE_ERROR, f"a frame of {size} bytes")
                if end - pos - 9 < size:
                    break
                payload = bytes(buf[pos + 9 : pos + 9 + size])
                pos += 9 + size
                self._frame_in(kind, flags, stream_id & 0x7FFFFFFF, payload)
            del buf[:pos]
        except _ConnectionError as exc:
            self._fail(exc.code, str(exc))
            return
        self._flush()

    def _fail(self, code: int, message: str) -> None:
        log.info("gateway: HTTP/2 error from %s: %s; closing the connection", self.peer, message)
        self._out.append(_frame(_GOAWAY, 0, 0, _U32.pack(self._last_stream) + _U32.pack(code)))
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def _flush(self) -> None:
        self._flush_due = False
        if self._out:
            data = b"".join(self._out)
            self._out.clear()
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(data)

    def _flush_soon(self) -> None:
        """Write at the end of this loop iteration: the replies made in it go together."""
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _wake_writers(self) -> None:
        self._window.set()
        self._window = asyncio.Event()

    # -- frames in -------------------------------------------------------------------------

    def _frame_in(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block_stream and (kind != _CONTINUATION or stream_id != self._block_stream):
            raise _ConnectionError(_PROTOCOL_ERROR, "a header block cut by another frame")
        if kind == _DATA:
            self._data(flags, stream_id, payload)
        elif kind == _HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == _CONTINUATION:
            if not self._block_stream:
                raise _ConnectionError(_PROTOCOL_ERROR, "CONTINUATION without HEADERS")
            self._block += payload
            if len(self._block) > _MAX_HEADER_BLOCK:
                raise _ConnectionError(_PROTOCOL_ERROR, "a header block above 64 KiB")
            if flags & _END_HEADERS:
                block, self._block = bytes(self._block), bytearray()
                stream_id, self._block_stream = self._block_stream, 0
                self._request(self._block_flags, stream_id, block)
        elif kind == _WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == _SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == _PING:
            if len(payload) != 8 or stream_id:
                raise _ConnectionError(_FRAME_SIZE_ERROR, "a malformed PING")
            if not flags & _ACK:
                self._out.append(_frame(_PING, _ACK, 0, payload))
        elif kind == _RST_STREAM:
            call = self.calls.pop(stream_id, None)
            if call is not None:
                self._forget_body(call)
                if call.task is not None:
                    call.task.cancel()
        elif kind == _PUSH_PROMISE:
            raise _ConnectionError(_PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        # PRIORITY, GOAWAY (the client leaves; its calls run out) and unknown types: nothing.

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0 or stream_id % 2 == 0:
            raise _ConnectionError(_PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        start, end = 0, len(payload)
        if flags & _PADDED:
            if not payload:
                raise _ConnectionError(_PROTOCOL_ERROR, "padded HEADERS without a pad length")
            start, end = 1, end - payload[0]
        if flags & _PRIORITY_FLAG:
            start += 5
        if start > end:
            raise _ConnectionError(_PROTOCOL_ERROR, "HEADERS padding longer than the frame")
        block = payload[start:end]
        if flags & _END_HEADERS:
            self._request(flags, stream_id, block)
        else:
            self._block = bytearray(block)
            self._block_stream = stream_id
            self._block_flags = flags

    def _request(self, flags: int, stream_id: int, block: bytes) -> None:
        try:
            headers = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise _ConnectionError(_COMPRESSION_ERROR, f"header block: {exc}") from None
        call = self.calls.get(stream_id)
        if call is not None:  # trailers from a client: the end of its side
            if flags & _END_STREAM:
                self._ended(call)
            return
        if stream_id <= self._last_stream:
            raise _ConnectionError(_PROTOCOL_ERROR, f"stream {stream_id} reused")
        self._last_stream = stream_id
        if len(self.calls) >= _MAX_STREAMS:
            self._out.append(_frame(_RST_STREAM, 0, stream_id, _U32.pack(_REFUSED_STREAM)))
            return
        call = _Call(stream_id, self._stream_window)
        path = b""
        metadata: list[tuple[str, str | bytes]] = []
        for key, value in headers:
            if key[:1] == b":":
                if key == b":path":
                    path = value
            elif key == b"grpc-timeout":
                call.timeout = _timeout(value)
            elif key not in (b"te", b"content-type"):
                name = key.decode("latin-1")
                if name.endswith("-bin"):
                    metadata.append((name, base64.b64decode(value + b"==")))
                else:
                    metadata.append((name, value.decode("latin-1")))
        call.method = path.decode("latin-1")
        call.handler = self.server.handler(call.method)
        call.metadata = tuple(metadata)
        self.calls[stream_id] = call
        if flags & _END_STREAM:
            self._ended(call)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise _ConnectionError(_PROTOCOL_ERROR, "DATA on stream 0")
        self._recv_unacked += len(payload)
        if self._recv_unacked >= _WINDOW // 2:
            self._out.append(_frame(_WINDOW_UPDATE, 0, 0, _U32.pack(self._recv_unacked)))
            self._recv_unacked = 0
        call = self.calls.get(stream_id)
        if call is None or not call.receiving:
            if stream_id > self._last_stream:
                raise _ConnectionError(_PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return  # a call answered or reset already: its remaining bytes go unread
        data = payload
        if flags & _PADDED:
            if not payload or payload[0] >= len(payload):
                raise _ConnectionError(_PROTOCOL_ERROR, "DATA padding longer than the frame")
            data = payload[1 : len(payload) - payload[0]]
        call.body += data
        self.buffered += len(data)
        if len(call.body) > self.server.max_receive + _PREFIX.size:
            self._refuse(
                call,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({len(call.body) - _PREFIX.size} vs. "
                f"{self.server.max_receive})",
            )
            return
        if self.buffered > _BUFFERED_MAX:
            self._refuse(
                call,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this connection has {self.buffered} bytes of unfinished requests; "
                f"at most {_BUFFERED_MAX}",
            )
            return
        if flags & _END_STREAM:
            self._ended(call)
            return
        call.unacked += len(payload)
        if call.unacked >= _STREAM_WINDOW // 2:
            self._out.append(_frame(_WINDOW_UPDATE, 0, stream_id, _U32.pack(call.unacked)))
            call.unacked = 0

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(_FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            self._send_window += increment
            if self._send_window > 0x7FFFFFFF:
                raise _ConnectionError(_FLOW_CONTROL_ERROR, "connection window above 2^31-1")
        else:
            call = self.calls.get(stream_id)
            if call is None:
                return
            call.window += increment
        self._wake_writers()

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise _ConnectionError(_PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & _ACK:
            return
        if len(payload) % 6:
            raise _ConnectionError(_FRAME_SIZE_ERROR, "a malformed SETTINGS")
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == _INITIAL_WINDOW_SIZE:
                if value > 0x7FFFFFFF:
                    raise _ConnectionError(_FLOW_CONTROL_ERROR, "initial window above 2^31-1")
                delta, self._stream_window = value - self._stream_window, value
                for call in self.calls.values():
                    call.window += delta
            elif key == _MAX_FRAME_SIZE:
                if not _MAX_FRAME <= value <= (1 << 24) - 1:
                    raise _ConnectionError(_PROTOCOL_ERROR, f"max frame size {value}")
                self._max_frame = value
        self._out.append(_frame(_SETTINGS, _ACK, 0))
        self._wake_writers()

    # -- requests --------------------------------------------------------------------------

    def _forget_body(self, call: _Call) -> None:
        self.buffered -= len(call.body)
        call.body = bytearray()

    def _ended(self, call: _Call) -> None:
        """The client's side of `call` is complete: run it."""
        call.receiving = False
        body = call.body
        if call.handler is None:
            self._refuse(call, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {call.method}")
            return
        if len(body) < _PREFIX.size:
            self._refuse(call, grpc.StatusCode.INTERNAL, "the request carries no message")
            return
        compressed, size = _PREFIX.unpack_from(body)
        if compressed:
            self._refuse(call, grpc.StatusCode.UNIMPLEMENTED, "compressed messages are not served")
            return
        if size != len(body) - _PREFIX.size:
            self._refuse(call, grpc.StatusCode.INTERNAL, "the request is not one whole message")
            return
        request = bytes(body[_PREFIX.size :])
        self._forget_body(call)
        call.task = asyncio.get_running_loop().create_task(self._serve(call, request))

    def _refuse(self, call: _Call, code: grpc.StatusCode, details: str) -> None:
        """Answer a call that never reaches a handler, and forget it."""
        self.calls.pop(call.stream_id, None)
        self._forget_body(call)
        self._finish(call, code, details)
        if call.receiving:  # stop the rest of its request (RFC 9113 §8.1)
            call.receiving = False
            self._out.append(_frame(_RST_STREAM, 0, call.stream_id, _U32.pack(_NO_ERROR)))
        self._flush_soon()

    # -- serving a call --------------------------------------------------------------------

    async def _serve(self, call: _Call, request: bytes) -> None:
        handler = call.handler
        context = CallContext(call.metadata, self.peer)
        try:
            async with asyncio.timeout(call.timeout):
                if handler.request_deserializer is not None:
                    request = handler.request_deserializer(request)
                encode = handler.response_serializer
                if handler.unary_unary is not None:
                    reply = await handler.unary_unary(request, context)
                    await self._message(call, encode(reply) if encode else reply)
                else:
                    stream = handler.unary_stream(request, context)
                    async with contextlib.aclosing(stream):
                        async for item in stream:
                            await self._message(call, encode(item) if encode else item)
            self._finish(call, grpc.StatusCode.OK, "")
        except RpcFailure as exc:  # an abort, or a handler's own failure
            self._finish(call, exc.code, exc.message)
        except TimeoutError:
            self._finish(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except asyncio.CancelledError:
            if self.calls.get(call.stream_id) is not call:
                return  # the client reset the stream or went: nobody to answer
            raise
        except Exception as exc:
            log.exception("gateway: %s failed", call.method)
            self._finish(call, grpc.StatusCode.UNKNOWN, f"Unexpected error: {exc!r}")
        finally:
            if self.calls.get(call.stream_id) is call:
                del self.calls[call.stream_id]
        self._flush_soon()

    async def _message(self, call: _Call, message: bytes) -> None:
        """One response message, within the client's flow-control windows."""
        sid = call.stream_id
        if not call.sent:
            call.sent = True
            self._out.append(_frame(_HEADERS, _END_HEADERS, sid, _RESPONSE_BLOCK))
        data = _PREFIX.pack(0, len(message)) + message
        while data:
            if self.calls.get(sid) is not call:
                raise asyncio.CancelledError  # reset while waiting for a window
            window = min(self._send_window, call.window)
            if window <= 0:
                self._flush()
                await self._window.wait()
                continue
            size = min(len(data), window, self._max_frame)
            chunk, data = data[:size], data[size:]
            self._out.append(_frame(_DATA, 0, sid, chunk))
            self._send_window -= size
            call.window -= size
        self._flush_soon()

    def _finish(self, call: _Call, code: grpc.StatusCode, details: str) -> None:
        if code is grpc.StatusCode.OK and call.sent:
            block = _OK_BLOCK
        elif call.sent:
            block = _status_block(code, details)
        else:  # trailers only
            block = _RESPONSE_BLOCK + _status_block(code, details)
        call.sent = True
        self._out.append(_frame(_HEADERS, _END_HEADERS | _END_STREAM, call.stream_id, block))

    # -- stopping --------------------------------------------------------------------------

    def goaway(self) -> None:
        """Tell the client to open no more calls here; those running go on."""
        self._out.append(_frame(_GOAWAY, 0, 0, _U32.pack(self._last_stream) + _U32.pack(0)))
        self._flush()

    def abort(self) -> None:
        for call in list(self.calls.values()):
            if call.task is not None:
                call.task.cancel()
        self._flush()
        if self.transport is not None:
            self.transport.close()


def _timeout(value: bytes) -> float | None:
    """``grpc-timeout``: digits and a unit (H M S m u n); None when malformed."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    if unit is None or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * unit


class H2GrpcServer:
    """Serves the handlers `handler(method)` returns on one address."""

    def __init__(
        self, handler: HandlerLookup, *, max_receive: int, ssl_context: ssl.SSLContext | None
    ) -> None:
        self.handler = handler
        self.max_receive = max_receive
        self.ssl_context = ssl_context
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(["h2"])  # gRPC clients insist on it
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; the port bound (`OSError` when the address is taken)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, ssl=self.ssl_context, reuse_port=False
        )
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def stop(self, grace: float) -> None:
        """Stop taking connections, tell the clients (GOAWAY), give running calls `grace`
        seconds, then end them."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for connection in list(self.connections):
            connection.goaway()
        deadline = asyncio.get_running_loop().time() + grace
        while any(c.calls for c in self.connections):
            if asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            connection.abort()
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
