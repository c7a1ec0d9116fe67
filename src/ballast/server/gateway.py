"""The Ballast gateway: a stateless front door that clients use as their `service_url`.

The published 0.5.0 client sends every re-lookup to the last address it used, so when the
broker that owned its topic dies, the client is stuck on a dead address (protocol
document §3.4, §4.5). Clients that connect through a gateway never hold a broker's
address:

- **TopicLookup** is answered here, from a watch-fed picture of the metadata store, with
  ``proxy = true``, ``connect_url`` = this gateway's advertised address and
  ``broker_url`` = the owner's. While the owner is unreachable (killed, its registration
  lease not yet expired) or the topic waits for a new owner, the lookup waits (up to
  `gateway.lookup_wait_seconds`) and answers with the new owner.
- **SchemaRegistry calls** (``danube_schema.SchemaRegistry``) go to any registered broker:
  the registry is in the metadata store.
- **Every other call** is forwarded to the broker named in the ``x-danube-broker-url``
  header (one channel per broker, payloads passed through as bytes); without the header
  it goes to the topic's owner.
- **When that broker is gone** (not registered, or the connection fails), producers'
  calls get UNAVAILABLE (the client backs off, looks up again here and recreates itself
  on the new owner); a consumer's stream is kept open, its next HealthCheck answers CLOSE
  and the stream ends just after, so the client re-subscribes through the gateway without
  a reopen spin. Ack and Nack for a gone broker answer OK (the messages are redelivered:
  at-least-once).

A gateway keeps no state beyond caches, so several can run side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from ballast.aio import Served, cancel_and_wait
from ballast.clock import SystemClock
from ballast.config import BallastConfig
from ballast.metadata import MetadataError, MetadataStore, WatchEvent, keys
from ballast.model import InvalidTopicName, TopicName
from ballast.server.directory import Directory
from ballast.server.protocol import (
    CLIENT_CONSUMER,
    CONNECT,
    HEALTH_CLOSE,
    pb,
)
from ballast.server.security import channel_credentials, interceptors, server_credentials
from ballast.server.server import MAX_RECEIVE_BYTES, split_url

__all__ = ["BROKER_HEADER", "Gateway", "OwnerTable"]

log = logging.getLogger(__name__)

BROKER_HEADER = "x-danube-broker-url"
_FORWARDED_HEADERS = ("authorization",)
_CACHE_IDS = 100_000
_CLOSE_DELAY = 0.2  # end a held stream this long after its CLOSE went out
_REACH_TIMEOUT = 0.25  # a probe of a dead owner must not hold up noticing its heir

_LOOKUP = "/danube.Discovery/TopicLookup"
_PARTITIONS = "/danube.Discovery/TopicPartitions"
_CREATE_PRODUCER = "/danube.ProducerService/CreateProducer"
_SEND = "/danube.ProducerService/SendMessage"
_SUBSCRIBE = "/danube.ConsumerService/Subscribe"
_RECEIVE = "/danube.ConsumerService/ReceiveMessages"
_ACK = "/danube.ConsumerService/Ack"
_NACK = "/danube.ConsumerService/Nack"
_HEALTH = "/danube.HealthCheck/HealthCheck"
_SCHEMA_REGISTRY = "/danube_schema.SchemaRegistry/"


@dataclass(frozen=True)
class Route:
    """A broker a call goes to."""

    broker_id: str | None
    url: str


class OwnerTable:
    """Registrations and assignments, from one listing of ``/cluster/`` and its watch."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.urls: dict[str, str] = {}  # broker id -> broker_url (registered brokers)
        self.assigned: dict[str, set[str]] = {}  # topic -> broker ids
        self.ready = asyncio.Event()
        self._changed = asyncio.Event()

    def owner(self, topic: str) -> Route | None:
        """The registered broker the topic is assigned to, if any."""
        for broker in sorted(self.assigned.get(topic, ())):
            url = self.urls.get(broker)
            if url:
                return Route(broker, url)
        return None

    def registered(self, url: str) -> str | None:
        """The id of the registered broker listening on `url`, if any."""
        for broker, known in self.urls.items():
            if known == url:
                return broker
        return None

    def any_broker(self) -> Route | None:
        """Some registered broker (for calls that name neither broker nor owned topic)."""
        for broker in sorted(self.urls):
            return Route(broker, self.urls[broker])
        return None

    async def changed(self, timeout: float) -> None:
        """Wait until something changes (or `timeout`)."""
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _apply(self, key: str, value: Any, deleted: bool) -> None:
        try:
            if key.startswith(keys.REGISTER_PREFIX):
                broker = keys.parse_register_key(key)
                url = value.get("broker_url") if isinstance(value, dict) else None
                if deleted or not isinstance(url, str) or not url:
                    self.urls.pop(broker, None)
                else:
                    self.urls[broker] = url
            elif key.startswith(keys.BROKERS_PREFIX):
                if key.endswith("/state") and key.count("/") == 4:
                    return
                broker, topic = keys.parse_assignment_key(key)
                owners = self.assigned.setdefault(str(topic), set())
                if deleted:
                    owners.discard(broker)
                    if not owners:
                        del self.assigned[str(topic)]
                else:
                    owners.add(broker)
            else:
                return
        except ValueError:
            return  # not a key of ours (the leader counts bad records)
        self._notify()

    async def run(self) -> None:
        """List, then follow the watch; re-list after a compaction or a store failure."""
        while True:
            try:
                listing = await self.store.get_prefix(keys.CLUSTER_PREFIX)
                self.urls.clear()
                self.assigned.clear()
                for kv in listing.items:
                    self._apply(kv.key, kv.value, False)
                self._notify()
                self.ready.set()
                watch = self.store.watch_prefix(keys.CLUSTER_PREFIX, listing.revision + 1)
                async for event in watch:
                    if not self._event(event):
                        break
            except asyncio.CancelledError:
                raise
            except MetadataError as exc:
                log.warning("gateway: metadata store: %s; re-listing in 1 s", exc)
            await asyncio.sleep(1.0)

    def _event(self, event: WatchEvent) -> bool:
        if event.kind == "compacted":
            return False
        if event.kind in ("put", "delete"):
            self._apply(event.key, event.value, event.kind == "delete")
        return True


class BrokerLinks:
    """One gRPC channel per broker URL, reused by every forwarded call."""

    def __init__(self, credentials: grpc.ChannelCredentials | None) -> None:
        self.credentials = credentials
        self.channels: dict[str, grpc.aio.Channel] = {}
        self._unary: dict[tuple[str, str], Any] = {}

    def unary(self, url: str, method: str) -> Any:
        """The (cached) bytes-in, bytes-out callable of `method` on `url`'s channel."""
        call = self._unary.get((url, method))
        if call is None:
            call = self._unary[(url, method)] = self.channel(url).unary_unary(method)
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
        channels, self.channels = self.channels, {}
        self._unary.clear()
        for channel in channels.values():
            await channel.close()


def _connection_lost(exc: grpc.aio.AioRpcError) -> bool:
    """A failure of the link, not an answer of the broker (which always names a reason)."""
    if exc.code() is not grpc.StatusCode.UNAVAILABLE:
        return False
    details = (exc.details() or "").lower()
    return any(
        hint in details
        for hint in (
            "connect",
            "socket",
            "connection",
            "endpoint",
            "unreachable",
            "broken pipe",
            "goaway",
            "closed",
            "reset",
            "dns",
            "handshake",
            "ssl",
        )
    )


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Gateway(Served, grpc.GenericRpcHandler):
    """Serves the client protocol by answering lookups and forwarding everything else."""

    def __init__(self, store: MetadataStore, config: BallastConfig, listen: str) -> None:
        self.store = store
        self.config = config
        self.settings = config.gateway
        self.bind_host, self.bind_port = split_url(listen)
        self.url = ""
        self.advertise = ""
        self.table = OwnerTable(store)
        self.directory = Directory(store, SystemClock())
        self.links = BrokerLinks(channel_credentials(config.tls))
        self.consumer_routes: OrderedDict[int, str] = OrderedDict()
        self._held: dict[int, set[asyncio.Event]] = {}
        self._server: grpc.aio.Server | None = None
        self._watch: asyncio.Task[None] | None = None
        self.counts: dict[str, int] = {}
        self._handlers = {
            _LOOKUP: grpc.unary_unary_rpc_method_handler(
                self._lookup,
                request_deserializer=pb.TopicLookupRequest.FromString,
                response_serializer=pb.TopicLookupResponse.SerializeToString,
            ),
            _PARTITIONS: grpc.unary_unary_rpc_method_handler(
                self._partitions,
                request_deserializer=pb.TopicLookupRequest.FromString,
                response_serializer=pb.TopicPartitionsResponse.SerializeToString,
            ),
            _CREATE_PRODUCER: grpc.unary_unary_rpc_method_handler(self._create_producer),
            _SEND: grpc.unary_unary_rpc_method_handler(self._send),
            _SUBSCRIBE: grpc.unary_unary_rpc_method_handler(self._subscribe),
            _RECEIVE: grpc.unary_stream_rpc_method_handler(self._receive),
            _ACK: grpc.unary_unary_rpc_method_handler(self._ack),
            _NACK: grpc.unary_unary_rpc_method_handler(self._nack),
            _HEALTH: grpc.unary_unary_rpc_method_handler(self._health),
        }

    # -- serving ---------------------------------------------------------------------------

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None and method.startswith(_SCHEMA_REGISTRY):
            handler = self._handlers[method] = self._schema_handler(method)
        return handler

    def _schema_handler(self, method: str) -> Any:
        """The schema registry lives in the metadata store: any broker answers it."""

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.settings.lookup_wait_seconds
            while self.table.any_broker() is None and loop.time() < deadline:
                await self.table.changed(0.2)  # no broker registered yet (or just now)
            return await self._unary(method, request, context)

        return grpc.unary_unary_rpc_method_handler(forward)

    async def start(self) -> str:
        """Bind, follow the metadata store and serve; returns the advertised address."""
        self._watch = asyncio.create_task(self.table.run(), name="gateway/owners")
        async with asyncio.timeout(30):
            await self.table.ready.wait()
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
            interceptors=interceptors(
                self.config, lambda rpc, code: self._count(f"refused_{code}")
            ),
        )
        server.add_generic_rpc_handlers((self,))
        address = f"{self.bind_host}:{self.bind_port}"
        credentials = server_credentials(self.config.tls)
        try:
            if credentials is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, credentials)
        except RuntimeError:
            port = 0
        if port == 0:
            raise OSError(f"gateway {address}: cannot listen there (in use?); choose another port")
        self.url = f"{self.bind_host}:{port}"
        self.advertise = self.settings.advertise or self.url
        await server.start()
        self._server = server
        log.info("gateway: serving on %s (advertised as %s)", self.url, self.advertise)
        return self.advertise

    async def stop(self, grace: float = 1.0) -> None:
        server, self._server = self._server, None
        for events in self._held.values():
            for event in events:
                event.set()
        if server is not None:
            await server.stop(grace)
        if self._watch is not None:
            await cancel_and_wait(self._watch)
            self._watch = None
        await self.links.close()

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    # -- routing ---------------------------------------------------------------------------

    @staticmethod
    def _metadata(context: grpc.aio.ServicerContext) -> tuple[str | None, list[tuple[str, str]]]:
        """(the proxy header, the entries passed on to the broker)."""
        header = None
        forwarded: list[tuple[str, str]] = []
        for key, value in context.invocation_metadata() or ():
            text = value.decode() if isinstance(value, bytes) else str(value)
            if key == BROKER_HEADER:
                header = text
            elif key in _FORWARDED_HEADERS:
                forwarded.append((key, text))
        return header, forwarded

    def _route(self, header: str | None, topic: str | None, consumer: int | None) -> Route | None:
        """Where a call goes: the header's broker, else the owner, else a cached route."""
        if header:
            broker = self.table.registered(header)
            return Route(broker, header) if broker is not None else None
        if topic:
            owner = self.table.owner(topic)
            if owner is not None:
                return owner
        if consumer is not None:
            url = self.consumer_routes.get(consumer)
            if url is not None and self.table.registered(url) is not None:
                return Route(self.table.registered(url), url)
        if topic or consumer is None:
            return self.table.any_broker()
        return None

    @staticmethod
    def _gone(route: Route | None, header: str | None) -> _Abort:
        name = route.url if route is not None else header or "the topic's broker"
        return _Abort(
            grpc.StatusCode.UNAVAILABLE,
            f"broker {name} is gone or unreachable; look the topic up again (through this gateway)",
        )

    async def _forward(
        self,
        method: str,
        request: bytes,
        context: grpc.aio.ServicerContext,
        *,
        topic: str | None = None,
        consumer: int | None = None,
    ) -> tuple[bytes, Route]:
        """Send one unary call on; `_Abort` carries the answer when it fails."""
        header, metadata = self._metadata(context)
        route = self._route(header, topic, consumer)
        if route is None:
            raise self._gone(route, header)
        call = self.links.unary(route.url, method)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.lookup_wait_seconds
        while True:
            try:
                reply = await call(
                    request, metadata=metadata, timeout=self.settings.forward_timeout_seconds
                )
            except grpc.aio.AioRpcError as exc:
                if _connection_lost(exc):
                    raise self._gone(route, header) from None
                if self._still_loading(method, exc, topic, route) and loop.time() < deadline:
                    # The assigned owner is still opening the topic (after a failover it
                    # may take a while): wait here instead of spending the client's six
                    # attempts, after which a consumer gives up for good.
                    self._count("held_until_served")
                    await self.table.changed(0.2)
                    continue
                raise _Abort(exc.code(), exc.details() or exc.code().name) from None
            return reply, route

    def _still_loading(
        self, method: str, exc: grpc.aio.AioRpcError, topic: str | None, route: Route
    ) -> bool:
        """UNAVAILABLE to a CreateProducer/Subscribe from the broker the topic is assigned to."""
        if method not in (_CREATE_PRODUCER, _SUBSCRIBE) or not topic:
            return False
        if exc.code() is not grpc.StatusCode.UNAVAILABLE:
            return False
        owner = self.table.owner(topic)
        return owner is not None and owner.url == route.url

    async def _unary(
        self,
        method: str,
        request: bytes,
        context: grpc.aio.ServicerContext,
        *,
        topic: str | None = None,
        consumer: int | None = None,
    ) -> bytes:
        try:
            reply, _ = await self._forward(method, request, context, topic=topic, consumer=consumer)
        except _Abort as exc:
            self._count(f"{method.rsplit('/', 1)[-1]}:{exc.code.name}")
            await context.abort(exc.code, exc.message)
        return reply

    # -- Discovery -------------------------------------------------------------------------

    async def _lookup(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            topic = TopicName.parse(request.topic)
        except InvalidTopicName as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"topic: {exc}")
        name = str(topic)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.lookup_wait_seconds
        unreachable: str | None = None
        checked_exists = False
        while True:
            owner = self.table.owner(name)
            left = deadline - loop.time()
            if owner is not None:
                if await self.links.reachable(owner.url, max(0.05, min(_REACH_TIMEOUT, left))):
                    self._count("lookup")
                    return pb.TopicLookupResponse(
                        request_id=request.request_id,
                        response_type=CONNECT,
                        connect_url=self.advertise,
                        broker_url=owner.url,
                        proxy=True,
                    )
                unreachable = f"{owner.broker_id} ({owner.url})"
            elif not checked_exists:
                checked_exists = True
                try:
                    exists = (
                        await self.directory.meta(topic) is not None
                        or await self.directory.marker(topic) is not None
                    )
                except MetadataError as exc:
                    await context.abort(
                        grpc.StatusCode.UNAVAILABLE, f"metadata store unavailable: {exc}"
                    )
                if not exists:
                    await context.abort(
                        grpc.StatusCode.NOT_FOUND,
                        f"topic {name} does not exist (a producer creates it)",
                    )
            left = deadline - loop.time()
            if left <= 0:
                self._count("lookup_timeout")
                why = f"its owner {unreachable} is unreachable" if unreachable else "unplaced"
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"topic {name} has no live owner yet ({why}); retry",
                )
            await self.table.changed(min(0.5, left))

    async def _partitions(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            topic = TopicName.parse(request.topic)
        except InvalidTopicName as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"topic: {exc}")
        try:
            names = await self.directory.partitions(topic)
        except MetadataError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"metadata store unavailable: {exc}")
        return pb.TopicPartitionsResponse(request_id=request.request_id, partitions=names)

    # -- producers -------------------------------------------------------------------------

    async def _create_producer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        topic = pb.ProducerRequest.FromString(request).topic_name
        return await self._unary(_CREATE_PRODUCER, request, context, topic=topic)

    async def _send(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        header, _ = self._metadata(context)
        topic = None if header else pb.StreamMessage.FromString(request).msg_id.topic_name
        return await self._unary(_SEND, request, context, topic=topic)

    # -- consumers -------------------------------------------------------------------------

    async def _subscribe(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        topic = pb.ConsumerRequest.FromString(request).topic_name
        try:
            reply, route = await self._forward(_SUBSCRIBE, request, context, topic=topic)
        except _Abort as exc:
            self._count(f"Subscribe:{exc.code.name}")
            await context.abort(exc.code, exc.message)
        consumer = pb.ConsumerResponse.FromString(reply).consumer_id
        self.consumer_routes[consumer] = route.url
        self.consumer_routes.move_to_end(consumer)
        while len(self.consumer_routes) > _CACHE_IDS:
            self.consumer_routes.popitem(last=False)
        return reply

    async def _receive(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Pass the stream through; if its broker is gone, hold it for the close handshake."""
        consumer = pb.ReceiveRequest.FromString(request).consumer_id
        header, metadata = self._metadata(context)
        route = self._route(header, None, consumer)
        closed = asyncio.Event()
        self._held.setdefault(consumer, set()).add(closed)
        call = None
        try:
            if route is not None:
                call = self.links.channel(route.url).unary_stream(_RECEIVE)(
                    request, metadata=metadata
                )
                try:
                    async for item in call:
                        yield item
                    return
                except grpc.aio.AioRpcError as exc:
                    if exc.code() is grpc.StatusCode.CANCELLED and closed.is_set():
                        return
                    if not _connection_lost(exc):
                        await context.abort(exc.code(), exc.details() or exc.code().name)
            # The broker is gone: keep the stream open until the health check has told the
            # client to re-subscribe (CLOSE), then end it.
            self._count("receive_held")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closed.wait(), self.settings.close_hold_seconds)
        finally:
            if call is not None:
                call.cancel()
            events = self._held.get(consumer)
            if events is not None:
                events.discard(closed)
                if not events:
                    del self._held[consumer]

    def _close_sent(self, consumer: int) -> None:
        """End the consumer's held streams just after its CLOSE went out."""

        def end() -> None:
            for event in self._held.get(consumer, ()):
                event.set()

        asyncio.get_running_loop().call_later(_CLOSE_DELAY, end)

    async def _ack(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._lenient(_ACK, request, context, pb.AckResponse, pb.AckRequest)

    async def _nack(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._lenient(_NACK, request, context, pb.NackResponse, pb.NackRequest)

    async def _lenient(
        self,
        method: str,
        request: bytes,
        context: grpc.aio.ServicerContext,
        reply_cls: Any,
        request_cls: Any,
    ) -> bytes:
        """Ack/Nack: a gone broker answers OK (its messages are redelivered elsewhere)."""
        header, _ = self._metadata(context)
        parsed = request_cls.FromString(request)
        topic = None if header else parsed.msg_id.topic_name
        try:
            reply, _ = await self._forward(method, request, context, topic=topic)
        except _Abort as exc:
            if exc.code is grpc.StatusCode.UNAVAILABLE:
                self._count(f"{method.rsplit('/', 1)[-1]}:dropped")
                return bytes(reply_cls(request_id=parsed.request_id).SerializeToString())
            await context.abort(exc.code, exc.message)
        return reply

    # -- health ----------------------------------------------------------------------------

    async def _health(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Forward; a gone broker answers CLOSE (the client then re-subscribes/recreates)."""
        parsed = pb.HealthCheckRequest.FromString(request)
        consumer = parsed.id if parsed.client == CLIENT_CONSUMER else None
        try:
            reply, _ = await self._forward(_HEALTH, request, context, consumer=consumer)
        except _Abort as exc:
            if exc.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED):
                await context.abort(exc.code, exc.message)
            self._count("health_close")
            reply = pb.HealthCheckResponse(status=HEALTH_CLOSE).SerializeToString()
        if consumer is not None and pb.HealthCheckResponse.FromString(reply).status == HEALTH_CLOSE:
            self._close_sent(consumer)
        return bytes(reply)


async def serve_gateway(
    store: MetadataStore,
    config: BallastConfig,
    listen: str,
    stop: asyncio.Event,
    on_started: Callable[[str], None] | None = None,
) -> None:
    """Serve until `stop` is set."""
    async with Gateway(store, config, listen) as gateway:
        if on_started is not None:
            on_started(gateway.advertise)
        await stop.wait()
