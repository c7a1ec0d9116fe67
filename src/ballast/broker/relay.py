"""Make-before-break for consumers: the old owner relays a moving topic's new owner.

The 0.5.0 client leaves a broker only when a health check answers CLOSE, and it checks
every 5 s: a consumer would wait up to 5 s after every move. Instead, while the close
handshake runs, the old owner subscribes to the new owner *as that consumer* (same
subscription, same consumer name) and feeds what it receives into the consumer's still
open stream; the client's acks and nacks, which still arrive at the old owner, are passed
on. When the client finally re-subscribes on the new owner under the same name, it takes
the stream over there (the relay's stream ends, and whatever the relay had in flight is
redelivered to the client): at-least-once, with a pause of about one seal and one
placement instead of one health-check period.

Once the client is told CLOSE it drops whatever reaches it, so the relay then ends its
stream (marked as a relay's: the new owner keeps what the client received for the client
to ack) and gives back (nacks) what the client never got, to be delivered first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc

from ballast.aio import TaskOwner
from ballast.broker.dispatch import ConsumerHandle, Delivery
from ballast.metadata.directory import Directory
from ballast.model import TopicName
from ballast.wire.cluster_calls import ClusterDialer
from ballast.wire.protocol import RELAY_HEADER, SUBSCRIPTION_TYPES, pb, pb_grpc

__all__ = ["ConsumerRelay"]

log = logging.getLogger(__name__)

_WIRE_TYPE = {name: number for number, name in SUBSCRIPTION_TYPES.items()}
RPC_TIMEOUT = 2.0
# Messages the client never got are nacked back this long after the relay's stream ended.
GIVE_BACK_AFTER = 0.05
# A relayed message sent this shortly before CLOSE may have been dropped by the client.
IN_HAND_SECONDS = 0.05


class ConsumerRelay:
    """Relays one departing consumer from the topic's new owner until it moves itself."""

    def __init__(
        self,
        handle: ConsumerHandle,
        topic: str,
        directory: Directory,
        broker_id: str,
        deadline_seconds: float,
        dialer: ClusterDialer,
    ) -> None:
        self.handle = handle
        self.dialer = dialer
        self.topic = topic
        self.subscription = handle.dispatcher.name
        self.directory = directory
        self.broker_id = broker_id
        self.deadline_seconds = deadline_seconds
        self.stub: Any = None
        self.relayed = 0
        self.task: asyncio.Task[None] | None = None
        self._call: Any = None
        self._streaming = True
        self._stopped = asyncio.Event()
        self._tasks: TaskOwner | None = None
        self._acked: set[int] = set()

    def start(self, tasks: TaskOwner) -> None:
        """Run under `tasks` (the host's; ends by itself, `stop` cancels it)."""
        self._tasks = tasks
        self.task = tasks.spawn_contained(
            self._run(), f"relay{self.topic}/{self.subscription}/{self.handle.name}"
        )

    def stop(self) -> None:
        """End the relay and its connection (the handshake is over)."""
        self._stopped.set()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def end_stream(self, unsent: list[Delivery], now: float) -> asyncio.Task[Any] | None:
        """Stop feeding the client (it is told CLOSE); acks still pass on until `stop`.
        Returns the give-back under way, if any: CLOSE waits for it (see `give_back`).

        The relay's stream ends; the new owner keeps what the client received for it to
        ack (the stream is marked as a relay's), and takes back at once, in order, what
        the client never got (`unsent`), so it is delivered first when the client
        re-attaches there.
        """
        self._streaming = False
        if self._call is not None:
            self._call.cancel()
        # The client drops a message that reaches it after CLOSE: what was sent just
        # before and is not acked may be lost with it. Given back, it comes first again
        # (if the client did get it, its ack reaches the new owner before it re-attaches).
        suspect = [
            d
            for sent_at, d in self.handle.recent
            if now - sent_at <= IN_HAND_SECONDS and d.offset not in self._acked
        ]
        return self.give_back([d.message for d in [*suspect, *unsent] if d.relayed])

    def give_back(self, messages: list[Any]) -> asyncio.Task[Any] | None:
        """Nack relayed messages the client never received (in the background); the task.

        The client is told CLOSE only once they are back at the new owner: re-attached
        there before, it would get the next messages first and these after them."""
        if not messages or self.stub is None:
            return None
        stub = self.stub
        metadata = self.dialer.metadata()
        requests = [
            pb.NackRequest(msg_id=m.msg_id, subscription_name=self.subscription, delay_ms=0)
            for m in messages
        ]

        async def nack_all() -> None:
            await asyncio.sleep(GIVE_BACK_AFTER)  # after the stream's end reached the owner
            for request in requests:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.Nack(request, timeout=RPC_TIMEOUT, metadata=metadata)

        if self._tasks is None or not self._tasks.running:
            return None  # the server is stopping: the new owner redelivers them anyway
        return self._tasks.spawn_contained(nack_all(), f"relay{self.topic}/give-back")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.deadline_seconds
        name = TopicName.parse(self.topic)
        owner = None
        while self._streaming and self.handle.connected and loop.time() < deadline:
            owner = await self.directory.owner(name)
            if owner is not None and owner.broker_id != self.broker_id:
                break
            owner = None
            await asyncio.sleep(0.05)
        if owner is None:
            return
        handle = self.handle
        request = pb.ConsumerRequest(
            topic_name=self.topic,
            consumer_name=handle.name,
            subscription=self.subscription,
            subscription_type=_WIRE_TYPE[handle.dispatcher.sub_type],
            key_filters=list(handle.key_filters),
        )
        async with self.dialer.channel(owner.broker_url) as channel:
            stub = pb_grpc.ConsumerServiceStub(channel)
            while True:
                try:
                    reply = await stub.Subscribe(
                        request, timeout=RPC_TIMEOUT, metadata=self.dialer.metadata()
                    )
                    break
                except grpc.aio.AioRpcError as exc:
                    retry = exc.code() in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    )
                    if not retry or not self._streaming or loop.time() > deadline:
                        log.debug("relay %s: subscribe failed: %s", self.topic, exc.details())
                        return
                    await asyncio.sleep(0.05)
            if not self._streaming:
                return
            self.stub = stub
            self._call = stub.ReceiveMessages(
                pb.ReceiveRequest(consumer_id=reply.consumer_id),
                metadata=((RELAY_HEADER, "1"), *self.dialer.metadata()),
            )
            try:
                async for message in self._call:
                    queue = handle.queue
                    if queue is None or not self._streaming:
                        self.give_back([message])
                        break
                    offset = message.msg_id.topic_offset
                    queue.put_nowait(
                        Delivery(offset, message, "", len(message.payload), relayed=True)
                    )
                    self.relayed += 1
            except grpc.aio.AioRpcError as exc:
                log.debug("relay %s: stream ended: %s", self.topic, exc.details())
            except asyncio.CancelledError:
                if self._stopped.is_set():
                    raise
            finally:
                self._call.cancel()
            # Keep the connection for the acks of what the client received.
            await self._stopped.wait()

    async def ack(self, request: Any) -> None:
        """Pass an ack on to the new owner (best effort: a lost ack means a redelivery)."""
        self._acked.add(request.msg_id.topic_offset)
        stub = self.stub
        if stub is not None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.Ack(request, timeout=RPC_TIMEOUT, metadata=self.dialer.metadata())

    async def nack(self, request: Any) -> None:
        """Pass a nack on to the new owner (best effort)."""
        stub = self.stub
        if stub is not None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.Nack(request, timeout=RPC_TIMEOUT, metadata=self.dialer.metadata())
