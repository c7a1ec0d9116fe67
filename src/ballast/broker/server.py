"""`DataPlaneServer`: the gRPC server on a broker's `broker_url`.

``async with DataPlaneServer(host, config, "127.0.0.1:0") as server:`` binds (port 0
picks a free port), serves the four services of the client protocol and exposes the
address clients must use (`server.url`, the broker's real `broker_url`). On exit it stops
accepting calls and gives open streams a short grace period.

The port is served by the wire layer every client port shares (`ballast.wire.h2grpc`, on
libnghttp2, with the protections of the config's `wire` section), not by `grpc.aio`: its
server spent 80-90 % of a broker's CPU per non-reliable message (issue 37). The servicers
are registered through the generated ``add_*Servicer_to_server`` functions as before
(`_Registry` collects what they register), and the interceptors wrap each method's handler
once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import grpc

from ballast.aio import Served
from ballast.broker.host import DataPlaneHost
from ballast.broker.service import DataPlaneService
from ballast.config import BallastConfig
from ballast.registry.service import SchemaRegistryService, spb_grpc
from ballast.wire.address import is_loopback, split_url
from ballast.wire.h2grpc import H2GrpcServer, WireLimits
from ballast.wire.limits import DecodeInterceptor
from ballast.wire.link import LinkService
from ballast.wire.metrics import WireCollector
from ballast.wire.protocol import pb_grpc
from ballast.wire.security import interceptors, server_ssl_context, token_authority

__all__ = ["DataPlaneServer"]

log = logging.getLogger(__name__)


class _Registry:
    """Takes what the generated ``add_*Servicer_to_server`` functions give a server: the
    handlers by full method name (and generic handlers, asked for any other name)."""

    def __init__(self) -> None:
        self.methods: dict[str, Any] = {}
        self.generic: list[grpc.GenericRpcHandler] = []

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        for name, handler in handlers.items():
            self.methods[f"/{service}/{name}"] = handler

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.generic.extend(handlers)

    def lookup(self) -> dict[str, Any]:
        """Every method served: the registered ones and those of generic handlers that
        name their methods (`LinkService`)."""
        found = dict(self.methods)
        for generic in self.generic:
            for method in getattr(generic, "methods", lambda: ())():
                found.setdefault(method, generic.service(_Details(method)))
        return found


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


class DataPlaneServer(Served):
    """Serves Discovery, ProducerService, ConsumerService, HealthCheck and SchemaRegistry."""

    def __init__(
        self, host: DataPlaneHost, config: BallastConfig, bind: str, *, grace: float = 1.0
    ) -> None:
        self.host = host
        self.config = config
        self.bind_host, self.bind_port = split_url(bind)
        self.grace = grace
        self.url = ""
        self.port = 0
        self._server: H2GrpcServer | None = None
        self._collector: WireCollector | None = None
        self._link_server: asyncio.Server | None = None
        self.link: LinkService | None = None  # gateways' sends and acks (once started)

    async def start(self) -> str:
        """Bind and start serving; returns the advertised ``host:port``."""
        counters = self.host.counters

        def refused(rpc: str, reason: str) -> None:
            counters.reject(rpc.rsplit("/", 1)[-1], reason)

        limits = self.config.data_plane
        authority = token_authority(self.config)
        handlers: dict[str, Any] = {}
        server = H2GrpcServer(
            handlers.get,
            max_receive=limits.max_request_bytes,
            ssl_context=server_ssl_context(self.config.tls),
            limits=WireLimits.of(self.config.wire),
            max_calls=limits.max_concurrent_rpcs,
        )
        address = f"{self.bind_host}:{self.bind_port}"
        try:
            port = await server.start(self.bind_host.strip("[]"), self.bind_port)
        except OSError as exc:
            raise OSError(
                f"broker_url {address}: cannot listen there ({exc.strerror or exc}); "
                "choose another port (--broker-url, port 0 picks a free one)"
            ) from None
        self._server = server
        if self._collector is None:
            self._collector = WireCollector(lambda: self._server)
            try:
                counters.registry.register(self._collector)
            except ValueError:  # another server of this host's registry exports them
                log.debug("%s: wire series already on this registry", self.host.broker_id)
        self.port = port
        self.url = f"{self.bind_host}:{port}"
        registry = _Registry()
        service = DataPlaneService(self.host, self.config, self.url)
        pb_grpc.add_DiscoveryServicer_to_server(service, registry)
        pb_grpc.add_ProducerServiceServicer_to_server(service, registry)
        pb_grpc.add_ConsumerServiceServicer_to_server(service, registry)
        pb_grpc.add_HealthCheckServicer_to_server(service, registry)
        schemas = SchemaRegistryService(service.schemas.schemas, service.schemas, counters.reject)
        spb_grpc.add_SchemaRegistryServicer_to_server(schemas, registry)
        # Gateways' sends and acks, batched (each still the SendMessage/Ack above, token
        # checked).
        link = LinkService(
            authority,
            refused,
            send=service.SendMessage,
            ack=service.Ack,
            max_frame_bytes=limits.max_request_bytes,
        )
        registry.add_generic_rpc_handlers((link,))
        self.link = link
        # JWT tokens (`auth` section) checked before any handler runs, and malformed
        # protobuf refused before that (the outermost wrapper), counted as refusals.
        served = registry.lookup()
        for interceptor in [*interceptors(authority, refused), DecodeInterceptor(refused)]:
            served = {method: interceptor.wrap(method, h) for method, h in served.items()}
        handlers.update(served)  # the server's lookup serves them from here on
        if limits.link_port is not None:
            try:
                self._link_server = await self._listen_link(link, limits.link_port)
            except OSError:
                self._server = None  # the client port listens already: closed with it
                await server.stop(0)
                raise
        await self.host.start()
        log.info(
            "%s: data plane serving on %s (gateways' link port: %s)",
            self.host.broker_id,
            self.url,
            self.link_port or "none",
        )
        if self.config.auth.mode == "none" and not is_loopback(self.bind_host):
            log.warning(
                "%s: data plane on %s accepts every request WITHOUT AUTHENTICATION "
                "(auth.mode: none) on a non-loopback address; set auth.mode: jwt and tls",
                self.host.broker_id,
                self.url,
            )
        return self.url

    async def _listen_link(self, link: LinkService, port: int) -> asyncio.Server:
        try:
            listener = await asyncio.start_server(
                link.serve_connection,
                self.bind_host.strip("[]"),
                port,
                ssl=server_ssl_context(self.config.tls),
            )
        except OSError as exc:
            raise OSError(
                f"data_plane.link_port {port}: cannot listen on {self.bind_host} "
                f"({exc.strerror}); choose another port (0 picks a free one, null: none)"
            ) from None
        link.tcp_port = listener.sockets[0].getsockname()[1]
        return listener

    @property
    def wire(self) -> H2GrpcServer | None:
        """The client port's server (its protections' counts), while serving."""
        return self._server

    @property
    def link_port(self) -> int:
        """The TCP port of gateways' links (0: none)."""
        return self.link.tcp_port if self.link is not None else 0

    async def stop(self) -> None:
        """Stop serving (open streams get `grace` seconds)."""
        listener, self._link_server = self._link_server, None
        if listener is not None:
            listener.close()
        await self.host.stop()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(self.grace)
        if listener is not None and self.link is not None:
            await self.link.close_connections()

    async def stop_now(self) -> None:
        """Drop every connection at once, as a crashed process would (the demo's kill)."""
        self.grace = 0.0
        await self.stop()
