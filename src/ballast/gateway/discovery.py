"""Discovery through the gateway: TopicLookup answered from the gateway's picture of the
store (``proxy = true``, ``connect_url`` = the gateway, ``broker_url`` = a reachable
owner), waiting while the topic has no reachable owner; TopicPartitions from the store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc

from ballast.config import GatewaySettings
from ballast.gateway.brokers import BrokerLinks
from ballast.gateway.routes import OwnerTable
from ballast.metadata import MetadataError
from ballast.metadata.directory import Directory
from ballast.model import InvalidTopicName, TopicName
from ballast.wire.protocol import CONNECT, pb

_REACH_TIMEOUT = 0.25  # a probe of a dead owner must not hold up noticing its heir


class Discovery:
    """The Discovery service of one gateway."""

    def __init__(
        self,
        table: OwnerTable,
        links: BrokerLinks,
        directory: Directory,
        settings: GatewaySettings,
        count: Callable[[str], None],
        advertise: Callable[[], str],
    ) -> None:
        self.table = table
        self.links = links
        self.directory = directory
        self.settings = settings
        self._count = count
        self._advertise = advertise  # the gateway's address, as it answers lookups now

    async def lookup(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
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
                        connect_url=self._advertise(),
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

    async def partitions(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            topic = TopicName.parse(request.topic)
        except InvalidTopicName as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"topic: {exc}")
        try:
            names = await self.directory.partitions(topic)
        except MetadataError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"metadata store unavailable: {exc}")
        return pb.TopicPartitionsResponse(request_id=request.request_id, partitions=names)
