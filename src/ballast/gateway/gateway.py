"""The Ballast gateway: a stateless front door that clients use as their `service_url`.

The published 0.5.0 client sends every re-lookup to the last address it used, so when the
broker that owned its topic dies, the client is stuck on a dead address
(docs/design/client-protocol.md). Clients that connect through a gateway never hold a broker's
address:

- **TopicLookup** is answered here (`discovery`), from a watch-fed picture of the store, with
  ``proxy = true``, ``connect_url`` = this gateway's advertised address and
  ``broker_url`` = the owner's. While the owner is unreachable (killed, its registration
  lease not yet expired) or the topic waits for a new owner, the lookup waits (up to
  `gateway.lookup_wait_seconds`) and answers with the new owner.
- **SchemaRegistry calls** (``danube_schema.SchemaRegistry``) go to any registered broker:
  the registry is in the metadata store.
- **Every other call** is forwarded to the broker named in the ``x-danube-broker-url``
  header (one channel per broker, connected as the broker registers; payloads passed
  through as bytes); without the header it goes to the topic's owner (`routes`). Sends
  and acks travel batched on a link per broker (`brokers`, over `ballast.wire.link`).
  Clients are served by the wire layer's gRPC-over-HTTP/2 server (`ballast.wire.h2grpc`).
- **Producers and consumers created here are sessions** (`sessions`; their streams in
  `streams`): the client
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
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
from danube.proto import SchemaRegistry_pb2 as spb

from ballast import heap
from ballast.aio import Served, cancel_and_wait
from ballast.clock import SystemClock
from ballast.config import BallastConfig
from ballast.gateway.brokers import BrokerLinks
from ballast.gateway.calls import (
    ACK,
    CREATE_PRODUCER,
    HEALTH,
    LOOKUP,
    NACK,
    PARTITIONS,
    RECEIVE,
    SEND,
    SUBSCRIBE,
    Abort,
    connection_lost,
    split_metadata,
)
from ballast.gateway.discovery import Discovery
from ballast.gateway.metrics import serve_metrics
from ballast.gateway.reachability import ReachabilityReporter, gateway_id
from ballast.gateway.routes import OwnerTable, Route
from ballast.gateway.sessions import HeldBudget, SessionTable
from ballast.gateway.streams import ConsumerStreams
from ballast.metadata import MetadataStore
from ballast.metadata.directory import Directory
from ballast.wire.address import MAX_RECEIVE_BYTES, split_url
from ballast.wire.h2grpc import H2GrpcServer, WireLimits
from ballast.wire.protocol import (
    CLIENT_CONSUMER,
    CLIENT_PRODUCER,
    HEALTH_CLOSE,
    HEALTH_OK,
    pb,
)
from ballast.wire.security import (
    channel_credentials,
    client_ssl_context,
    interceptors,
    server_ssl_context,
    token_authority,
)

__all__ = ["Gateway", "serve_gateway"]

log = logging.getLogger(__name__)

_CACHE_IDS = 100_000
# A carried session asks a new owner still opening its topic again after 10 ms (a move's
# opening is short), backing off to 100 ms (a failover opens many topics at once).
_LOADING_POLL = (0.01, 0.1)
_SCHEMA_SERVICE = spb.DESCRIPTOR.services_by_name["SchemaRegistry"]
_SCHEMA_METHODS = tuple(f"/{_SCHEMA_SERVICE.full_name}/{m.name}" for m in _SCHEMA_SERVICE.methods)


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
            config.connections,
        )
        self.table = OwnerTable(store, self.links.abandon, self.links.warm)
        self.directory = Directory(store, SystemClock())
        self.sessions = SessionTable(_CACHE_IDS)
        self.held = HeldBudget(self.settings.held_sends_max, self.settings.held_bytes_max)
        self.streams = ConsumerStreams(
            self.table,
            self.links,
            self.sessions,
            self.settings,
            self._route,
            self._recreate,
            self._count,
        )
        self.discovery = Discovery(
            self.table,
            self.links,
            self.directory,
            self.settings,
            self._count,
            lambda: self.advertise,
        )
        self._server: H2GrpcServer | None = None
        self._metrics: WSGIServer | None = None
        self._gc_pauses: heap.GcPauses | None = None
        self.metrics_url = ""  # host:port of the Prometheus endpoint, when served
        self._watch: asyncio.Task[None] | None = None
        self._reporter: asyncio.Task[None] | None = None
        self.reachability: ReachabilityReporter | None = None
        self.counts: dict[str, int] = {}
        self._handlers = {
            LOOKUP: grpc.unary_unary_rpc_method_handler(
                self.discovery.lookup,
                request_deserializer=pb.TopicLookupRequest.FromString,
                response_serializer=pb.TopicLookupResponse.SerializeToString,
            ),
            PARTITIONS: grpc.unary_unary_rpc_method_handler(
                self.discovery.partitions,
                request_deserializer=pb.TopicLookupRequest.FromString,
                response_serializer=pb.TopicPartitionsResponse.SerializeToString,
            ),
            CREATE_PRODUCER: grpc.unary_unary_rpc_method_handler(self._create_producer),
            SEND: grpc.unary_unary_rpc_method_handler(self._send),
            SUBSCRIBE: grpc.unary_unary_rpc_method_handler(self._subscribe),
            RECEIVE: grpc.unary_stream_rpc_method_handler(self.streams.receive),
            ACK: grpc.unary_unary_rpc_method_handler(self._ack),
            NACK: grpc.unary_unary_rpc_method_handler(self._nack),
            HEALTH: grpc.unary_unary_rpc_method_handler(self._health),
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
        if self.config.reachability.enabled:
            self.reachability = ReachabilityReporter(
                self.store,
                self.links,
                self.table,
                self.config.reachability,
                self.config.broker.registration_ttl_seconds,
                gateway_id(self.advertise),
                self.advertise,
            )
            self._reporter = asyncio.create_task(
                self.reachability.run(), name="gateway/reachability"
            )
        if self.settings.metrics_port:
            try:
                self._metrics, registry = serve_metrics(
                    self, self.bind_host, self.settings.metrics_port
                )
            except OSError as exc:
                await self.stop(0)
                raise OSError(
                    f"gateway metrics {self.bind_host}:{self.settings.metrics_port}: "
                    f"cannot listen there ({exc}); choose another gateway.metrics_port"
                ) from None
            self.metrics_url = f"{self.bind_host}:{self._metrics.server_port}"
            self._gc_pauses = heap.GcPauses(registry)
            log.info("gateway: Prometheus series on http://%s/metrics", self.metrics_url)
        return self.advertise

    async def stop(self, grace: float = 1.0) -> None:
        if self._reporter is not None:
            await cancel_and_wait(self._reporter)
            self._reporter = None
        metrics, self._metrics = self._metrics, None
        pauses, self._gc_pauses = self._gc_pauses, None
        if pauses is not None:
            pauses.close()
        if metrics is not None:
            await asyncio.to_thread(metrics.shutdown)
            metrics.server_close()
        server, self._server = self._server, None
        self.streams.release()
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
    def _gone(route: Route | None, header: str | None) -> Abort:
        name = route.url if route is not None else header or "the topic's broker"
        return Abort(
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
        """Send one unary call on; `Abort` carries the answer when it fails."""
        header, metadata = split_metadata(context)
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
                if connection_lost(exc):
                    raise self._gone(route, header) from None
                if self._still_loading(method, exc, topic, route) and loop.time() < deadline:
                    # The assigned owner is still opening the topic (after a failover it
                    # may take a while): wait here instead of spending the client's six
                    # attempts, after which a consumer gives up for good.
                    self._count("held_until_served")
                    await self.table.changed(0.2, seen)
                    continue
                raise Abort(exc.code(), exc.details() or exc.code().name) from None
            return reply, route

    def _still_loading(
        self, method: str, exc: grpc.aio.AioRpcError, topic: str | None, route: Route
    ) -> bool:
        """UNAVAILABLE to a CreateProducer/Subscribe from the broker the topic is assigned to."""
        if method not in (CREATE_PRODUCER, SUBSCRIBE) or not topic:
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
        except Abort as exc:
            self._count(f"{method.rsplit('/', 1)[-1]}:{exc.code.name}")
            await context.abort(exc.code, exc.message)
        return reply

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
        or still opening it; concurrent callers re-create once. `Abort` when it cannot.
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
                            raise Abort(exc.code(), exc.details() or exc.code().name) from None
                        answered = not connection_lost(exc)
                    else:
                        if method == CREATE_PRODUCER:
                            broker_id = pb.ProducerResponse.FromString(reply).producer_id
                        else:
                            broker_id = pb.ConsumerResponse.FromString(reply).consumer_id
                        session.url, session.broker_id = owner.url, broker_id
                        session.generation += 1
                        self._count(f"{method.rsplit('/', 1)[-1]}:carried")
                        return
                left = deadline - loop.time()
                if left <= 0:
                    raise Abort(
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
            reply, route = await self._forward(CREATE_PRODUCER, request, context, topic=topic)
        except Abort as exc:
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
            header, _ = split_metadata(context)
            topic = None if header else message.msg_id.topic_name
            return await self._unary(SEND, request, context, topic=topic)
        _, metadata = split_metadata(context)
        size = len(message.payload)
        deadline: float | None = None
        try:
            while True:
                generation = session.generation
                message.msg_id.producer_id = session.broker_id
                try:
                    return await self.links.call(
                        session.url,
                        SEND,
                        message.SerializeToString(),
                        metadata,
                        self.settings.forward_timeout_seconds,
                    )
                except grpc.aio.AioRpcError as exc:
                    if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                        raise Abort(exc.code(), exc.details() or exc.code().name) from None
                # The owner no longer takes it (sealing, moved, dead): hold it until the
                # producer exists on the new owner.
                if deadline is None:
                    if not self.held.take(size):
                        self._count("SendMessage:held_full")
                        raise Abort(
                            grpc.StatusCode.UNAVAILABLE,
                            f"topic {session.topic} is moving and the gateway holds "
                            f"{self.held.count} sends ({self.held.bytes} bytes) already; retry",
                        )
                    self._count("SendMessage:held")
                    deadline = asyncio.get_running_loop().time() + (
                        self.settings.lookup_wait_seconds
                    )
                await self._recreate(session, CREATE_PRODUCER, generation, metadata, deadline)
        except Abort as exc:
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
            reply, route = await self._forward(SUBSCRIBE, request, context, topic=parsed.topic_name)
        except Abort as exc:
            self._count(f"Subscribe:{exc.code.name}")
            await context.abort(exc.code, exc.message)
        answer = pb.ConsumerResponse.FromString(reply)
        answer.consumer_id = self.sessions.add_consumer(
            parsed.topic_name, parsed.subscription, request, route.url, answer.consumer_id
        )
        return bytes(answer.SerializeToString())

    async def _ack(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._lenient(ACK, request, context, pb.AckResponse, pb.AckRequest)

    async def _nack(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return await self._lenient(NACK, request, context, pb.NackResponse, pb.NackRequest)

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
        header, metadata = split_metadata(context)
        parsed = request_cls.FromString(request)
        topic = parsed.msg_id.topic_name
        if method == ACK:
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
                raise Abort(exc.code(), exc.details() or exc.code().name) from None
        except Abort as exc:
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
            _, metadata = split_metadata(context)
            parsed.id = session.broker_id
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.links.unary(session.url, HEALTH)(
                    parsed.SerializeToString(),
                    metadata=metadata,
                    timeout=self.settings.forward_timeout_seconds,
                )
            return bytes(pb.HealthCheckResponse(status=HEALTH_OK).SerializeToString())
        consumer = parsed.id if parsed.client == CLIENT_CONSUMER else None
        try:
            reply, _ = await self._forward(HEALTH, request, context, stream=consumer is not None)
        except Abort as exc:
            if exc.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED):
                await context.abort(exc.code, exc.message)
            self._count("health_close")
            reply = pb.HealthCheckResponse(status=HEALTH_CLOSE).SerializeToString()
        if consumer is not None and pb.HealthCheckResponse.FromString(reply).status == HEALTH_CLOSE:
            self.streams.close_sent(consumer)
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
        heap.settle()
        if on_started is not None:
            on_started(gateway.advertise)
        await stop.wait()
