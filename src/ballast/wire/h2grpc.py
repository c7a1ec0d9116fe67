"""gRPC over HTTP/2 on asyncio, on libnghttp2: the wire layer of the client-facing ports.

HTTP/2 itself (framing, HPACK, stream states, flow-control arithmetic, the checks against
CONTINUATION floods, HPACK bombs, oversized SETTINGS and protocol garbage) is libnghttp2's,
through the `ngh2` bindings: a sans-I/O engine, fed the bytes one `asyncio.Protocol` per
connection reads, whose events (a request's headers, its data, a reset, a close) come out
as Python objects and whose output is written in one socket write per loop iteration. The
same engine runs under curl, Apache httpd and Envoy, and ngh2 runs h2spec in its own CI: a
front written by hand took years of CVEs everywhere it was tried (issue 37). Measured
against `grpc.aio` and the `h2` package in `benchmarks/bench_grpc_floor.py`.

This module owns what gRPC adds and what a public port must refuse:

- gRPC: `grpc.RpcMethodHandler`s served as `grpc.aio` does — unary-unary and unary-stream
  (all the client protocol has), with their (de)serializers — each handed a `CallContext`
  (`invocation_metadata`, `abort`, `peer`); message prefixes and size limits, deadlines
  (``grpc-timeout``), cancellation (RST_STREAM, a lost connection), status trailers,
  TLS with ALPN and a graceful stop (GOAWAY, then a grace period).
- Malformed input is a stream error: a bad ``grpc-timeout``, undecodable ``-bin``
  metadata, a request that does not parse, an unknown method — each gets its gRPC status
  on its own stream, counted, with no traceback and no echo of the client's bytes beyond a
  short sanitised prefix; the connection and its other calls go on.
- Connection-level protections (`WireLimits`, the config's `wire` section), each counted
  in `H2GrpcServer.counts`: resets per second (rapid reset → GOAWAY ENHANCE_YOUR_CALM),
  SETTINGS entries and frames per second, concurrent streams, a client that does not read
  (reading pauses above the transport's high-water mark, the connection closes above a
  hard limit), request bytes held across all connections (flow-control credit only while
  they may still be buffered), connections in all and per peer, and the handshake (first
  request) and idle timeouts.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import re
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import quote

import grpc
import ngh2
from google.protobuf.message import DecodeError

from ballast.wire.errors import RpcFailure

if TYPE_CHECKING:
    from ballast.config import WireSettings

__all__ = ["CallContext", "H2GrpcServer", "RequestBudget", "WireLimits"]

log = logging.getLogger(__name__)

_PREFIX = struct.Struct(">BI")  # a gRPC message: compressed flag, length
_GOAWAY_FRAME = struct.Struct(">BHBBIII")  # a GOAWAY written when the engine cannot
_STREAM_WINDOW = 1 << 20  # what each call may have in flight towards us
_CONN_WINDOW = 4 << 20  # and a whole connection
_STREAM_QUEUE = 256 << 10  # response bytes one call may queue before its handler waits
_CONN_QUEUE = 8 << 20  # and all calls of a connection
_SLICE = 16 << 10  # bytes fed to the engine at a time
_EVENTS_PER_TURN = 256  # after a slice with more events, other connections get a turn
_LINGER = 1.0  # seconds a closed connection's late bytes are read and dropped
_LINGER_BYTES = 256 << 10  # and how many at most (a flood stops being read at once)
_MAX_DETAILS = 1024  # bytes of a status message sent
_ECHO = 64  # characters of a client's input an error answer may quote
_TIMEOUT = re.compile(rb"^([0-9]{1,8})([HMSmun])$")  # gRPC's spec: at most 8 digits
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_UNPRINTABLE = re.compile(r"[^\x21-\x7e]")
_NO_ERROR = int(ngh2.ErrorCode.NO_ERROR)
_CALM = int(ngh2.ErrorCode.ENHANCE_YOUR_CALM)

_RESPONSE = ((b":status", b"200"), (b"content-type", b"application/grpc"))
_NO_DEADLINE = contextlib.nullcontext()  # reusable: it holds no state
_OK = ((b"grpc-status", b"0"),)

HandlerLookup = Callable[[str], Any]  # method -> grpc.RpcMethodHandler | None


@dataclass(frozen=True)
class WireLimits:
    """The protections of one port (the config's `wire` section; see `WireSettings`)."""

    max_concurrent_streams: int = 4096
    max_resets_per_second: int = 200
    max_settings_entries: int = 32
    max_settings_per_second: int = 20
    write_buffer_high_bytes: int = 1 << 20
    write_buffer_max_bytes: int = 64 << 20
    request_budget_bytes: int = 256 << 20
    max_connections: int = 10_000
    max_connections_per_peer: int = 2_000
    handshake_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 600.0
    max_header_list_bytes: int = 64 << 10

    @classmethod
    def of(cls, settings: WireSettings) -> WireLimits:
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls)})


def sanitised(text: str, limit: int = _ECHO) -> str:
    """At most `limit` printable ASCII characters of client input, for an error answer."""
    shown = _UNPRINTABLE.sub("?", text[:limit])
    return shown + ("…" if len(text) > limit else "")


class RequestBudget:
    """Bytes of unfinished requests held across every connection of a port.

    A request that would take it past `limit` is refused; flow-control credit for bytes
    read is given back at once only while a whole stream window more would still fit, else
    when held bytes are released (so what clients may send stays what may be buffered).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.waiting: set[_Connection] = set()  # connections owed credit

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def roomy(self) -> bool:
        return self.limit - self.used >= _STREAM_WINDOW

    def release(self, size: int) -> None:
        self.used -= size
        if self.waiting and self.roomy():
            for connection in list(self.waiting):
                connection.repay()


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
        "held",
        "inbox",
        "metadata",
        "method",
        "owed",
        "receiving",
        "seen",
        "sent",
        "stream_id",
        "task",
        "timeout",
    )

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id
        self.method = ""
        self.handler: Any = None
        self.body = bytearray()
        self.metadata: tuple[tuple[str, str | bytes], ...] = ()
        self.timeout: float | None = None
        self.task: asyncio.Task[None] | None = None
        self.receiving = True  # the client has not ended its side
        self.held = 0  # request bytes held against the port's budget
        self.owed = 0  # of them, read and not yet given back as flow-control credit
        self.sent = False  # response headers queued
        # A streaming request's whole messages, for its handler (None: the end).
        self.inbox: asyncio.Queue[bytes | None] | None = None
        self.seen = 0.0  # when the sweeper first saw its request unfinished (0: not yet)


class _Bucket:
    """A token bucket: `rate` events per second, as many at once."""

    __slots__ = ("last", "rate", "tokens")

    def __init__(self, rate: int, now: float) -> None:
        self.rate = float(rate)
        self.tokens = float(rate)
        self.last = now

    def spend(self, now: float) -> bool:
        """False once the events come faster than the rate allows."""
        self.tokens = min(self.rate, self.tokens + (now - self.last) * self.rate)
        self.last = now
        self.tokens -= 1.0
        return self.tokens >= 0


class _Connection(asyncio.Protocol):
    def __init__(self, server: H2GrpcServer) -> None:
        self.server = server
        self.limits = server.limits
        self.loop = asyncio.get_running_loop()
        self.h2 = ngh2.Connection(ngh2.Role.SERVER, server.engine)
        self.calls: dict[int, _Call] = {}
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.peer_host = ""
        self.admitted = False
        self.closed = False
        self.requests = 0  # requests seen (the sweeper's idea of activity)
        self.opened = self.loop.time()
        self.last_stream = 0  # the highest stream the client opened
        self._paused = False  # the client does not take what is written: reading paused
        self._flush_due = False
        self._progress = asyncio.Event()  # set (and replaced) when output moves on
        self._waiting = 0  # handlers waiting for it (most flushes have none)
        self._resets = _Bucket(self.limits.max_resets_per_second, self.opened)
        self._settings = _Bucket(self.limits.max_settings_per_second, self.opened)
        self._reset_after: list[int] = []  # answered calls whose unread rest gets RST_STREAM
        self._dropped = 0  # bytes read after the connection was closed
        self._holding = False  # the rest of a read waits for the next loop turn

    # -- the socket ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer_host = str(peer[0])
            kind = "ipv6" if ":" in self.peer_host else "ipv4"
            self.peer = f"{kind}:{peer[0]}:{peer[1]}"
        else:
            self.peer = self.peer_host = str(peer)
        if not self.server.admit(self):
            self.closed = True
            transport.abort()
            return
        self.admitted = True
        high = self.limits.write_buffer_high_bytes
        transport.set_write_buffer_limits(high=high, low=high // 4)
        h2 = self.h2
        h2.initiate_connection(
            {
                ngh2.Setting.MAX_CONCURRENT_STREAMS: self.limits.max_concurrent_streams,
                ngh2.Setting.INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
                ngh2.Setting.MAX_HEADER_LIST_SIZE: self.limits.max_header_list_bytes,
            }
        )
        h2.set_local_window_size(_CONN_WINDOW)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.admitted:
            self.server.release(self)
            self.admitted = False
        budget = self.server.budget
        budget.waiting.discard(self)
        for call in self.calls.values():
            if call.task is not None:
                call.task.cancel()
            if call.held:
                budget.release(call.held)
                call.held = 0
        self.calls.clear()
        self._wake()

    def pause_writing(self) -> None:
        """The client is not taking what we write: stop reading what it sends (its PINGs,
        SETTINGS and requests would each add an answer) until it catches up."""
        self._paused = True
        self.server.count("write_paused")
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self.transport is not None and not self.closed and not self._holding:
            self.transport.resume_reading()
        self._flush()

    def data_received(self, data: bytes) -> None:
        if self.closed:  # lingering (see `_close`): dropped, within a bound
            self._dropped += len(data)
            if self._dropped > _LINGER_BYTES and self.transport is not None:
                self.transport.abort()
            return
        self._feed(memoryview(data))

    def _feed(self, data: memoryview) -> None:
        """Feed the engine a slice at a time. After a slice that made many events the rest
        waits for the loop's next turn, reading paused: one connection's flood of small
        requests (a read can hold tens of thousands) does not hold the loop for a whole
        read while other clients wait."""
        h2 = self.h2
        start, size = 0, len(data)
        while start < size:
            piece = data[start : start + _SLICE]
            start += _SLICE
            try:
                h2.receive_data(piece)
            except ngh2.DenialOfServiceError:
                self._failed("flood", _CALM)
                return
            except ngh2.NGH2Error:
                self._failed("protocol_error", int(ngh2.ErrorCode.PROTOCOL_ERROR))
                return
            events = h2.events()
            self._events(events)
            if self.closed:
                return
            if len(events) > _EVENTS_PER_TURN and start < size:
                self._flush()
                assert self.transport is not None
                self._holding = True
                self.transport.pause_reading()
                self.loop.call_soon(self._feed_rest, data[start:])
                return
        self._flush()

    def _feed_rest(self, data: memoryview) -> None:
        self._holding = False
        if self.closed:
            return
        if not self._paused and self.transport is not None:
            self.transport.resume_reading()
        self._feed(data)

    def _failed(self, what: str, code: int) -> None:
        """The engine gave up on the connection: its last words (or a GOAWAY), then close."""
        self.server.count(what)
        log.debug("wire: %s from %s; closing the connection", what, self.peer)
        try:
            out = self.h2.data_to_send()
        except ngh2.NGH2Error:
            out = _GOAWAY_FRAME.pack(0, 8, 7, 0, 0, self.last_stream, code)
        self._close(out)

    def _close(self, last: bytes = b"") -> None:
        self.closed = True
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if self._paused:  # a client that does not read would hold the close for ever
                transport.abort()
            elif transport.can_write_eof() and not self.server.stopping:
                # Our side ends after the last words; what the client still sends is read
                # and dropped for a moment: closing with unread bytes would reset the
                # connection and the client could lose the GOAWAY saying why.
                if last:
                    transport.write(last)
                try:
                    transport.write_eof()
                except OSError:  # the client is gone already
                    transport.abort()
                    return
                self.loop.call_later(_LINGER, transport.close)
            else:
                if last:
                    transport.write(last)
                transport.close()
        self._wake()

    def _calm(self, what: str) -> None:
        """GOAWAY with ENHANCE_YOUR_CALM: the client went past one of the limits."""
        self.server.count(what)
        log.debug("wire: %s from %s; GOAWAY ENHANCE_YOUR_CALM", what, self.peer)
        with contextlib.suppress(ngh2.NGH2Error):
            self.h2.terminate_connection(_CALM, last_stream_id=self.last_stream)
        self._failed_quietly()

    def _failed_quietly(self) -> None:
        try:
            out = self.h2.data_to_send()
        except ngh2.NGH2Error:
            out = _GOAWAY_FRAME.pack(0, 8, 7, 0, 0, self.last_stream, _CALM)
        for call in self.calls.values():
            if call.task is not None:
                call.task.cancel()
        self._close(out)

    def _flush(self) -> None:
        """Write what the engine has ready (unless the client is not reading)."""
        self._flush_due = False
        if self.closed or self._paused:
            return
        h2 = self.h2
        try:
            out = h2.data_to_send()
        except ngh2.NGH2Error:
            self._close()
            return
        events = h2.events()
        transport = self.transport
        assert transport is not None
        if out:
            transport.write(out)
        if self._reset_after:
            for stream_id in self._reset_after:
                with contextlib.suppress(ngh2.NGH2Error):
                    h2.reset_stream(stream_id, _NO_ERROR)
            self._reset_after.clear()
            with contextlib.suppress(ngh2.NGH2Error):
                out = h2.data_to_send()
                if out:
                    transport.write(out)
                events += h2.events()
        if events:
            self._events(events)
        if transport.get_write_buffer_size() > self.limits.write_buffer_max_bytes:
            self.server.count("write_buffer_closed")
            transport.abort()
            self.closed = True
        self._wake()

    def flush_soon(self) -> None:
        """Write at the end of this loop iteration: the replies made in it go together."""
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush)

    def _wake(self) -> None:
        if self._waiting:
            self._progress.set()
            self._progress = asyncio.Event()

    # -- events ----------------------------------------------------------------------------

    def _events(self, events: list[ngh2.Event]) -> None:
        for event in events:
            kind = type(event)
            if kind is ngh2.DataReceived:
                self._data(event)  # type: ignore[arg-type]
            elif kind is ngh2.RequestReceived:
                self._request(event)  # type: ignore[arg-type]
            elif kind is ngh2.StreamClosed:
                self._stream_closed(event.stream_id)  # type: ignore[attr-defined]
            elif kind is ngh2.StreamReset:
                self.server.count("resets")
                if not self._resets.spend(self.loop.time()):
                    self._calm("rapid_reset")
                    return
            elif kind is ngh2.TrailersReceived:
                call = self.calls.get(event.stream_id)  # type: ignore[attr-defined]
                if call is not None and call.receiving:
                    self._ended(call)
            elif kind is ngh2.WindowUpdated:
                self._wake()
            elif kind is ngh2.SettingsReceived:
                if not self._settings.spend(self.loop.time()):
                    self._calm("settings_flood")
                    return
            elif kind is ngh2.ConnectionClosed:
                code = event.error_code  # type: ignore[attr-defined]
                if code not in (_NO_ERROR,):
                    self.server.count("calm" if code == _CALM else "protocol_error")
                self._failed_quietly()
                return
            if self.closed:
                return

    def _request(self, event: ngh2.RequestReceived) -> None:
        stream_id = event.stream_id
        self.requests += 1
        if stream_id > self.last_stream:
            self.last_stream = stream_id
        call = _Call(stream_id)
        call.receiving = not event.end_stream
        path = b""
        problem: tuple[grpc.StatusCode, str, str] | None = None
        metadata: list[tuple[str, str | bytes]] = []
        for key, value in event.headers:
            if key[:1] == b":":
                if key == b":path":
                    path = value
            elif key == b"grpc-timeout":
                match = _TIMEOUT.match(value)
                if match is None:
                    problem = (
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"grpc-timeout {sanitised(value.decode('latin-1'), 16)!r} is not "
                        "1-8 digits and a unit (H M S m u n)",
                        "bad_timeout",
                    )
                else:
                    call.timeout = int(match[1]) * _TIMEOUT_UNITS[match[2]]
            elif key != b"te" and key != b"content-type":
                name = key.decode("latin-1")
                if name.endswith("-bin"):
                    try:
                        decoded = _unbase64(value)
                    except binascii.Error:
                        problem = (
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"metadata {sanitised(name)!r}: not base64",
                            "bad_metadata",
                        )
                        continue
                    metadata.append((name, decoded))
                else:
                    metadata.append((name, value.decode("latin-1")))
        call.method = path.decode("latin-1")
        if problem is None:
            call.handler = self.server.handler(call.method)
            if call.handler is None:
                problem = (
                    grpc.StatusCode.UNIMPLEMENTED,
                    f"Method not found: {sanitised(call.method)}",
                    "unknown_method",
                )
            elif self.server.running >= self.server.max_calls:
                problem = (
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the server runs its limit of {self.server.max_calls} calls; retry later",
                    "calls_refused",
                )
        if problem is not None:
            code, details, what = problem
            self._refuse(call, code, details, what)
            return
        call.metadata = tuple(metadata)
        self.calls[stream_id] = call
        if call.handler.request_streaming:  # its handler runs as its messages come
            call.inbox = asyncio.Queue()
            self._start(call, None)
            if not call.receiving:
                call.inbox.put_nowait(None)
        elif not call.receiving:
            self._ended(call)

    def _data(self, event: ngh2.DataReceived) -> None:
        stream_id, data = event.stream_id, event.data
        size = len(data)
        call = self.calls.get(stream_id)
        if call is None or not call.receiving:
            self._ack(size, stream_id)  # a call answered or reset already: dropped
            return
        max_receive = self.server.max_receive
        if len(call.body) + size > max_receive + _PREFIX.size:
            self._ack(size, stream_id)
            self._refuse(
                call,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({len(call.body) + size - _PREFIX.size} "
                f"vs. {max_receive})",
                "message_too_large",
            )
            return
        budget = self.server.budget
        if not budget.take(size):
            self._ack(size, stream_id)
            self._refuse(
                call,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the server holds its limit of {budget.limit} bytes of unfinished requests "
                "(wire.request_budget_bytes); retry later",
                "request_budget",
            )
            return
        call.body += data
        call.held += size
        if call.inbox is not None:
            self._stream_in(call, size, event.end_stream)
            return
        if budget.roomy():
            self._ack(size, stream_id)
        else:  # no credit until held bytes go
            call.owed += size
            budget.waiting.add(self)
        if event.end_stream:
            self._ended(call)

    def _stream_in(self, call: _Call, size: int, end: bool) -> None:
        """A streaming request's bytes: its whole messages go to the handler's inbox. Credit
        is given while the messages waiting there stay within a stream window (the handler
        sets the pace) and the budget has room; the rest when the handler takes them."""
        body, inbox = call.body, call.inbox
        assert inbox is not None
        while len(body) >= _PREFIX.size:
            compressed, length = _PREFIX.unpack_from(body)
            if compressed or length > self.server.max_receive:
                self._ack(size, call.stream_id)
                self._refuse(
                    call,
                    grpc.StatusCode.UNIMPLEMENTED
                    if compressed
                    else grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "compressed messages are not served"
                    if compressed
                    else f"Received message larger than max ({length} vs. "
                    f"{self.server.max_receive})",
                    "" if compressed else "message_too_large",
                )
                return
            if len(body) < _PREFIX.size + length:
                break
            inbox.put_nowait(bytes(body[_PREFIX.size : _PREFIX.size + length]))
            del body[: _PREFIX.size + length]
        call.owed += size
        self._stream_credit(call)
        if end:
            call.receiving = False
            inbox.put_nowait(None)

    def _stream_credit(self, call: _Call) -> None:
        budget = self.server.budget
        if call.owed and call.held - len(call.body) <= _STREAM_WINDOW and budget.roomy():
            self._ack(call.owed, call.stream_id)
            call.owed = 0
        elif call.owed and not budget.roomy():
            budget.waiting.add(self)

    async def _requests(self, call: _Call) -> AsyncIterator[Any]:
        """A streaming request's messages, as its handler takes them."""
        inbox = call.inbox
        assert inbox is not None
        parse = call.handler.request_deserializer
        while (item := await inbox.get()) is not None:
            size = _PREFIX.size + len(item)
            call.held -= size
            self.server.budget.release(size)
            self._stream_credit(call)
            self.flush_soon()
            if parse is None:
                yield item
                continue
            try:
                request = parse(item)
            except (DecodeError, ValueError, UnicodeError) as exc:
                self.server.count("malformed_request")
                raise RpcFailure(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{sanitised(call.method)}: malformed request ({sanitised(str(exc))})",
                    "malformed_request",
                ) from None
            yield request

    def _ack(self, size: int, stream_id: int) -> None:
        if size:
            with contextlib.suppress(ngh2.NGH2Error, ValueError):
                self.h2.acknowledge_received_data(size, stream_id)

    def repay(self) -> None:
        """Give the credit owed now that the budget has room again."""
        budget = self.server.budget
        for call in self.calls.values():
            if call.owed:
                if not budget.roomy():
                    return
                self._ack(call.owed, call.stream_id)
                call.owed = 0
        budget.waiting.discard(self)
        self.flush_soon()

    def _forget_body(self, call: _Call) -> None:
        call.body = bytearray()
        if call.owed:
            self._ack(call.owed, call.stream_id)
            call.owed = 0
        if call.held:
            held, call.held = call.held, 0
            self.server.budget.release(held)

    def _stream_closed(self, stream_id: int) -> None:
        call = self.calls.pop(stream_id, None)
        if call is None:
            return
        self._forget_body(call)
        if call.task is not None and not call.task.done():
            call.task.cancel()  # the client reset it or went: nobody to answer

    def _ended(self, call: _Call) -> None:
        """The client's side of `call` is complete: run it."""
        call.receiving = False
        body = call.body
        if len(body) < _PREFIX.size:
            self._refuse(call, grpc.StatusCode.INTERNAL, "the request carries no message", "")
            return
        compressed, size = _PREFIX.unpack_from(body)
        if compressed:
            self._refuse(
                call, grpc.StatusCode.UNIMPLEMENTED, "compressed messages are not served", ""
            )
            return
        if size != len(body) - _PREFIX.size:
            self._refuse(call, grpc.StatusCode.INTERNAL, "the request is not one whole message", "")
            return
        request = bytes(body[_PREFIX.size :])
        self._forget_body(call)
        self._start(call, request)

    def _start(self, call: _Call, request: bytes | None) -> None:
        server = self.server
        server.running += 1
        call.task = task = self.loop.create_task(self._serve(call, request))
        task.add_done_callback(server.call_done)

    def expire(self, now: float, timeout: float) -> None:
        """Refuse the unary requests still unfinished `timeout` seconds after the sweeper
        first saw them (their bytes held against the budget go back)."""
        late = []
        for call in self.calls.values():
            if call.receiving and call.inbox is None:
                if not call.seen:
                    call.seen = now
                elif now - call.seen > timeout:
                    late.append(call)
        for call in late:
            self._refuse(
                call,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request's message did not arrive within {timeout:g} s "
                "(wire.handshake_timeout_seconds)",
                "request_timeout",
            )

    def _refuse(self, call: _Call, code: grpc.StatusCode, details: str, what: str) -> None:
        """Answer a call that never reaches a handler, and forget it. Counted refusals
        spend the connection's reset budget too: a client that makes the server refuse its
        streams (error answers, CVE-2019-9514; MadeYouReset) is a rapid reset by proxy."""
        if what:
            self.server.count(what)
            if not self._resets.spend(self.loop.time()):
                self._calm("rapid_reset")
        self.calls.pop(call.stream_id, None)
        self._forget_body(call)
        self._finish(call, code, details)
        if call.receiving:  # stop the rest of its request, once the answer is out (§8.1)
            call.receiving = False
            self._reset_after.append(call.stream_id)
        self.flush_soon()

    # -- serving a call --------------------------------------------------------------------

    async def _serve(self, call: _Call, request: Any) -> None:
        handler = call.handler
        context = CallContext(call.metadata, self.peer)
        try:
            # No deadline, no `asyncio.timeout`: most calls have none, and entering one
            # costs two `getpid` syscalls (how 3.11 finds the running loop and task).
            async with _NO_DEADLINE if call.timeout is None else asyncio.timeout(call.timeout):
                if call.inbox is not None:
                    request = self._requests(call)
                elif handler.request_deserializer is not None:
                    try:
                        request = handler.request_deserializer(request)
                    except (DecodeError, ValueError, UnicodeError) as exc:
                        self.server.count("malformed_request")
                        raise RpcFailure(
                            grpc.StatusCode.INVALID_ARGUMENT,
                            f"{sanitised(call.method)}: malformed request ({sanitised(str(exc))})",
                            "malformed_request",
                        ) from None
                encode = handler.response_serializer
                if not handler.response_streaming:
                    unary = handler.unary_unary or handler.stream_unary
                    reply = await unary(request, context)
                    await self._message(call, encode(reply) if encode else reply)
                else:
                    stream = (handler.unary_stream or handler.stream_stream)(request, context)
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
        except Exception as exc:  # a handler's bug: logged with its traceback
            log.exception("wire: %s failed", call.method)
            self._finish(
                call, grpc.StatusCode.UNKNOWN, f"Unexpected error: {sanitised(repr(exc), 128)}"
            )
        finally:
            if self.calls.get(call.stream_id) is call:
                del self.calls[call.stream_id]
                if call.receiving:  # a streaming request answered before its end
                    call.receiving = False
                    self._reset_after.append(call.stream_id)
                self._forget_body(call)
        self.flush_soon()

    async def _message(self, call: _Call, message: bytes) -> None:
        """One response message; waits while the client takes what is queued too slowly."""
        h2 = self.h2
        sid = call.stream_id
        if self.calls.get(sid) is not call or self.closed:
            raise asyncio.CancelledError  # reset, or the connection went
        if not call.sent:
            call.sent = True
            h2.send_response(sid, _RESPONSE)
        h2.send_data(sid, _PREFIX.pack(0, len(message)) + message)
        self.flush_soon()
        while (
            self._paused
            or h2.queued_body_size(sid) > _STREAM_QUEUE
            or h2.queued_body_size() > _CONN_QUEUE
        ):
            self._waiting += 1
            try:
                await self._progress.wait()
            finally:
                self._waiting -= 1
            if self.calls.get(sid) is not call or self.closed:
                raise asyncio.CancelledError

    def _finish(self, call: _Call, code: grpc.StatusCode, details: str) -> None:
        h2 = self.h2
        if code is grpc.StatusCode.OK:
            status: tuple[tuple[bytes, bytes], ...] = _OK
        else:
            status = ((b"grpc-status", str(code.value[0]).encode()),)
            if details:
                encoded = quote(details, safe=" ").encode()[:_MAX_DETAILS]
                status += ((b"grpc-message", encoded),)
        with contextlib.suppress(ngh2.NGH2Error):
            if call.sent:
                h2.send_trailers(call.stream_id, status)
            else:  # trailers only
                call.sent = True
                h2.send_response(call.stream_id, _RESPONSE + status, end_stream=True)

    # -- stopping --------------------------------------------------------------------------

    def goaway(self, code: int = _NO_ERROR) -> None:
        """Tell the client to open no more calls here; those running go on."""
        if self.closed:
            return
        with contextlib.suppress(ngh2.NGH2Error):
            self.h2.send_goaway(code, last_stream_id=self.last_stream)
        self._flush()

    def abort(self) -> None:
        """End the connection now: its calls cancelled, GOAWAY, closed."""
        for call in list(self.calls.values()):
            if call.task is not None:
                call.task.cancel()
        if not self.closed:
            with contextlib.suppress(ngh2.NGH2Error):
                self.h2.terminate_connection(_NO_ERROR, last_stream_id=self.last_stream)
            self._flush()
        self._close()


def _unbase64(value: bytes) -> bytes:
    """A ``-bin`` metadata value: base64, padded or not (binascii.Error when it is not)."""
    stripped = value.rstrip(b"=")
    return base64.b64decode(stripped + b"=" * (-len(stripped) % 4), validate=True)


class H2GrpcServer:
    """Serves the handlers `handler(method)` returns on one address."""

    def __init__(
        self,
        handler: HandlerLookup,
        *,
        max_receive: int,
        ssl_context: ssl.SSLContext | None,
        limits: WireLimits | None = None,
        max_calls: int = 1 << 30,
    ) -> None:
        self.handler = handler
        self.max_receive = max_receive
        self.ssl_context = ssl_context
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(["h2"])  # gRPC clients insist on it
        self.limits = limits or WireLimits()
        self.engine = ngh2.Configuration(
            auto_window_update=False,  # credit follows the request budget (RequestBudget)
            max_settings=self.limits.max_settings_entries,
            # Resets are limited here, not by libnghttp2: its limit answers INTERNAL_ERROR
            # in the middle of a read; ours, at most one read later (bounded work), answers
            # ENHANCE_YOUR_CALM and is counted.
            stream_reset_rate_limit=(1 << 62, 1 << 62),
            max_inbound_header_list_size=self.limits.max_header_list_bytes,
        )
        self.budget = RequestBudget(self.limits.request_budget_bytes)
        self.max_calls = max_calls
        self.stopping = False  # closes then do not linger (the loop may end next)
        self.running = 0  # calls whose handlers run, on all connections
        self.connections: set[_Connection] = set()
        self.peers: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def call_done(self, task: asyncio.Task[None]) -> None:
        self.running -= 1

    def admit(self, connection: _Connection) -> bool:
        """Whether one more connection (from its peer) fits; counted either way."""
        peers = self.peers
        host = connection.peer_host
        if len(self.connections) >= self.limits.max_connections:
            self.count("connections_refused")
            return False
        if peers.get(host, 0) >= self.limits.max_connections_per_peer:
            self.count("connections_refused_peer")
            return False
        peers[host] = peers.get(host, 0) + 1
        self.connections.add(connection)
        self.count("connections")
        return True

    def release(self, connection: _Connection) -> None:
        self.connections.discard(connection)
        left = self.peers.get(connection.peer_host, 1) - 1
        if left > 0:
            self.peers[connection.peer_host] = left
        else:
            self.peers.pop(connection.peer_host, None)

    async def start(self, host: str, port: int) -> int:
        """Listen; the port bound (`OSError` when the address is taken)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self),
            host,
            port,
            ssl=self.ssl_context,
            reuse_port=False,
            ssl_handshake_timeout=(
                self.limits.handshake_timeout_seconds if self.ssl_context is not None else None
            ),
            backlog=1024,
        )
        self._sweeper = loop.create_task(self._sweep(), name="wire/timeouts")
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def _sweep(self) -> None:
        """Close connections that never sent a request (slowloris) or sat idle too long,
        and refuse unary requests whose bodies do not arrive (slowloris on a stream).

        One task for all connections: thousands of idle ones cost a pass a tick, not a timer
        each. Activity is what changed since the last pass (requests seen, calls open).
        """
        limits = self.limits
        handshake, idle = limits.handshake_timeout_seconds, limits.idle_timeout_seconds
        tick = min(1.0, max(0.05, min(handshake, idle or handshake) / 4))
        seen: dict[_Connection, tuple[int, float]] = {}
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            for connection in list(self.connections):
                if connection.closed:
                    continue
                if connection.requests == 0:
                    if now - connection.opened > handshake:
                        self.count("handshake_timeout")
                        connection.abort()
                    continue
                connection.expire(now, handshake)
                if not idle:
                    continue
                last = seen.get(connection)
                if connection.calls or last is None or last[0] != connection.requests:
                    seen[connection] = (connection.requests, now)
                elif now - last[1] > idle:
                    self.count("idle_timeout")
                    connection.goaway()
                    connection.abort()
            for connection in [c for c in seen if c.closed]:
                del seen[connection]

    async def stop(self, grace: float) -> None:
        """Stop taking connections, tell the clients (GOAWAY), give running calls `grace`
        seconds, then end them."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self.stopping = True
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
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
