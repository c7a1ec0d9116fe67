"""Consumer streams through the gateway: a session's stream continued from each new owner
of its topic, and a passed-through stream held open for its close handshake when its
broker is gone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from ballast.aio import cancel_and_wait
from ballast.config import GatewaySettings
from ballast.gateway.brokers import BrokerLinks
from ballast.gateway.calls import (
    ACK,
    RECEIVE,
    REFUSALS,
    SUBSCRIBE,
    Abort,
    connection_lost,
    split_metadata,
)
from ballast.gateway.routes import OwnerTable, Route
from ballast.gateway.sessions import ConsumerSession, SessionTable
from ballast.wire.protocol import CARRIED_HEADER, pb

_CLOSE_DELAY = 0.2  # end a held stream this long after its CLOSE went out


class ConsumerStreams:
    """The ReceiveMessages streams of one gateway."""

    def __init__(
        self,
        table: OwnerTable,
        links: BrokerLinks,
        sessions: SessionTable,
        settings: GatewaySettings,
        route: Callable[..., Route | None],
        recreate: Callable[..., Awaitable[None]],
        count: Callable[[str], None],
    ) -> None:
        self.table = table
        self.links = links
        self.sessions = sessions
        self.settings = settings
        self._route = route
        self._recreate = recreate  # re-creates a session's consumer on its topic's owner
        self._count = count
        self._reacks: set[asyncio.Task[None]] = set()
        self._held: dict[int, set[asyncio.Event]] = {}  # consumer id -> its held streams

    def release(self) -> None:
        """End every held stream (the gateway is stopping)."""
        for events in self._held.values():
            for event in events:
                event.set()

    async def receive(
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
        _, metadata = split_metadata(context)
        session.receiver += 1
        mine = session.receiver
        replaying = False  # just re-subscribed: drop what the client acknowledged already
        while session.receiver == mine:
            generation, url = session.generation, session.url
            receive = pb.ReceiveRequest(request_id=request_id, consumer_id=session.broker_id)
            call = self.links.channel(url).unary_stream(RECEIVE)(
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
            if failure and failure[0].code() in REFUSALS:
                # The broker refused the client itself: re-subscribing cannot help.
                await context.abort(failure[0].code(), failure[0].details() or "")
            self._count("ReceiveMessages:carried")
            deadline = asyncio.get_running_loop().time() + self.settings.lookup_wait_seconds
            try:
                await self._recreate(session, SUBSCRIBE, generation, metadata, deadline)
            except Abort as exc:
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
                url, ACK, request, metadata, self.settings.forward_timeout_seconds
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
        header, metadata = split_metadata(context)
        route = self._route(header, None, stream=True)
        closed = asyncio.Event()
        self._held.setdefault(consumer, set()).add(closed)
        call = None
        try:
            if route is not None:
                call = self.links.channel(route.url).unary_stream(RECEIVE)(
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
                    if not connection_lost(exc) and exc.code() is not grpc.StatusCode.NOT_FOUND:
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

    def close_sent(self, consumer: int) -> None:
        """End the consumer's held streams just after its CLOSE went out."""

        def end() -> None:
            for event in self._held.get(consumer, ()):
                event.set()

        asyncio.get_running_loop().call_later(_CLOSE_DELAY, end)


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
