"""The gateway's connections to brokers: one gRPC channel per broker for unary calls and
streams, and batched send/ack links (`ballast.wire.link`)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from ballast.gateway.calls import LINKED
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
    ) -> None:
        self.credentials = credentials
        self.batch_sends = batch_sends
        self.ssl_context = ssl_context  # for brokers' TCP link ports (TLS brokers)
        self.channels: dict[str, grpc.aio.Channel] = {}
        self._unary: dict[tuple[str, str], Any] = {}
        self._links: dict[tuple[str, str], SendLink] = {}  # (url, link method) -> link
        self._running: dict[str, set[Any]] = {}  # unary calls in flight, per broker

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
                self.channel(url), url, method, tcp=True, ssl_context=self.ssl_context
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
