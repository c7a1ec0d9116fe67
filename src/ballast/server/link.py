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
import functools
import logging
import struct
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from ballast.server.auth import CALLER, AuthError, TokenAuthority, authorize_call
from ballast.server.protocol import pb

__all__ = ["ACK_LINK_METHOD", "BATCH_BYTES", "LINK_METHOD", "LinkService", "SendLink", "rpc_error"]

log = logging.getLogger(__name__)

LINK_METHOD = "/ballast.GatewayLink/SendMessages"
ACK_LINK_METHOD = "/ballast.GatewayLink/Acks"
BATCH_BYTES = 1024 * 1024  # a frame's sends (well below the 4 MiB minimum request limit)
MAX_IN_FLIGHT = 4096  # sends of one link a broker runs at once (then it stops reading)

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
    """The broker's end: runs each linked send (ack) through the SendMessage (Ack) handler."""

    def __init__(
        self,
        authority: TokenAuthority | None,
        refused: Callable[[str, str], None],
        *,
        send: Handler,
        ack: Handler | None = None,
    ) -> None:
        self.authority = authority
        self.refused = refused
        kinds = [_Linked(LINK_METHOD, _SEND, pb.StreamMessage, send)]
        if ack is not None:
            kinds.append(_Linked(ACK_LINK_METHOD, _ACK, pb.AckRequest, ack))
        self._handlers = {
            kind.method: grpc.stream_stream_rpc_method_handler(functools.partial(self._serve, kind))
            for kind in kinds
        }

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        return self._handlers.get(handler_call_details.method)

    async def _serve(
        self,
        linked: _Linked,
        frames: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[bytes]:
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
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, failure[0])
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
    batched on one stream, replies matched."""

    def __init__(self, channel: grpc.aio.Channel, url: str, method: str = LINK_METHOD) -> None:
        self.channel = channel
        self.url = url
        self.method = method
        self.supported = True  # False once the broker answered UNIMPLEMENTED
        self.sends = 0  # sends written, in `frames` frames (what batching saves)
        self.frames = 0
        self._next_id = 0
        self._outbox: deque[bytes] = deque()
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._wake = asyncio.Event()
        self._run: asyncio.Task[None] | None = None

    async def send(self, message: bytes, token: str | None, timeout: float) -> bytes:
        """The broker's reply bytes (MessageResponse, AckResponse); `grpc.aio.AioRpcError`
        as a unary call would raise it (UNAVAILABLE mentioning the connection when the
        link is lost; UNIMPLEMENTED when the broker has no link)."""
        self._next_id += 1
        call_id = self._next_id
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        record = encode_record(call_id, request_body(token, message))
        self._outbox.append(record)
        self._wake.set()
        if self._run is None or self._run.done():
            self._run = asyncio.create_task(self._stream(), name=f"gateway/link {self.url}")
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        finally:
            self._pending.pop(call_id, None)

    async def _stream(self) -> None:
        call = self.channel.stream_stream(self.method)()
        writer = asyncio.create_task(self._write(call))
        error = rpc_error(grpc.StatusCode.UNAVAILABLE, f"link to {self.url}: connection ended")
        try:
            async for frame in call:
                for call_id, body in decode_records(frame):
                    future = self._pending.get(call_id)
                    if future is None or future.done():
                        continue  # its caller timed out
                    code = _CODES.get(body[0], grpc.StatusCode.UNKNOWN)
                    if code is grpc.StatusCode.OK:
                        future.set_result(bytes(body[1:]))
                    else:
                        future.set_exception(
                            rpc_error(code, bytes(body[1:]).decode(errors="replace"))
                        )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                self.supported = False
                error = exc
            else:
                details = exc.details() or exc.code().name
                error = rpc_error(exc.code(), f"link to {self.url}: connection lost: {details}")
        except (LinkFrameError, IndexError) as exc:
            log.error("gateway: link to %s: malformed reply frame (%s); reopening", self.url, exc)
        finally:
            call.cancel()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await writer
            self._fail_pending(error)

    def _fail_pending(self, error: grpc.aio.AioRpcError) -> None:
        # What was sent may or may not have been stored: its caller decides (as for a
        # unary call whose connection broke).
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._outbox.clear()

    async def _write(self, call: Any) -> None:
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
                await call.write(b"".join(batch))
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


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a failed call raises, made here (a link's answer, or its end)."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)
