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
  header (one channel per broker, connected as the broker registers; payloads passed
  through as bytes); without the header it goes to the topic's owner. Sends and acks
  travel batched on a link per broker (`link`). Clients are served by the gateway's own
  gRPC-over-HTTP/2 server (`h2grpc`).
- **Producers and consumers created here are sessions** (`gateway_sessions`): the client
  gets an id of the gateway's, and when the topic moves or its owner dies the gateway
  re-creates the producer or consumer on the new owner and carries on, so the client
  sees a pause, not an error: sends are held (bounded) and forwarded to the new owner,
  the consumer stream stays open and continues from the new owner, dropping what the
  client already acknowledged. Acks and Nacks go to the topic's current owner.
- **Ids this gateway did not hand out** (another gateway's, or from before a restart)
  are forwarded as they are. When that broker is gone, producers' calls get UNAVAILABLE
  (the client looks up again here and recreates itself); a consumer's stream is kept
  open, its next HealthCheck answers CLOSE and the stream ends just after, so the client
  re-subscribes without a reopen spin. Ack and Nack for a gone broker answer OK (the
  messages are redelivered: at-least-once).

The sessions are the gateway's only state besides caches: when a gateway dies its
clients recreate their producers and consumers through another one (as on any
UNAVAILABLE), so several can run side by side behind one address.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
from danube.proto import SchemaRegistry_pb2 as spb

from ballast import heap
from ballast.aio import Served, cancel_and_wait
from ballast.clock import SystemClock
from ballast.config import BallastConfig
from ballast.metadata import MetadataError, MetadataStore, WatchEvent, keys
from ballast.metadata.records import RecordKind, Registration, classify, parse_owner_value
from ballast.model import InvalidTopicName, ModelError, TopicName
from ballast.server.auth import bearer_token
from ballast.server.directory import Directory
from ballast.server.gateway_metrics import serve_metrics
from ballast.server.gateway_sessions import ConsumerSession, HeldBudget, SessionTable
from ballast.server.h2grpc import H2GrpcServer, WireLimits
from ballast.server.link import ACK_LINK_METHOD, BATCH_BYTES, LINK_METHOD, SendLink, rpc_error
from ballast.server.protocol import (
    CLIENT_CONSUMER,
    CLIENT_PRODUCER,
    CONNECT,
    HEALTH_CLOSE,
    HEALTH_OK,
    pb,
)
from ballast.server.relay import CARRIED_HEADER
from ballast.server.security import (
    channel_credentials,
    client_ssl_context,
    interceptors,
    server_ssl_context,
    token_authority,
)
from ballast.server.server import MAX_RECEIVE_BYTES, split_url

__all__ = ["BROKER_HEADER", "Gateway", "OwnerTable"]

log = logging.getLogger(__name__)

BROKER_HEADER = "x-danube-broker-url"
_FORWARDED_HEADERS = ("authorization",)
_CACHE_IDS = 100_000
_CLOSE_DELAY = 0.2  # end a held stream this long after its CLOSE went out
# A carried session asks a new owner still opening its topic again after 10 ms (a move's
# opening is short), backing off to 100 ms (a failover opens many topics at once).
_LOADING_POLL = (0.01, 0.1)
_REACH_TIMEOUT = 0.25  # a probe of a dead owner must not hold up noticing its heir

_REFUSALS = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
)

_LOOKUP = "/danube.Discovery/TopicLookup"
_PARTITIONS = "/danube.Discovery/TopicPartitions"
_CREATE_PRODUCER = "/danube.ProducerService/CreateProducer"
_SEND = "/danube.ProducerService/SendMessage"
_SUBSCRIBE = "/danube.ConsumerService/Subscribe"
_RECEIVE = "/danube.ConsumerService/ReceiveMessages"
_ACK = "/danube.ConsumerService/Ack"
_NACK = "/danube.ConsumerService/Nack"
_HEALTH = "/danube.HealthCheck/HealthCheck"
_LINKED = {_SEND: LINK_METHOD, _ACK: ACK_LINK_METHOD}  # client RPC -> the link carrying it
_SCHEMA_SERVICE = spb.DESCRIPTOR.services_by_name["SchemaRegistry"]
_SCHEMA_METHODS = tuple(f"/{_SCHEMA_SERVICE.full_name}/{m.name}" for m in _SCHEMA_SERVICE.methods)


@dataclass(frozen=True)
class Route:
    """A broker a call goes to."""

    broker_id: str | None
    url: str


class OwnerTable:
    """Registrations and ownership records, from one listing of ``/cluster/`` and its watch."""

    def __init__(
        self,
        store: MetadataStore,
        on_gone: Callable[[str], None] | None = None,
        on_new: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.on_gone = on_gone  # called with a broker_url whose registration went away
        self.on_new = on_new  # and with one that registered
        self.urls: dict[str, str] = {}  # broker id -> broker_url (registered brokers)
        self.owners: dict[str, str] = {}  # topic -> broker id (its ownership record)
        self.ready = asyncio.Event()
        self.version = 0  # counts changes: a waiter misses none made since it looked
        self._changed = asyncio.Event()

    def owner(self, topic: str) -> Route | None:
        """The registered broker the topic's ownership record names, if any (the same
        answer as `Directory.owner`, from the watch instead of two reads)."""
        broker = self.owners.get(topic)
        url = self.urls.get(broker) if broker is not None else None
        return Route(broker, url) if url else None

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

    async def changed(self, timeout: float, since: int) -> None:
        """Wait until something changes after `version` was `since` (or `timeout`): a
        change made while the caller was busy (e.g. asking the old owner) ends it at once."""
        if self.version != since:
            return
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    def _notify(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def _apply(self, key: str, value: Any, deleted: bool) -> None:
        try:
            kind, broker, topic = classify(key)
        except ValueError:
            return  # not a key of ours (the leader counts bad records)
        if kind is RecordKind.REGISTRATION and broker is not None:
            before = self.urls.get(broker)
            _put_or_drop(self.urls, broker, None if deleted else _broker_url(value))
            after = self.urls.get(broker)
            if before is not None and before != after and self.on_gone:
                self.on_gone(before)
            if after is not None and before != after and self.on_new:
                self.on_new(after)
        elif kind is RecordKind.OWNER and topic is not None:
            _put_or_drop(self.owners, topic, None if deleted else _owner(value))
        else:
            return
        self._notify()

    async def run(self) -> None:
        """List, then follow the watch; re-list after a compaction or a store failure."""
        while True:
            try:
                listing = await self.store.get_prefix(keys.CLUSTER_PREFIX)
                self.urls.clear()
                self.owners.clear()
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


def _put_or_drop(table: dict[str, str], key: str, value: str | None) -> None:
    if value:
        table[key] = value
    else:
        table.pop(key, None)


# A record that does not decode routes nowhere (the leader counts it as rejected).
def _broker_url(value: Any) -> str | None:
    try:
        return Registration.from_dict(value).broker_url
    except ModelError:
        return None


def _owner(value: Any) -> str | None:
    try:
        return parse_owner_value(value)
    except ModelError:
        return None


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
        linked = _LINKED.get(method) if len(request) < BATCH_BYTES else None
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
            for method in _LINKED.values():
                self._link(url, method).open()

    def abandon(self, url: str) -> None:
        """The broker at `url` lost its registration (dead, stalled past its TTL or cut
        off from the store): end its links and unary calls, so that calls waiting on it
        fail as on a lost connection and their sessions move to the topic's next owner,
        instead of waiting out `forward_timeout_seconds` on a host that may never answer
        (no RST comes from a host that lost power)."""
        for method in _LINKED.values():
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


class Gateway(Served):
    """Serves the client protocol by answering lookups and forwarding everything else."""

    def __init__(self, store: MetadataStore, config: BallastConfig, listen: str) -> None:
        self.store = store
        self.config = config
        self.settings = config.gateway
        self.bind_host, self.bind_port = split_url(listen)
        self.url = ""
        self.advertise = ""
        self.links = BrokerLinks(
            channel_credentials(config.tls),
            self.settings.batch_sends,
            client_ssl_context(config.tls),
        )
        self.table = OwnerTable(store, self.links.abandon, self.links.warm)
        self.directory = Directory(store, SystemClock())
        self.sessions = SessionTable(_CACHE_IDS)
        self.held = HeldBudget(self.settings.held_sends_max, self.settings.held_bytes_max)
        self._reacks: set[asyncio.Task[None]] = set()
        self._held: dict[int, set[asyncio.Event]] = {}
        self._server: H2GrpcServer | None = None
        self._metrics: WSGIServer | None = None
        self.metrics_url = ""  # host:port of the Prometheus endpoint, when served
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
        for name in _SCHEMA_METHODS:
            self._handlers[name] = self._schema_handler(name)

    # -- serving ---------------------------------------------------------------------------

    def _schema_handler(self, method: str) -> Any:
        """The schema registry lives in the metadata store: any broker answers it."""

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.settings.lookup_wait_seconds
            while True:
                seen = self.table.version
                if self.table.any_broker() is not None or loop.time() >= deadline:
                    break
                await self.table.changed(0.2, seen)  # no broker registered yet (or just now)
            return await self._unary(method, request, context)

        return grpc.unary_unary_rpc_method_handler(forward)

    async def start(self) -> str:
        """Bind, follow the metadata store and serve; returns the advertised address."""
        self._watch = asyncio.create_task(self.table.run(), name="gateway/owners")
        async with asyncio.timeout(30):
            await self.table.ready.wait()
        handlers = dict(self._handlers)
        for interceptor in interceptors(
            token_authority(self.config), lambda rpc, code: self._count(f"refused_{code}")
        ):
            handlers = {method: interceptor.wrap(method, h) for method, h in handlers.items()}
        server = H2GrpcServer(
            handlers.get,
            max_receive=MAX_RECEIVE_BYTES,
            ssl_context=server_ssl_context(self.config.tls),
            limits=WireLimits.of(self.config.wire),
        )
        try:
            port = await server.start(self.bind_host, self.bind_port)
        except OSError as exc:
            address = f"{self.bind_host}:{self.bind_port}"
            raise OSError(
                f"gateway {address}: cannot listen there ({exc.strerror or exc}); "
                "choose another port"
            ) from None
        self.url = f"{self.bind_host}:{port}"
        self.advertise = self.settings.advertise or self.url
        self._server = server
        log.info("gateway: serving on %s (advertised as %s)", self.url, self.advertise)
        if self.settings.metrics_port:
            try:
                self._metrics = serve_metrics(self, self.bind_host, self.settings.metrics_port)
            except OSError as exc:
                await self.stop(0)
                raise OSError(
                    f"gateway metrics {self.bind_host}:{self.settings.metrics_port}: "
                    f"cannot listen there ({exc}); choose another gateway.metrics_port"
                ) from None
            self.metrics_url = f"{self.bind_host}:{self._metrics.server_port}"
            log.info("gateway: Prometheus series on http://%s/metrics", self.metrics_url)
        return self.advertise

    async def stop(self, grace: float = 1.0) -> None:
        metrics, self._metrics = self._metrics, None
        if metrics is not None:
            await asyncio.to_thread(metrics.shutdown)
            metrics.server_close()
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

    @property
    def wire(self) -> H2GrpcServer | None:
        """The client port's server (its protections' counts), while serving."""
        return self._server

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

    def _route(
        self, header: str | None, topic: str | None, *, stream: bool = False
    ) -> Route | None:
        """Where a call goes: the header's broker, else the owner, else any broker.

        A consumer's stream or health check without the header has nowhere to go.
        """
        if header:
            broker = self.table.registered(header)
            return Route(broker, header) if broker is not None else None
        if topic:
            owner = self.table.owner(topic)
            if owner is not None:
                return owner
        return None if stream else self.table.any_broker()

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
        stream: bool = False,
    ) -> tuple[bytes, Route]:
        """Send one unary call on; `_Abort` carries the answer when it fails."""
        header, metadata = self._metadata(context)
        route = self._route(header, topic, stream=stream)
        if route is None:
            raise self._gone(route, header)
        call = self.links.unary(route.url, method)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.lookup_wait_seconds
        while True:
            seen = self.table.version
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
                    await self.table.changed(0.2, seen)
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
    ) -> bytes:
        try:
            reply, _ = await self._forward(method, request, context, topic=topic)
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
            seen = self.table.version
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
            await self.table.changed(min(0.5, left), seen)

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

    # -- sessions --------------------------------------------------------------------------

    async def _recreate(
        self,
        session: Any,
        method: str,
        generation: int,
        metadata: list[tuple[str, str]],
        deadline: float,
    ) -> None:
        """Create the session's producer/consumer on the topic's serving owner.

        Waits (until `deadline`) while the topic has no owner, its owner is unreachable
        or still opening it; concurrent callers re-create once. `_Abort` when it cannot.
        """
        loop = asyncio.get_running_loop()
        async with session.lock:
            if session.generation != generation:
                return  # another call already did
            poll = _LOADING_POLL[0]
            asked: str | None = None
            while True:
                seen = self.table.version
                owner = self.table.owner(session.topic)
                answered = False  # the owner answered (it is opening the topic): ask again soon
                if owner is not None:
                    if owner.url != asked:  # a new owner: its opening has just begun
                        asked, poll = owner.url, _LOADING_POLL[0]
                    try:
                        reply = await self.links.unary(owner.url, method)(
                            session.request,
                            metadata=metadata,
                            timeout=self.settings.forward_timeout_seconds,
                        )
                    except grpc.aio.AioRpcError as exc:
                        if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                            raise _Abort(exc.code(), exc.details() or exc.code().name) from None
                        answered = not _connection_lost(exc)
                    else:
                        if method == _CREATE_PRODUCER:
                            broker_id = pb.ProducerResponse.FromString(reply).producer_id
                        else:
                            broker_id = pb.ConsumerResponse.FromString(reply).consumer_id
                        session.url, session.broker_id = owner.url, broker_id
                        session.generation += 1
                        self._count(f"{method.rsplit('/', 1)[-1]}:carried")
                        return
                left = deadline - loop.time()
                if left <= 0:
                    raise _Abort(
                        grpc.StatusCode.UNAVAILABLE,
                        f"topic {session.topic} has no serving owner after "
                        f"{self.settings.lookup_wait_seconds} s; look it up again",
                    )
                wait = poll if answered else 0.2
                if answered:
                    poll = min(poll * 1.5, _LOADING_POLL[1])
                await self.table.changed(min(wait, left), seen)

    # -- producers -------------------------------------------------------------------------

    async def _create_producer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        topic = pb.ProducerRequest.FromString(request).topic_name
        try:
            reply, route = await self._forward(_CREATE_PRODUCER, request, context, topic=topic)
        except _Abort as exc:
            self._count(f"CreateProducer:{exc.code.name}")
            await context.abort(exc.code, exc.message)
        answer = pb.ProducerResponse.FromString(reply)
        answer.producer_id = self.sessions.add_producer(
            topic, request, route.url, answer.producer_id
        )
        return bytes(answer.SerializeToString())

    async def _send(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        message = pb.StreamMessage.FromString(request)
        session = self.sessions.producer(message.msg_id.producer_id)
        if session is None:  # not created here: pass it on as it is
            header, _ = self._metadata(context)
            topic = None if header else message.msg_id.topic_name
            return await self._unary(_SEND, request, context, topic=topic)
        _, metadata = self._metadata(context)
        size = len(message.payload)
        deadline: float | None = None
        try:
            while True:
                generation = session.generation
                message.msg_id.producer_id = session.broker_id
                try:
                    return await self.links.call(
                        session.url,
                        _SEND,
                        message.SerializeToString(),
                        metadata,
                        self.settings.forward_timeout_seconds,
                    )
                except grpc.aio.AioRpcError as exc:
                    if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                        raise _Abort(exc.code(), exc.details() or exc.code().name) from None
                # The owner no longer takes it (sealing, moved, dead): hold it until the
                # producer exists on the new owner.
                if deadline is None:
                    if not self.held.take(size):
                        self._count("SendMessage:held_full")
                        raise _Abort(
                            grpc.StatusCode.UNAVAILABLE,
                            f"topic {session.topic} is moving and the gateway holds "
                            f"{self.held.count} sends ({self.held.bytes} bytes) already; retry",
                        )
                    self._count("SendMessage:held")
                    deadline = asyncio.get_running_loop().time() + (
                        self.settings.lookup_wait_seconds
                    )
                await self._recreate(session, _CREATE_PRODUCER, generation, metadata, deadline)
        except _Abort as exc:
            self._count(f"SendMessage:{exc.code.name}")
            await context.abort(exc.code, exc.message)
            raise AssertionError("unreachable") from None
        finally:
            if deadline is not None:
                self.held.give_back(size)

    # -- consumers -------------------------------------------------------------------------

    async def _subscribe(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        parsed = pb.ConsumerRequest.FromString(request)
        try:
            reply, route = await self._forward(
                _SUBSCRIBE, request, context, topic=parsed.topic_name
            )
        except _Abort as exc:
            self._count(f"Subscribe:{exc.code.name}")
            await context.abort(exc.code, exc.message)
        answer = pb.ConsumerResponse.FromString(reply)
        answer.consumer_id = self.sessions.add_consumer(
            parsed.topic_name, parsed.subscription, request, route.url, answer.consumer_id
        )
        return bytes(answer.SerializeToString())

    async def _receive(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        parsed = pb.ReceiveRequest.FromString(request)
        session = self.sessions.consumer(parsed.consumer_id)
        stream = (
            self._receive_passed(request, parsed.consumer_id, context)
            if session is None
            else self._receive_carried(session, parsed.request_id, context)
        )
        async for item in stream:
            yield item

    async def _receive_carried(
        self, session: ConsumerSession, request_id: int, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """The session's stream, continued from each new owner of its topic."""
        _, metadata = self._metadata(context)
        session.receiver += 1
        mine = session.receiver
        replaying = False  # just re-subscribed: drop what the client acknowledged already
        while session.receiver == mine:
            generation, url = session.generation, session.url
            receive = pb.ReceiveRequest(request_id=request_id, consumer_id=session.broker_id)
            call = self.links.channel(url).unary_stream(_RECEIVE)(
                receive.SerializeToString(), metadata=[*metadata, (CARRIED_HEADER, "1")]
            )
            queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)
            failure: list[grpc.aio.AioRpcError] = []
            pump = asyncio.create_task(_pump(call, queue, failure))
            watch = asyncio.create_task(self._until_moved(session.topic, url, call))
            try:
                while (item := await queue.get()) is not None:
                    if replaying:
                        replaying, duplicate = self._replayed(session, item, metadata)
                        if duplicate:
                            continue
                    yield item
            finally:
                call.cancel()
                await cancel_and_wait(pump)
                await cancel_and_wait(watch)
            if session.receiver != mine:
                return  # the client opened a newer stream
            if failure and failure[0].code() in _REFUSALS:
                # The broker refused the client itself: re-subscribing cannot help.
                await context.abort(failure[0].code(), failure[0].details() or "")
            self._count("ReceiveMessages:carried")
            deadline = asyncio.get_running_loop().time() + self.settings.lookup_wait_seconds
            try:
                await self._recreate(session, _SUBSCRIBE, generation, metadata, deadline)
            except _Abort as exc:
                await context.abort(exc.code, exc.message)
            replaying = bool(session.acked)

    def _replayed(
        self, session: ConsumerSession, item: bytes, metadata: list[tuple[str, str]]
    ) -> tuple[bool, bool]:
        """(still replaying, drop this one): a redelivery of an acknowledged message is
        acknowledged on the new owner and not passed on."""
        msg_id = pb.StreamMessage.FromString(item).msg_id
        if not session.already_acked(msg_id.topic_offset):
            return msg_id.topic_offset < session.max_acked, False
        ack = pb.AckRequest(msg_id=msg_id, subscription_name=session.subscription)
        task = asyncio.create_task(self._reack(session.url, ack.SerializeToString(), metadata))
        self._reacks.add(task)
        task.add_done_callback(self._reacks.discard)
        self._count("ReceiveMessages:acked_dropped")
        return True, True

    async def _reack(self, url: str, request: bytes, metadata: list[tuple[str, str]]) -> None:
        # With the client's token: a secured broker checks it as for the client's own ack.
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self.links.call(
                url, _ACK, request, metadata, self.settings.forward_timeout_seconds
            )

    async def _until_moved(self, topic: str, url: str, call: Any) -> None:
        """End the stream from `url` once another broker owns the topic."""
        while True:
            seen = self.table.version
            owner = self.table.owner(topic)
            if owner is not None and owner.url != url:
                call.cancel()
                return
            await self.table.changed(1.0, seen)

    async def _receive_passed(
        self, request: bytes, consumer: int, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """Pass the stream through; if its broker is gone, hold it for the close handshake."""
        header, metadata = self._metadata(context)
        route = self._route(header, None, stream=True)
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
                    # NOT_FOUND: the broker does not know the id (another gateway's session,
                    # whose gateway died): the close handshake sends the client to subscribe.
                    if not _connection_lost(exc) and exc.code() is not grpc.StatusCode.NOT_FOUND:
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
        """Ack/Nack go to the topic's owner; a gone one answers OK (its messages are
        redelivered elsewhere; an acknowledged one is then dropped by its session)."""
        header, metadata = self._metadata(context)
        parsed = request_cls.FromString(request)
        topic = parsed.msg_id.topic_name
        if method == _ACK:
            for session in self.sessions.subscribed(topic, parsed.subscription_name):
                session.remember_ack(parsed.msg_id.topic_offset)
        route = self.table.owner(topic) or self._route(header, topic)
        try:
            if route is None:
                raise self._gone(route, header)
            try:
                return await self.links.call(
                    route.url, method, request, metadata, self.settings.forward_timeout_seconds
                )
            except grpc.aio.AioRpcError as exc:
                raise _Abort(exc.code(), exc.details() or exc.code().name) from None
        except _Abort as exc:
            if exc.code is grpc.StatusCode.UNAVAILABLE:
                self._count(f"{method.rsplit('/', 1)[-1]}:dropped")
                return bytes(reply_cls(request_id=parsed.request_id).SerializeToString())
            await context.abort(exc.code, exc.message)
            raise AssertionError("unreachable") from None

    # -- health ----------------------------------------------------------------------------

    async def _health(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """A session is healthy while the gateway carries it; others are forwarded, and a
        gone broker answers CLOSE (the client then re-subscribes/recreates)."""
        parsed = pb.HealthCheckRequest.FromString(request)
        session: Any = None
        if parsed.client == CLIENT_PRODUCER:
            session = self.sessions.producer(parsed.id)
        elif parsed.client == CLIENT_CONSUMER:
            session = self.sessions.consumer(parsed.id)
        if session is not None:
            # The owner learns the client is alive; its CLOSE (the topic is leaving) ends
            # the stream there, and the session moves on.
            _, metadata = self._metadata(context)
            parsed.id = session.broker_id
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.links.unary(session.url, _HEALTH)(
                    parsed.SerializeToString(),
                    metadata=metadata,
                    timeout=self.settings.forward_timeout_seconds,
                )
            return bytes(pb.HealthCheckResponse(status=HEALTH_OK).SerializeToString())
        consumer = parsed.id if parsed.client == CLIENT_CONSUMER else None
        try:
            reply, _ = await self._forward(_HEALTH, request, context, stream=consumer is not None)
        except _Abort as exc:
            if exc.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED):
                await context.abort(exc.code, exc.message)
            self._count("health_close")
            reply = pb.HealthCheckResponse(status=HEALTH_CLOSE).SerializeToString()
        if consumer is not None and pb.HealthCheckResponse.FromString(reply).status == HEALTH_CLOSE:
            self._close_sent(consumer)
        return bytes(reply)


async def _pump(
    call: Any, queue: asyncio.Queue[bytes | None], failure: list[grpc.aio.AioRpcError]
) -> None:
    """Move a broker stream's messages into `queue`; None when it ends (the failure kept)."""
    try:
        async for item in call:
            await queue.put(item)
    except grpc.aio.AioRpcError as exc:
        failure.append(exc)
    finally:
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait(None)


async def serve_gateway(
    store: MetadataStore,
    config: BallastConfig,
    listen: str,
    stop: asyncio.Event,
    on_started: Callable[[str], None] | None = None,
) -> None:
    """Serve until `stop` is set."""
    async with Gateway(store, config, listen) as gateway:
        heap.settle()
        if on_started is not None:
            on_started(gateway.advertise)
        await stop.wait()
