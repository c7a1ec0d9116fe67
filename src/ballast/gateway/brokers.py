"""The gateway's connections to brokers: one gRPC channel per broker for unary calls and
streams, and batched send/ack links (`ballast.wire.link`)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from ballast.config import ConnectionSettings
from ballast.gateway.calls import LINKED
from ballast.keepalive import grpc_keepalive_options, is_silent_connection
from ballast.wire.address import MAX_RECEIVE_BYTES
from ballast.wire.auth import bearer_token
from ballast.wire.link import BATCH_BYTES, LINK_METHOD, SendLink, rpc_error

log = logging.getLogger(__name__)


class BrokerLinks:
    """One gRPC channel per broker URL, reused by every forwarded call; sends batched on
    one stream per broker (`SendLink`) unless `batch_sends` is off."""

    def __init__(
        self,
        credentials: grpc.ChannelCredentials | None,
        batch_sends: bool,
        ssl_context: ssl.SSLContext | None = None,
        connections: ConnectionSettings | None = None,
    ) -> None:
        self.connections = connections or ConnectionSettings()
        self.credentials = credentials
        self.batch_sends = batch_sends
        self.ssl_context = ssl_context  # for brokers' TCP link ports (TLS brokers)
        self.channels: dict[str, grpc.aio.Channel] = {}
        self._unary: dict[tuple[str, str], Any] = {}
        self._links: dict[tuple[str, str], SendLink] = {}  # (url, link method) -> link
        self._running: dict[str, set[Any]] = {}  # unary calls in flight, per broker
        self._silent = 0  # channel connections dropped by their keepalive (calls seen failing)
        self._silent_at: dict[str, float] = {}  # url -> when one was last counted
        self._closed_links = 0  # timeouts of links since replaced

    @property
    def connection_timeouts(self) -> int:
        """Connections to brokers dropped because the broker went silent (channels as their
        calls saw it, links)."""
        live = sum(link.timeouts for link in self._links.values())
        return self._silent + self._closed_links + live

    def note(self, url: str, exc: BaseException) -> None:
        """A call to `url` failed: count its connection if its keepalive found it silent
        (once: every call on that connection fails at the same moment)."""
        if isinstance(exc, Exception) and is_silent_connection(exc):
            now = asyncio.get_running_loop().time()
            if now - self._silent_at.get(url, -1e9) > self.connections.keepalive_seconds:
                self._silent_at[url] = now
                self._silent += 1

    def link(self, url: str, method: str = LINK_METHOD) -> SendLink | None:
        """The link of `method` to `url`, once a call has used it."""
        return self._links.get((url, method))

    def links(self) -> dict[tuple[str, str], SendLink]:
        """Every open link, by (broker url, link method) (a copy)."""
        return dict(self._links)

    async def call(
        self,
        url: str,
        method: str,
        request: bytes,
        metadata: list[tuple[str, str]],
        timeout: float,
    ) -> bytes:
        """`method` (a client RPC) on `url`: SendMessage and Ack on the broker's link of
        their kind, anything else (or a request too large for a frame, or a broker without
        the link) as a unary call; failures raise as a unary call's would."""
        linked = LINKED.get(method) if len(request) < BATCH_BYTES else None
        link = self._link(url, linked) if self.batch_sends and linked is not None else None
        if link is not None and link.supported:
            try:
                return await link.send(request, bearer_token(metadata), timeout)
            except grpc.aio.AioRpcError as exc:
                if link.supported or exc.code() is not grpc.StatusCode.UNIMPLEMENTED:
                    raise
                log.info("gateway: broker %s has no %s link; sending unary calls", url, linked)
        return bytes(await self.unary(url, method)(request, metadata=metadata, timeout=timeout))

    def _link(self, url: str, method: str) -> SendLink:
        link = self._links.get((url, method))
        if link is None:
            link = self._links[(url, method)] = SendLink(
                self.channel(url),
                url,
                method,
                tcp=True,
                ssl_context=self.ssl_context,
                keepalive=(
                    self.connections.keepalive_seconds,
                    self.connections.keepalive_timeout_seconds,
                ),
            )
        return link

    def warm(self, url: str) -> None:
        """Connect to a broker that just registered before any call needs it: its channel
        and its send and ack links. A move to a broker this gateway has not used yet (a
        new broker taking topics, say) must not spend its pause connecting."""
        self.channel(url).get_state(try_to_connect=True)
        if self.batch_sends:
            for method in LINKED.values():
                self._link(url, method).open()

    def abandon(self, url: str) -> None:
        """The broker at `url` lost its registration (dead, stalled past its TTL or cut
        off from the store): end its links and unary calls, so that calls waiting on it
        fail as on a lost connection and their sessions move to the topic's next owner,
        instead of waiting out `forward_timeout_seconds` on a host that may never answer
        (no RST comes from a host that lost power)."""
        for method in LINKED.values():
            link = self._links.pop((url, method), None)
            if link is not None:
                self._closed_links += link.timeouts
                link.abandon()
        for rpc in self._running.pop(url, set()):
            rpc.cancel()

    def unary(self, url: str, method: str) -> Any:
        """The (cached) bytes-in, bytes-out callable of `method` on `url`'s channel; its
        calls end with UNAVAILABLE when `abandon(url)` comes first."""
        call = self._unary.get((url, method))
        if call is None:
            call = self._unary[(url, method)] = self._tracked(
                url, self.channel(url).unary_unary(method)
            )
        return call

    def _tracked(self, url: str, multi: Any) -> Callable[..., Awaitable[bytes]]:
        async def call(request: bytes, **kwargs: Any) -> bytes:
            rpc = multi(request, **kwargs)
            running = self._running.setdefault(url, set())
            running.add(rpc)
            try:
                return bytes(await rpc)
            except grpc.aio.AioRpcError as exc:
                self.note(url, exc)
                raise
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # our caller was cancelled, not the call by `abandon`
                raise rpc_error(
                    grpc.StatusCode.UNAVAILABLE,
                    f"broker {url}: connection ended (its registration is gone)",
                ) from None
            finally:
                running.discard(rpc)

        return call

    def channel(self, url: str) -> grpc.aio.Channel:
        channel = self.channels.get(url)
        if channel is None:
            options = [
                ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                ("grpc.max_send_message_length", MAX_RECEIVE_BYTES),
                ("grpc.initial_reconnect_backoff_ms", 200),
                ("grpc.min_reconnect_backoff_ms", 200),
                ("grpc.max_reconnect_backoff_ms", 2000),
                # A broker that goes silent (a blackholed path, a hung host) is noticed
                # within keepalive + timeout seconds, calls or not (docs/gray-failures.md).
                *grpc_keepalive_options(
                    self.connections.keepalive_seconds,
                    self.connections.keepalive_timeout_seconds,
                    without_calls=True,
                ),
            ]
            if self.credentials is None:
                channel = grpc.aio.insecure_channel(url, options=options)
            else:
                channel = grpc.aio.secure_channel(url, self.credentials, options=options)
            self.channels[url] = channel
        return channel

    async def reachable(self, url: str, timeout: float) -> bool:
        """Whether a connection to `url` is (or becomes, within `timeout`) ready."""
        channel = self.channel(url)
        if channel.get_state(try_to_connect=True) is grpc.ChannelConnectivity.READY:
            return True
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        links, self._links = self._links, {}
        for link in links.values():
            await link.close()
        channels, self.channels = self.channels, {}
        self._unary.clear()
        for channel in channels.values():
            await channel.close()
