"""The send link: a gateway's SendMessage (and Ack) calls to one broker, batched on one
stream per kind.

Forwarding each send as its own unary call costs the gateway a client call and the
broker a server call per message: on a shared machine that is what made the gateway
halve throughput. Instead a gateway keeps one bidirectional stream per broker
(`LINK_METHOD`, Ballast's own, not part of the client protocol) and writes every send
waiting at that moment into one frame; the broker runs each as the SendMessage it is and
answers in frames of its own. Per send the broker does exactly what a direct SendMessage
does (the same handler, the same checks, the caller's token checked per send), so a
gateway is never trusted more than its clients. Acks travel the same way on a stream of
their own (`ACK_LINK_METHOD`): a consumer acknowledges every message, and after a
failover the gateway acknowledges again, on the new owner, each redelivery of what its
client had acknowledged.

The frames go on a plain TCP connection when the broker has a link port
(`data_plane.link_port`; TLS there too when the broker serves TLS): a frame on a gRPC
stream costs both ends about what a unary call does (measured: the broker's CPU per
linked send about halves on TCP), and a gateway asks the port on the gRPC port
(`WHERE_METHOD`) each time it opens a link. On TCP the connection starts with
`TCP_PREAMBLE` and the kind (``S`` sends, ``A`` acks) and each frame is
``<length: u32><frame>``. A broker without the port (or an older one) gets the gRPC
stream, as does a gateway that cannot connect to it.

A frame is a sequence of records ``<call id: u64><length: u32><body>``; a request body is
``<token length: u16><token><StreamMessage | AckRequest>``, a reply body ``<status: u8>
<MessageResponse | AckResponse, or the refusal's details>``. A send larger than
`BATCH_BYTES` goes as a unary call (a frame must stay below the broker's
`data_plane.max_request_bytes`), and a broker that does not know a link (an older
version) gets unary calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import ssl
import struct
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from ballast.keepalive import is_silent_connection, set_tcp_keepalive
from ballast.wire.auth import CALLER, AuthError, TokenAuthority, authorize_call
from ballast.wire.protocol import pb

__all__ = [
    "ACK_LINK_METHOD",
    "BATCH_BYTES",
    "LINK_METHOD",
    "TCP_PREAMBLE",
    "WHERE_METHOD",
    "LinkService",
    "SendLink",
    "rpc_error",
]

log = logging.getLogger(__name__)

LINK_METHOD = "/ballast.GatewayLink/SendMessages"
ACK_LINK_METHOD = "/ballast.GatewayLink/Acks"
BATCH_BYTES = 1024 * 1024  # a frame's sends (well below the 4 MiB minimum request limit)
MAX_IN_FLIGHT = 4096  # sends of one link a broker runs at once (then it stops reading)

TCP_CONNECT_SECONDS = 3.0  # to connect to a link port, and to say what a connection is
WHERE_METHOD = "/ballast.GatewayLink/Where"  # answers the broker's TCP link port
# How long a link that ended INTERNAL waits to learn whether the broker has no link.
RPC_PROBE_SECONDS = 2.0
TCP_PREAMBLE = b"BALLAST-LINK/1 "  # then the kind: b"S" sends, b"A" acks
_TCP_KIND_OF = {LINK_METHOD: b"S", ACK_LINK_METHOD: b"A"}
_TCP_KINDS = {kind: method for method, kind in _TCP_KIND_OF.items()}

_LENGTH = struct.Struct("<I")
_LENGTH_MAX = 2**32 - 1
_PORT = struct.Struct("<H")
_RECORD = struct.Struct("<QI")
_TOKEN = struct.Struct("<H")
_STATUS = struct.Struct("<B")
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_SEND = "/danube.ProducerService/SendMessage"
_ACK = "/danube.ConsumerService/Ack"

Handler = Callable[[Any, Any], Awaitable[Any]]


@dataclass(frozen=True)
class _Linked:
    """What one link method carries: the client RPC each record is, and its handler."""

    method: str  # the link's own method name
    rpc: str
    request: Any  # the protobuf message class of a record's request
    handler: Handler

    @property
    def name(self) -> str:
        return self.rpc.rsplit("/", 1)[-1]


class LinkFrameError(ValueError):
    """A frame that does not decode."""


def encode_record(call_id: int, body: bytes) -> bytes:
    return _RECORD.pack(call_id, len(body)) + body


def decode_records(frame: bytes) -> list[tuple[int, memoryview]]:
    """The (call id, body) records of a frame; `LinkFrameError` when it is cut short."""
    view = memoryview(frame)
    records: list[tuple[int, memoryview]] = []
    at = 0
    while at < len(view):
        if at + _RECORD.size > len(view):
            raise LinkFrameError(f"record header cut short at byte {at}")
        call_id, length = _RECORD.unpack_from(view, at)
        at += _RECORD.size
        if at + length > len(view):
            raise LinkFrameError(f"record {call_id}: {length} bytes announced, fewer sent")
        records.append((call_id, view[at : at + length]))
        at += length
    return records


def request_body(token: str | None, message: bytes) -> bytes:
    raw = (token or "").encode()
    return _TOKEN.pack(len(raw)) + raw + message


def reply_body(code: grpc.StatusCode, payload: bytes) -> bytes:
    return _STATUS.pack(code.value[0]) + payload


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _SendContext:
    """What the SendMessage and Ack handlers use of a servicer context, for one record."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Refused(code, details)

    def invocation_metadata(self) -> tuple[()]:
        return ()


class LinkService(grpc.GenericRpcHandler):
    """The broker's end: runs each linked send (ack) through the SendMessage (Ack) handler,
    for records that come on a gRPC stream or on a TCP connection (`serve_connection`)."""

    def __init__(
        self,
        authority: TokenAuthority | None,
        refused: Callable[[str, str], None],
        *,
        send: Handler,
        ack: Handler | None = None,
        max_frame_bytes: int = 2 * BATCH_BYTES,
    ) -> None:
        self.authority = authority
        self.refused = refused
        self.max_frame_bytes = max_frame_bytes
        self.tcp_port = 0  # where `serve_connection` listens (0: nowhere); `WHERE_METHOD` says
        kinds = [_Linked(LINK_METHOD, _SEND, pb.StreamMessage, send)]
        if ack is not None:
            kinds.append(_Linked(ACK_LINK_METHOD, _ACK, pb.AckRequest, ack))
        self._kinds = {kind.method: kind for kind in kinds}
        self._connections: set[asyncio.Task[Any]] = set()
        self._handlers = {
            kind.method: grpc.stream_stream_rpc_method_handler(functools.partial(self._serve, kind))
            for kind in kinds
        }
        self._handlers[WHERE_METHOD] = grpc.stream_stream_rpc_method_handler(self._where)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        return self._handlers.get(handler_call_details.method)

    def methods(self) -> list[str]:
        """The methods served (the wire layer registers each by name)."""
        return list(self._handlers)

    async def _where(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        # A stream, as the links are: it names a port, nothing a token guards (each
        # record on that port carries its caller's token).
        yield _PORT.pack(self.tcp_port)

    async def _serve(
        self,
        linked: _Linked,
        frames: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[bytes]:
        try:
            async for out in self._replies(linked, frames):
                yield out
        except LinkFrameError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One gateway's link on the TCP port: `TCP_PREAMBLE` and the link method's kind,
        then frames each way; a malformed or oversized frame ends the connection."""
        peer = writer.get_extra_info("peername")
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            try:
                async with asyncio.timeout(TCP_CONNECT_SECONDS):
                    head = await reader.readexactly(len(TCP_PREAMBLE) + 1)
            except (asyncio.IncompleteReadError, TimeoutError):
                return
            method = _TCP_KINDS.get(head[-1:], "") if head[:-1] == TCP_PREAMBLE else ""
            linked = self._kinds.get(method)
            if linked is None:
                self.refused(LINK_METHOD, "malformed_request")  # which kind is unknown
                log.warning("link connection from %s: not a Ballast link; closed", peer)
                return
            async for out in self._replies(linked, _tcp_frames(reader, self.max_frame_bytes)):
                await _tcp_write(writer, out)
        except LinkFrameError as exc:
            log.warning("link connection from %s: %s; closed", peer, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the gateway went; its sends in flight were answered to nobody
        except asyncio.CancelledError:
            # `close_connections` ended it. It ends normally: on Python 3.11 the stream
            # server's done-callback calls `task.exception()`, which raises for a
            # cancelled task and prints a traceback per connection on every stop.
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def close_connections(self) -> None:
        """End every TCP link now (as a stopped gRPC server ends its streams): the
        gateways' sends in flight fail as on a lost connection and go to the next owner."""
        connections, self._connections = self._connections, set()
        for task in connections:
            task.cancel()
        if connections:
            await asyncio.wait(connections)

    async def _replies(self, linked: _Linked, frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Reply frames for the request `frames`: each record run as its call, replies
        joined as they are ready. `LinkFrameError` (counted) once the replies to what came
        before a malformed frame are out."""
        replies: list[bytes] = []
        ready = asyncio.Event()
        slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        running: set[asyncio.Task[None]] = set()
        failure: list[str] = []

        async def one(call_id: int, body: memoryview) -> None:
            try:
                reply = await self._one(linked, body)
            finally:
                slots.release()
            replies.append(encode_record(call_id, reply))
            ready.set()

        async def read() -> None:
            try:
                async for frame in frames:
                    for call_id, body in decode_records(frame):
                        await slots.acquire()
                        task = asyncio.create_task(one(call_id, body))
                        running.add(task)
                        task.add_done_callback(running.discard)
            except LinkFrameError as exc:
                self.refused(linked.method, "malformed_request")
                failure.append(f"{linked.method}: malformed frame ({exc})")
            finally:
                if running:
                    await asyncio.wait(set(running))
                failure.append("")  # the reader is done: end once the replies are out
                ready.set()

        reader = asyncio.create_task(read())
        try:
            while True:
                await ready.wait()
                ready.clear()
                if replies:
                    out, replies[:] = b"".join(replies), []
                    yield out
                elif failure:
                    break
            if failure[0]:
                raise LinkFrameError(failure[0])
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _one(self, linked: _Linked, body: memoryview) -> bytes:
        try:
            if len(body) < _TOKEN.size:
                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"linked {linked.name}: cut short")
            (token_length,) = _TOKEN.unpack_from(body)
            start = _TOKEN.size + token_length
            try:
                request = linked.request.FromString(bytes(body[start:]))
            except DecodeError as exc:
                self.refused(linked.rpc, "malformed_request")
                raise _Refused(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{linked.name}: malformed request ({exc})"
                ) from None
            if self.authority is not None:
                token = bytes(body[_TOKEN.size : start]).decode(errors="replace")
                self._authorize(linked.rpc, token, request)
            response = await linked.handler(request, _SendContext())
            return reply_body(grpc.StatusCode.OK, response.SerializeToString())
        except _Refused as exc:
            return reply_body(exc.code, exc.details.encode())
        except Exception as exc:  # a bug: answered, so the gateway does not wait it out
            log.exception("linked %s failed", linked.name)
            return reply_body(grpc.StatusCode.INTERNAL, f"{linked.name} failed: {exc}".encode())

    def _authorize(self, rpc: str, token: str, request: Any) -> None:
        """What the token interceptor does for the call `rpc`, for one linked record."""
        assert self.authority is not None
        metadata = [("authorization", f"Bearer {token}")] if token else []
        try:
            CALLER.set(authorize_call(self.authority, rpc, request, metadata))
        except AuthError as exc:
            self.refused(rpc, exc.code.name)
            raise _Refused(exc.code, exc.message) from None


class SendLink:
    """The gateway's end for one broker and one link method (sends, or acks): records
    batched on one TCP connection (`tcp`, when the broker has a link port) or gRPC
    stream, replies matched."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        url: str,
        method: str = LINK_METHOD,
        *,
        tcp: bool = False,
        ssl_context: ssl.SSLContext | None = None,
        keepalive: tuple[float, float] | None = None,
    ) -> None:
        self.channel = channel
        self.url = url
        # (silence, timeout) seconds: a TCP link whose broker stops answering is closed
        # (keepalive probes, TCP_USER_TIMEOUT) and dialed again by the next send, instead
        # of sitting in retransmission back-off (a gRPC link has its channel's keepalive).
        self.keepalive = keepalive
        self.timeouts = 0  # connections closed because the broker went silent
        self.method = method
        self.tcp = tcp  # on the broker's TCP link port when it has one
        self.ssl_context = ssl_context  # for that port when the broker serves TLS
        self.transport = ""  # what the link goes on now: "tcp" or "grpc"
        self.supported = True  # False once the broker answered UNIMPLEMENTED
        self.sends = 0  # sends written, in `frames` frames (what batching saves)
        self.frames = 0
        self._next_id = 0
        self._outbox: deque[bytes] = deque()
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._wake = asyncio.Event()
        self._run: asyncio.Task[None] | None = None
        self._answered = False  # the open stream answered a frame (see `_rejected`)

    async def send(self, message: bytes, token: str | None, timeout: float) -> bytes:
        """The broker's reply bytes (MessageResponse, AckResponse); `grpc.aio.AioRpcError`
        as a unary call would raise it (UNAVAILABLE mentioning the connection when the
        link is lost; UNIMPLEMENTED when the broker has no link)."""
        self._next_id += 1
        call_id = self._next_id
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        self._pending[call_id] = future
        record = encode_record(call_id, request_body(token, message))
        self._outbox.append(record)
        self._wake.set()
        self.open()
        # A timer, not `wait_for`: that wraps the future in one more, and its caller
        # resumes a loop turn later (each turn on a busy gateway is a client's wait).
        timer = loop.call_later(timeout, _expire, future)
        try:
            return await future
        finally:
            timer.cancel()
            self._pending.pop(call_id, None)

    def open(self) -> None:
        """Connect now, unless connected or connecting (a send connects too)."""
        if self._run is None or self._run.done():
            self._run = asyncio.create_task(self._stream(), name=f"gateway/link {self.url}")

    async def _stream(self) -> None:
        error = rpc_error(grpc.StatusCode.UNAVAILABLE, f"link to {self.url}: connection ended")
        opened: _Opened | None = None
        self._answered = False
        try:
            opened = await self._open()
            writer = asyncio.create_task(self._write(opened.write))
            try:
                await opened.replies
            finally:
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError, OSError):
                    await writer
        except grpc.aio.AioRpcError as exc:
            grpc_link = self.transport == "grpc"
            if exc.code() is grpc.StatusCode.INTERNAL and grpc_link and not self._answered:
                exc = await self._rejected(exc)
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                self.supported = False
                error = exc
            else:
                if is_silent_connection(exc):
                    self.timeouts += 1
                details = exc.details() or exc.code().name
                error = rpc_error(exc.code(), f"link to {self.url}: connection lost: {details}")
        except OSError as exc:
            if exc.errno == errno.ETIMEDOUT:  # TCP_USER_TIMEOUT or keepalive: silence
                self.timeouts += 1
                log.warning("gateway: link to %s: the broker stopped answering; closed", self.url)
            error = rpc_error(
                grpc.StatusCode.UNAVAILABLE, f"link to {self.url}: connection lost: {exc}"
            )
        except (LinkFrameError, IndexError) as exc:
            log.error("gateway: link to %s: malformed reply frame (%s); reopening", self.url, exc)
        finally:
            if opened is not None:
                opened.close()
            self._fail_pending(error)

    def _answer(self, frame: bytes) -> None:
        for call_id, body in decode_records(frame):
            future = self._pending.get(call_id)
            if future is None or future.done():
                continue  # its caller timed out
            code = _CODES.get(body[0], grpc.StatusCode.UNKNOWN)
            if code is grpc.StatusCode.OK:
                future.set_result(bytes(body[1:]))
            else:
                future.set_exception(rpc_error(code, bytes(body[1:]).decode(errors="replace")))

    async def _open(self) -> _Opened:
        """The broker's TCP link port when it has one and `tcp` is on, else the stream."""
        if self.tcp:
            port = await self._tcp_port()
            if port:
                host = self.url.rpartition(":")[0].strip("[]")
                loop = asyncio.get_running_loop()
                try:
                    async with asyncio.timeout(TCP_CONNECT_SECONDS):
                        transport, replies = await loop.create_connection(
                            functools.partial(_TcpReplies, self._answer),
                            host,
                            port,
                            ssl=self.ssl_context,
                            server_hostname=host if self.ssl_context is not None else None,
                        )
                except OSError as exc:  # refused, unreachable, TLS, or the timeout
                    # A port a firewall drops would cost every reopen the timeout.
                    self.tcp = False
                    log.warning(
                        "gateway: TCP link to %s (port %d) failed (%s); using the gRPC stream "
                        "to it from now on (set data_plane.link_port: null on brokers whose "
                        "link port gateways cannot reach)",
                        self.url,
                        port,
                        str(exc) or type(exc).__name__,
                    )
                else:
                    sock = transport.get_extra_info("socket")
                    if self.keepalive is not None and sock is not None:
                        set_tcp_keepalive(sock, *self.keepalive)
                    transport.write(TCP_PREAMBLE + _TCP_KIND_OF[self.method])
                    self.transport = "tcp"
                    return _Opened(replies.write, replies.ended, transport.close)
        call = self.channel.stream_stream(self.method)()
        self.transport = "grpc"
        return _Opened(call.write, self._grpc_replies(call), call.cancel)

    async def _grpc_replies(self, call: Any) -> None:
        async for frame in call:
            self._answered = True
            self._answer(frame)

    async def _rejected(self, exc: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
        """Why a gRPC link stream that never answered ended INTERNAL: writing to a stream
        the broker is rejecting can end it "Internal error from Core" instead of the
        broker's UNIMPLEMENTED (seen in CI). An empty stream, ended before anything is
        written, tells: the broker's UNIMPLEMENTED, else `exc` as it was."""
        probe = self.channel.stream_stream(self.method)()
        try:
            async with asyncio.timeout(RPC_PROBE_SECONDS):
                await probe.done_writing()
                await probe.read()
        except grpc.aio.AioRpcError as answer:
            if answer.code() is grpc.StatusCode.UNIMPLEMENTED:
                return answer
        except TimeoutError:
            pass
        finally:
            probe.cancel()
        return exc

    async def _tcp_port(self) -> int:
        """The broker's link port (0: none, or a broker from before TCP links); asked on
        every open, as a broker restarted on the same URL listens on another one."""
        call = self.channel.stream_stream(WHERE_METHOD)()
        try:
            reply = await call.read()
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                return 0
            raise
        finally:
            call.cancel()
        if not isinstance(reply, bytes) or len(reply) != _PORT.size:
            return 0
        port: int = _PORT.unpack(reply)[0]
        return port

    def _fail_pending(self, error: grpc.aio.AioRpcError) -> None:
        # What was sent may or may not have been stored: its caller decides (as for a
        # unary call whose connection broke).
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._outbox.clear()

    async def _write(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        while True:
            await self._wake.wait()
            # One turn of the loop first: the sends that other calls are about to
            # make join this frame (a frame costs about as much as a unary call).
            self._wake.clear()
            while self._outbox:
                batch: list[bytes] = []
                size = 0
                while self._outbox and (not batch or size + len(self._outbox[0]) <= BATCH_BYTES):
                    record = self._outbox.popleft()
                    batch.append(record)
                    size += len(record)
                await write(b"".join(batch))
                self.sends += len(batch)
                self.frames += 1

    def abandon(self) -> None:
        """End the stream now: sends waiting for an answer fail with UNAVAILABLE (as on a
        lost connection); whether the broker stored them is unknown, as then. They fail
        here, not only when the stream task ends: a task cancelled before it ever ran
        never gets to its cleanup."""
        if self._run is not None:
            self._run.cancel()
        self._fail_pending(
            rpc_error(grpc.StatusCode.UNAVAILABLE, f"link to {self.url}: connection ended")
        )

    async def close(self) -> None:
        self.abandon()
        if self._run is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._run


@dataclass(frozen=True)
class _Opened:
    """A link's way to the broker: write a frame; what ends when the connection does
    (each reply frame answered on the way); close."""

    write: Callable[[bytes], Awaitable[None]]
    replies: Awaitable[None]
    close: Callable[[], Any]


class _TcpReplies(asyncio.Protocol):
    """The gateway's end of a TCP link: reply frames answered as they are read, in the
    read's own loop turn (a StreamReader would wake the link's task a turn later, on
    every reply frame of every send), and frames written with back-pressure."""

    def __init__(self, answer: Callable[[bytes], None]) -> None:
        self.answer = answer
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drained: asyncio.Future[None] | None = None  # while the socket takes no more

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        at = 0
        try:
            # Reply frames answer what this gateway sent (each below BATCH_BYTES): no limit.
            while len(buffer) - at >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(buffer, at)
                end = at + _LENGTH.size + length
                if end > len(buffer):
                    break
                self.answer(bytes(buffer[at + _LENGTH.size : end]))
                at = end
        except (LinkFrameError, IndexError) as exc:  # a malformed frame: the link reopens
            self._end(exc)
            assert self.transport is not None
            self.transport.abort()
            return
        del buffer[:at]

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc)  # mid-frame or not: the connection ended
        self.resume_writing()

    def _end(self, exc: BaseException | None) -> None:
        if not self.ended.done():
            if exc is None:
                self.ended.set_result(None)
            else:
                self.ended.set_exception(exc)

    def pause_writing(self) -> None:
        self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    async def write(self, frame: bytes) -> None:
        """One frame (``<length: u32><frame>``); returns once the socket takes more."""
        assert self.transport is not None
        if self.ended.done() or self.transport.is_closing():
            raise ConnectionResetError("link connection ended")
        self.transport.write(_LENGTH.pack(len(frame)) + frame)
        if self._drained is not None:
            await self._drained


async def _tcp_write(writer: asyncio.StreamWriter, frame: bytes) -> None:
    """One frame of a TCP link (``<length: u32><frame>``), either way."""
    writer.write(_LENGTH.pack(len(frame)) + frame)
    await writer.drain()


async def _tcp_frames(reader: asyncio.StreamReader, limit: int) -> AsyncIterator[bytes]:
    """The frames of a TCP link (``<length: u32><frame>``) until the connection ends;
    `LinkFrameError` for one above `limit` bytes."""
    while True:
        try:
            (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
            if length > limit:
                raise LinkFrameError(f"a frame of {length} bytes (at most {limit})")
            yield await reader.readexactly(length)
        except asyncio.IncompleteReadError:
            return  # the peer went (mid-frame or not): the connection ended


def _expire(future: asyncio.Future[bytes]) -> None:
    if not future.done():
        future.set_exception(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a failed call raises, made here (a link's answer, or its end)."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)
