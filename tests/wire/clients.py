"""The attackers' tools: frames written by hand on a raw socket, and libnghttp2's own client
side (`ngh2`, role CLIENT) for requests that are well-formed HTTP/2 but bad gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

import hpack
import ngh2

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0, 1, 3, 4, 6, 7, 8, 9,
)  # fmt: skip
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
CANCEL, ENHANCE_YOUR_CALM = 0x8, 0xB
LOOKUP = "/danube.Discovery/TopicLookup"


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return struct.pack(">BHBBI", size >> 16, size & 0xFFFF, kind, flags, stream) + payload


def message(payload: bytes) -> bytes:
    """A gRPC message: not compressed, its length, its bytes."""
    return struct.pack(">BI", 0, len(payload)) + payload


def request_headers(path: str, extra: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    return [
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
        ("content-type", "application/grpc"), ("te", "trailers"), *extra,
    ]  # fmt: skip


def header_block(encoder: hpack.Encoder, path: str, extra: Iterable[tuple[str, str]] = ()) -> bytes:
    """A request's header block (HPACK, `encoder`'s dynamic table)."""
    return bytes(encoder.encode(request_headers(path, extra)))


class RawClient:
    """A socket that speaks HTTP/2 frames written by hand (what no real client sends)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder = hpack.Encoder()

    @classmethod
    async def connect(cls, url: str, *, preface: bool = True) -> RawClient:
        host, port = url.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        client = cls(reader, writer)
        if preface:  # and an ACK of the server's SETTINGS (sent before it reads)
            writer.write(PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, ACK, 0))
        return client

    def block(self, path: str, extra: Iterable[tuple[str, str]] = ()) -> bytes:
        return header_block(self.encoder, path, extra)

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    async def drain(self) -> bool:
        """Wait until the socket took what was written; False once the server closed it."""
        try:
            await self.writer.drain()
        except (ConnectionError, OSError):
            return False
        return True

    async def goaway(self, timeout: float = 10.0) -> int | None:
        """Read until GOAWAY (its error code) or the end of the connection (None)."""
        async with asyncio.timeout(timeout):
            while True:
                try:
                    head = await self.reader.readexactly(9)
                    high, low, kind, _, _ = struct.unpack(">BHBBI", head)
                    payload = await self.reader.readexactly((high << 16) | low)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return None
                if kind == GOAWAY:
                    return int(struct.unpack(">I", payload[4:8])[0])

    async def closed(self, timeout: float = 10.0) -> bool:
        """Whether the server ends the connection within `timeout` (reading all it sends)."""
        try:
            async with asyncio.timeout(timeout):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            pass
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


def unread_socket(url: str) -> socket.socket:
    """A non-blocking socket with a small receive buffer: a client that never reads."""
    host, port = url.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.setblocking(False)
    return sock


def send_some(sock: socket.socket, data: bytes) -> int:
    """Bytes of `data` the kernel takes now (0 once the server stopped reading)."""
    try:
        return sock.send(data)
    except BlockingIOError:
        return 0
    except OSError:
        return -1  # the server closed the connection


@dataclass
class Answer:
    """What one stream got back."""

    headers: dict[bytes, bytes] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    trailers: dict[bytes, bytes] = field(default_factory=dict)
    reset: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def status(self) -> int | None:
        """grpc-status, from the trailers or a trailers-only answer."""
        value = self.trailers.get(b"grpc-status", self.headers.get(b"grpc-status"))
        return None if value is None else int(value)

    @property
    def details(self) -> bytes:
        return self.trailers.get(b"grpc-message", self.headers.get(b"grpc-message", b""))


class EngineClient:
    """libnghttp2's client side on an asyncio connection: real HTTP/2, any gRPC content."""

    def __init__(self, settings: dict[int, int] | None, auto_window_update: bool) -> None:
        config = ngh2.Configuration(auto_window_update=auto_window_update)
        self.h2 = ngh2.Connection(ngh2.Role.CLIENT, config)
        self.settings = settings or {}
        self.answers: dict[int, Answer] = {}
        self.goaway: int | None = None
        self.ended = asyncio.Event()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self._pump: asyncio.Task[None] | None = None

    @classmethod
    async def connect(
        cls, url: str, settings: dict[int, int] | None = None, *, auto_window_update: bool = True
    ) -> EngineClient:
        client = cls(settings, auto_window_update)
        host, port = url.rsplit(":", 1)
        client.reader, client.writer = await asyncio.open_connection(host, int(port))
        client.h2.initiate_connection(client.settings)
        client.flush()
        client._pump = asyncio.create_task(client._read())
        return client

    def flush(self) -> None:
        assert self.writer is not None
        with contextlib.suppress(ngh2.NGH2Error):
            out = self.h2.data_to_send()
            if out and not self.writer.is_closing():
                self.writer.write(out)

    async def _read(self) -> None:
        assert self.reader is not None
        try:
            while data := await self.reader.read(65536):
                self.h2.receive_data(data)
                for event in self.h2.events():
                    self._event(event)
                self.flush()
        except (ConnectionError, ngh2.NGH2Error):
            pass
        finally:
            self.ended.set()
            for answer in self.answers.values():
                answer.done.set()

    def _event(self, event: ngh2.Event) -> None:
        if isinstance(event, ngh2.ResponseReceived):
            answer = self.answers[event.stream_id]
            answer.headers = dict(event.headers)
            if event.end_stream:
                answer.done.set()
        elif isinstance(event, ngh2.DataReceived):
            self.answers[event.stream_id].data += event.data
        elif isinstance(event, ngh2.TrailersReceived):
            self.answers[event.stream_id].trailers = dict(event.headers)
            self.answers[event.stream_id].done.set()
        elif isinstance(event, ngh2.StreamReset):
            self.answers[event.stream_id].reset = event.error_code
            self.answers[event.stream_id].done.set()
        elif isinstance(event, ngh2.StreamClosed):
            if event.stream_id in self.answers:
                self.answers[event.stream_id].done.set()
        elif isinstance(event, ngh2.GoAwayReceived):
            self.goaway = event.error_code

    def request(
        self,
        path: str,
        body: bytes | None = None,
        extra: Iterable[tuple[str, str]] = (),
        *,
        end: bool = True,
    ) -> int:
        """Open a stream: headers, then `body` (ended unless `end` is False)."""
        headers = [(k.encode(), v.encode()) for k, v in request_headers(path, extra)]
        stream = self.h2.send_request(headers, end_stream=body is None and end)
        self.answers[stream] = Answer()
        if body is not None:
            self.h2.send_data(stream, body, end_stream=end)
        self.flush()
        return stream

    async def answer(self, stream: int, timeout: float = 10.0) -> Answer:
        answer = self.answers[stream]
        async with asyncio.timeout(timeout):
            await answer.done.wait()
        return answer

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
