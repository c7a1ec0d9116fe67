"""`DataPlaneServer`: the gRPC server on a broker's `broker_url`.

``async with DataPlaneServer(host, config, "127.0.0.1:0") as server:`` binds (port 0
picks a free port), serves the four services of the client protocol and exposes the
address clients must use (`server.url`, the broker's real `broker_url`). On exit it stops
accepting calls and gives open streams a short grace period.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging

import grpc

from ballast.aio import Served
from ballast.config import BallastConfig
from ballast.server.host import DataPlaneHost
from ballast.server.limits import DecodeInterceptor
from ballast.server.link import LinkService
from ballast.server.protocol import pb_grpc
from ballast.server.schemas import SchemaRegistryService, spb_grpc
from ballast.server.security import (
    interceptors,
    server_credentials,
    server_ssl_context,
    token_authority,
)
from ballast.server.service import DataPlaneService

__all__ = ["DataPlaneServer", "split_url"]

log = logging.getLogger(__name__)

# What the gateway accepts and forwards (a broker refuses above its
# `data_plane.max_request_bytes`).
MAX_RECEIVE_BYTES = 64 * 1024 * 1024


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def split_url(url: str) -> tuple[str, int]:
    """(host, port) of ``host:port`` or ``http://host:port``; ValueError names the problem."""
    rest = url.split("://", 1)[1] if "://" in url else url
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"broker_url {url!r}: expected host:port (port 0 picks a free one)")
    return host, int(port)


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
        self._server: grpc.aio.Server | None = None
        self._link_server: asyncio.Server | None = None
        self.link: LinkService | None = None  # gateways' sends and acks (once started)

    async def start(self) -> str:
        """Bind and start serving; returns the advertised ``host:port``."""
        counters = self.host.counters

        def refused(rpc: str, reason: str) -> None:
            counters.reject(rpc.rsplit("/", 1)[-1], reason)

        limits = self.config.data_plane
        authority = token_authority(self.config)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limits.max_request_bytes),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=limits.max_concurrent_rpcs,
            # Malformed protobuf refused first, then JWT tokens (`auth` section), checked
            # before any handler runs.
            interceptors=[DecodeInterceptor(refused), *interceptors(authority, refused)],
        )
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
            raise OSError(
                f"broker_url {address}: cannot listen there (in use?); "
                "choose another port (--broker-url, port 0 picks a free one)"
            )
        self.port = port
        self.url = f"{self.bind_host}:{port}"
        service = DataPlaneService(self.host, self.config, self.url)
        pb_grpc.add_DiscoveryServicer_to_server(service, server)
        pb_grpc.add_ProducerServiceServicer_to_server(service, server)
        pb_grpc.add_ConsumerServiceServicer_to_server(service, server)
        pb_grpc.add_HealthCheckServicer_to_server(service, server)
        registry = SchemaRegistryService(service.schemas.schemas, service.schemas, counters.reject)
        spb_grpc.add_SchemaRegistryServicer_to_server(registry, server)
        # Gateways' sends and acks, batched (each still the SendMessage/Ack above, token
        # checked).
        link = LinkService(
            authority,
            refused,
            send=service.SendMessage,
            ack=service.Ack,
            max_frame_bytes=limits.max_request_bytes,
        )
        server.add_generic_rpc_handlers((link,))
        self.link = link
        if limits.link_port is not None:
            self._link_server = await self._listen_link(link, limits.link_port)
        await server.start()
        self._server = server
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
