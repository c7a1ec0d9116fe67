"""Topics as a broker serves them: producers, publishing, subscriptions, figures, leaving.

`ReliableServedTopic` keeps messages in the storage engine (`ballast.storage`): the WAL
assigns offsets, subscriptions read through the tiered reader from their persisted cursor
and the seal on a move hands everything to the next owner. `NonReliableServedTopic` fans
messages out in memory and keeps nothing. A stored message is the producer's
`StreamMessage` as received, so delivery gives back every field (attributes, routing key,
publish time, producer name); the topic stamps the offset, the topic name and the
subscription name.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ballast.aio import TaskOwner, cancel_and_wait
from ballast.broker.dispatch import ConsumerHandle, Delivery, SubscriptionDispatcher
from ballast.model import TopicLoad
from ballast.storage import (
    DurabilityTimeoutError,
    Handoff,
    ReliableTopic,
    ReservationError,
    SealedState,
    SealError,
    StorageStats,
    TopicFencedError,
    TopicStateError,
    WalClosedError,
    WalError,
)
from ballast.wire.auth import Binding
from ballast.wire.errors import not_served
from ballast.wire.protocol import new_id, pb

__all__ = [
    "NonReliableServedTopic",
    "ProducerEntry",
    "ReliableServedTopic",
    "ServedTopic",
    "TopicState",
]

log = logging.getLogger(__name__)

# A subscription's reader retries a storage error after this long, doubling up to the max.
READ_RETRY_INITIAL_SECONDS = 0.1
READ_RETRY_MAX_SECONDS = 5.0
# A seal that has not finished by then is given up: the topic is handed over unsealed.
SEAL_WAIT_SECONDS = 10.0


class TopicState(StrEnum):
    """A served topic's lifecycle on this broker."""

    OPEN = "open"
    CLOSING = "closing"  # leaving: producers and consumers are sent elsewhere
    CLOSED = "closed"


@dataclass(eq=False)
class ProducerEntry:
    """A producer registered on a served topic."""

    id: int
    name: str
    topic: ServedTopic
    last_seen: float
    owner: Binding | None = None  # who may use the id (see `auth.Binding`)


class ServedTopic(abc.ABC):
    """What every served topic has: producers, subscriptions, counters, a state."""

    reliable: bool = False
    # Per subscription, read ahead in bytes (set by the host from `data_plane`).
    buffer_bytes: int = 16 * 1024 * 1024

    def __init__(self, name: str, *, window: int, buffer: int, now: float) -> None:
        self.name = name
        self.window = window
        self.buffer = buffer
        self.state = TopicState.OPEN
        self.producers: dict[str, ProducerEntry] = {}
        self.subscriptions: dict[str, SubscriptionDispatcher] = {}
        self.msgs_in = 0
        self.bytes_in = 0
        self._sample = (now, 0, 0, 0, 0)  # time, msgs in, bytes in, msgs out, bytes out
        self._lock = asyncio.Lock()
        # Told (topic, why) when the topic cannot go on here: the host gives it back.
        self.on_failure: Callable[[str, str], None] | None = None

    @property
    def accepting(self) -> bool:
        """Whether producers and consumers may use the topic here."""
        return self.state is TopicState.OPEN

    def _require_open(self) -> None:
        if not self.accepting:
            raise not_served(f"topic {self.name} is moving to another broker; redo the lookup")

    # -- producers -----------------------------------------------------------------------

    def add_producer(self, name: str, now: float) -> ProducerEntry:
        """The producer named `name`: the existing one (a reconnect) or a new one."""
        self._require_open()
        entry = self.producers.get(name)
        if entry is None:
            entry = ProducerEntry(new_id(), name, self, now)
            self.producers[name] = entry
        entry.last_seen = now
        return entry

    @abc.abstractmethod
    async def publish(self, message: Any) -> int:
        """Store (or fan out) one message; returns its offset."""

    # -- consumers -----------------------------------------------------------------------

    async def subscribe(
        self,
        subscription: str,
        sub_type: str,
        consumer_name: str,
        key_filters: tuple[str, ...],
        now: float,
    ) -> ConsumerHandle:
        """Join (or rejoin) a subscription, creating it on first use."""
        self._require_open()
        async with self._lock:
            dispatcher = self.subscriptions.get(subscription)
            if dispatcher is None:
                dispatcher = await self._open_subscription(subscription, sub_type)
                self.subscriptions[subscription] = dispatcher
        self._require_open()
        return dispatcher.join(consumer_name, sub_type, key_filters, now)

    @abc.abstractmethod
    async def _open_subscription(self, name: str, sub_type: str) -> SubscriptionDispatcher:
        """Create the dispatcher of a subscription (reliable: from its persisted cursor)."""

    async def ack(self, subscription: str, offset: int) -> bool:
        """Acknowledge one message of `subscription`; False: ignored as never delivered."""
        dispatcher = self.subscriptions.get(subscription)
        return dispatcher is None or dispatcher.ack(offset)

    def nack(self, subscription: str, offset: int, delay_seconds: float) -> None:
        """Redeliver one message of `subscription` after the delay."""
        dispatcher = self.subscriptions.get(subscription)
        if dispatcher is not None:
            dispatcher.nack(offset, delay_seconds)

    async def drop_subscription(self, name: str) -> bool:
        """Remove an expired subscription and its buffers, unless a consumer came back."""
        async with self._lock:
            dispatcher = self.subscriptions.get(name)
            if dispatcher is None or dispatcher.consumers:
                return False
            del self.subscriptions[name]
            dispatcher.close()
            return True

    def consumers(self) -> list[ConsumerHandle]:
        """Every consumer of every subscription."""
        return [c for d in self.subscriptions.values() for c in d.consumers.values()]

    # -- leaving -------------------------------------------------------------------------

    async def leave(self, handoff: Handoff | None = None) -> SealedState | None:
        """Stop serving: refuse producers, start the consumers' close handshake, seal
        (`handoff`: written with the sealed state, see `ReliableTopic.seal`)."""
        self.state = TopicState.CLOSING
        for dispatcher in self.subscriptions.values():
            dispatcher.close()
            for consumer in dispatcher.consumers.values():
                consumer.closing = True
        try:
            return await self._seal(handoff)
        finally:
            self.state = TopicState.CLOSED

    async def _seal(self, handoff: Handoff | None) -> SealedState | None:
        return None

    # -- figures -------------------------------------------------------------------------

    def backlog(self) -> int:
        """Messages after the slowest subscription's position."""
        return sum(d.waiting for d in self.subscriptions.values())

    def sample(self, now: float) -> TopicLoad:
        """Rates since the previous sample, and the current counts."""
        msgs_out = sum(d.delivered for d in self.subscriptions.values())
        bytes_out = sum(d.delivered_bytes for d in self.subscriptions.values())
        then, m_in, b_in, m_out, b_out = self._sample
        self._sample = (now, self.msgs_in, self.bytes_in, msgs_out, bytes_out)
        dt = max(now - then, 1e-3)
        return TopicLoad(
            topic=self.name,
            msg_rate=(self.msgs_in - m_in + msgs_out - m_out) / dt,
            byte_rate=(self.bytes_in - b_in + bytes_out - b_out) / dt,
            producers=len(self.producers),
            consumers=sum(
                1 for d in self.subscriptions.values() for c in d.consumers.values() if c.connected
            ),
            subscriptions=len(self.subscriptions),
            backlog=max(0, self.backlog()),
        )


def _delivery(message: Any, offset: int, size: int) -> Delivery:
    key = message.routing_key if message.HasField("routing_key") else message.producer_name
    return Delivery(offset, message, key, size)


class NonReliableServedTopic(ServedTopic):
    """In-memory fan-out: each subscription gets each message once, at most; no storage."""

    reliable = False

    def __init__(self, name: str, *, window: int, buffer: int, now: float) -> None:
        super().__init__(name, window=window, buffer=buffer, now=now)
        self._next_offset = 0

    async def publish(self, message: Any) -> int:
        self._require_open()
        offset = self._next_offset
        self._next_offset += 1
        size = len(message.payload)
        self.msgs_in += 1
        self.bytes_in += size
        message.msg_id.topic_offset = offset
        message.msg_id.topic_name = self.name
        for dispatcher in self.subscriptions.values():
            copy = pb.StreamMessage()
            copy.CopyFrom(message)
            copy.subscription_name = dispatcher.name
            dispatcher.offer(_delivery(copy, offset, size))
        return offset

    async def _open_subscription(self, name: str, sub_type: str) -> SubscriptionDispatcher:
        return SubscriptionDispatcher(
            name,
            sub_type,
            window=self.window,
            reliable=False,
            buffer=self.buffer,
            buffer_bytes=self.buffer_bytes,
        )


class ReliableServedTopic(ServedTopic):
    """Messages in the storage engine; offsets are the WAL's and survive every move."""

    reliable = True

    def __init__(
        self,
        name: str,
        storage: ReliableTopic,
        *,
        window: int,
        buffer: int,
        now: float,
        tasks: TaskOwner,
        stats: StorageStats | None = None,
    ) -> None:
        super().__init__(name, window=window, buffer=buffer, now=now)
        self.storage = storage
        self.tasks = tasks  # the host's: the readers run under it
        self.stats = stats or StorageStats()
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._persisted: dict[str, int] = {}

    async def publish(self, message: Any) -> int:
        """Append; the offset is returned (acknowledged) once committed to object storage.

        Every failure that means "not here, or not now" is UNAVAILABLE, the one code on
        which the client looks the topic up again and retries: the message was not
        acknowledged, so a retry may duplicate it but never loses it.
        """
        self._require_open()
        key = message.routing_key.encode() if message.HasField("routing_key") else None
        try:
            offset = await self.storage.append(message.SerializeToString(), key=key)
        except TopicFencedError as exc:
            # Another broker owns the topic now (we stalled or lost our session).
            self.state = TopicState.CLOSING
            raise not_served(
                f"topic {self.name} has moved to another broker ({exc}); redo the lookup",
                "topic_fenced",
            ) from None
        except WalError as exc:
            if not isinstance(exc, WalClosedError):
                # The local disk failed: this broker cannot serve the topic any more.
                self.state = TopicState.CLOSING
                if self.on_failure is not None:
                    self.on_failure(self.name, f"its write-ahead log failed: {exc}")
            raise not_served(
                f"topic {self.name} stopped taking messages here ({exc}); redo the lookup",
                "topic_sealing",
            ) from None
        except (TopicStateError, ReservationError, DurabilityTimeoutError) as exc:
            raise not_served(
                f"topic {self.name} could not take the message now ({exc}); retry",
                "topic_unavailable",
            ) from None
        self.msgs_in += 1
        self.bytes_in += len(message.payload)
        return offset

    async def _open_subscription(self, name: str, sub_type: str) -> SubscriptionDispatcher:
        position = await self.storage.subscribe(name)
        start = position.start_offset
        dispatcher = SubscriptionDispatcher(
            name,
            sub_type,
            window=self.window,
            reliable=True,
            buffer=self.buffer,
            start_cursor=start - 1,
            acked_above=position.acked_above,
            buffer_bytes=self.buffer_bytes,
            previous_owner_below=self.storage.opened.next_offset,
        )
        self._persisted[name] = start - 1
        self._readers[name] = self.tasks.spawn_contained(
            self._read(dispatcher, start), f"read{self.name}/{name}"
        )
        return dispatcher

    async def _read(self, dispatcher: SubscriptionDispatcher, start: int) -> None:
        """Feed the dispatcher from storage (objects, WAL, then live), as it has room.

        A storage error (object store or metadata store unreachable, a merged object gone
        from under a stale catalog) restarts the read after the last record offered, with
        backoff; it is counted (``reader_retries``) and logged once per outage.
        """
        next_offset = start
        delay = READ_RETRY_INITIAL_SECONDS
        failing = False
        while self.accepting and not dispatcher.closed:
            try:
                async for tiered in self.storage.read(next_offset, live=True):
                    await dispatcher.wait_for_space()
                    if dispatcher.closed:
                        return
                    record = tiered.record
                    message = pb.StreamMessage.FromString(record.payload)
                    message.msg_id.topic_offset = record.offset
                    message.msg_id.topic_name = self.name
                    message.subscription_name = dispatcher.name
                    dispatcher.offer(_delivery(message, record.offset, len(message.payload)))
                    next_offset = record.offset + 1
                    if failing:
                        failing = False
                        delay = READ_RETRY_INITIAL_SECONDS
                        log.warning("topic %s: reader of %s recovered", self.name, dispatcher.name)
                    await self._persist(dispatcher)
                return  # the topic stopped (sealed or closed)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self.accepting:
                    return
                self.stats.reader_retries += 1
                if not failing:
                    failing = True
                    log.warning(
                        "topic %s: reader of %s failed at offset %d, retrying with backoff: %s",
                        self.name,
                        dispatcher.name,
                        next_offset,
                        exc,
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, READ_RETRY_MAX_SECONDS)

    async def ack(self, subscription: str, offset: int) -> bool:
        dispatcher = self.subscriptions.get(subscription)
        if dispatcher is None:
            return True
        if not dispatcher.ack(offset):
            return False
        await self._persist(dispatcher)
        if dispatcher.acked_above_cursor(offset) and self.accepting:
            # Out of order: persisted with the cursor, so the next owner skips it.
            with contextlib.suppress(TopicStateError, ValueError):
                await self.storage.ack_above(dispatcher.name, offset)
        return True

    async def _persist(self, dispatcher: SubscriptionDispatcher) -> None:
        if dispatcher.cursor > self._persisted.get(dispatcher.name, -1) and self.accepting:
            self._persisted[dispatcher.name] = dispatcher.cursor
            with contextlib.suppress(TopicStateError, ValueError):
                await self.storage.ack(dispatcher.name, dispatcher.cursor)

    def backlog(self) -> int:
        if not self.subscriptions or self.state is not TopicState.OPEN:
            return 0
        slowest = min(d.cursor for d in self.subscriptions.values())
        return max(0, self.storage.next_offset - 1 - slowest)

    async def drop_subscription(self, name: str) -> bool:
        """Also stop its reader and delete its cursor."""
        if not await super().drop_subscription(name):
            return False
        reader = self._readers.pop(name, None)
        if reader is not None:
            await cancel_and_wait(reader)
        self._persisted.pop(name, None)
        if self.accepting:
            await self.storage.unsubscribe(name)
        return True

    async def _seal(self, handoff: Handoff | None) -> SealedState | None:
        """Seal within `SEAL_WAIT_SECONDS`; otherwise hand the topic over unsealed.

        Raises `SealError` when the seal did not happen (object or metadata store down):
        the broker then makes the move ready as unsealed, and the next owner continues
        from the catalog, which holds everything acknowledged.
        """
        for task in list(self._readers.values()):
            await cancel_and_wait(task)
        self._readers.clear()
        try:
            async with asyncio.timeout(SEAL_WAIT_SECONDS):
                return await self.storage.seal(handoff)
        except TopicFencedError as exc:
            # Another broker claimed the topic (we lost our session): nothing to seal.
            log.warning("topic %s: not sealed: %s", self.name, exc)
            return None
        except TopicStateError:
            raise
        except Exception as exc:  # object storage or metadata store unreachable, timeout
            last_error: BaseException = exc
        # Everything acknowledged is committed already: the next owner continues from the
        # catalog, after this owner's reservation (which stays, so no offset is reused).
        log.error("topic %s: could not seal (%s); handing over unsealed", self.name, last_error)
        with contextlib.suppress(Exception):
            await self.storage.close(release_reservation=False)
        raise SealError(f"{self.name}: not sealed ({last_error})")
