"""Client sessions the gateway carries across topic owners (moves and failovers).

A producer or consumer created through the gateway gets an id of the gateway's (random,
64-bit, like a broker's) that maps to a session: the topic, the creating request and the
broker id on the current owner. When the owner stops serving the topic (it is sealing,
moved, or died), the session is re-created on the new owner and the client keeps its id:

- a send that fails there is held (bounded in count and bytes, `HeldBudget`) until the
  producer exists on the new owner, then forwarded with the new broker id;
- a consumer's stream stays open: the gateway subscribes again on the new owner (the
  subscription is idempotent by consumer name) and continues the stream from there,
  dropping what the client already acknowledged through this gateway (and acknowledging it
  again on the new owner, whose cursor may predate that acknowledgement).

What is here is state and pure decisions; the gateway does the calls.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

from ballast.wire.protocol import new_id

__all__ = ["ConsumerSession", "HeldBudget", "ProducerSession", "SessionTable"]

# Acknowledged offsets a consumer session remembers (the newest): a new owner redelivers
# from the persisted cursor, which trails the acks by at most `cursor_flush_acks` (1 000)
# plus the consumer's unacknowledged window.
ACKED_REMEMBERED = 2048


@dataclass
class ProducerSession:
    """A producer created through this gateway, wherever its topic is served now."""

    id: int  # what the client uses
    topic: str
    request: bytes  # the CreateProducer request, replayed on a new owner
    url: str  # the owner it is registered on
    broker_id: int  # its id there
    generation: int = 0  # bumped by every re-creation (concurrent failures re-create once)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class ConsumerSession:
    """A consumer subscribed through this gateway, wherever its topic is served now."""

    id: int
    topic: str
    subscription: str
    request: bytes  # the Subscribe request, replayed on a new owner
    url: str
    broker_id: int
    generation: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    receiver: int = 0  # the newest ReceiveMessages of the client (older ones end)
    acked: OrderedDict[int, None] = field(default_factory=OrderedDict)
    max_acked: int = -1  # the highest offset in `acked`

    def remember_ack(self, offset: int) -> None:
        self.acked[offset] = None
        self.max_acked = max(self.max_acked, offset)
        self.acked.move_to_end(offset)
        while len(self.acked) > ACKED_REMEMBERED:
            self.acked.popitem(last=False)

    def already_acked(self, offset: int) -> bool:
        """Whether a redelivered message was acknowledged by the client before."""
        return offset in self.acked


class HeldBudget:
    """Bounds what the gateway holds while topics move: so many sends, so many bytes."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.count = 0
        self.bytes = 0

    def take(self, size: int) -> bool:
        """Reserve room for one held send of `size` bytes; False when full."""
        if self.count + 1 > self.max_count or self.bytes + size > self.max_bytes:
            return False
        self.count += 1
        self.bytes += size
        return True

    def give_back(self, size: int) -> None:
        self.count -= 1
        self.bytes -= size


class SessionTable:
    """The sessions of one gateway, least recently used dropped beyond `limit` each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.producers: OrderedDict[int, ProducerSession] = OrderedDict()
        self.consumers: OrderedDict[int, ConsumerSession] = OrderedDict()
        self._by_subscription: dict[tuple[str, str], set[int]] = {}

    def add_producer(self, topic: str, request: bytes, url: str, broker_id: int) -> int:
        session = ProducerSession(self._fresh_id(), topic, request, url, broker_id)
        self.producers[session.id] = session
        while len(self.producers) > self.limit:
            self.producers.popitem(last=False)
        return session.id

    def add_consumer(
        self, topic: str, subscription: str, request: bytes, url: str, broker_id: int
    ) -> int:
        session = ConsumerSession(self._fresh_id(), topic, subscription, request, url, broker_id)
        self.consumers[session.id] = session
        self._by_subscription.setdefault((topic, subscription), set()).add(session.id)
        while len(self.consumers) > self.limit:
            _, old = self.consumers.popitem(last=False)
            ids = self._by_subscription[(old.topic, old.subscription)]
            ids.discard(old.id)
            if not ids:
                del self._by_subscription[(old.topic, old.subscription)]
        return session.id

    def producer(self, session_id: int) -> ProducerSession | None:
        session = self.producers.get(session_id)
        if session is not None:
            self.producers.move_to_end(session_id)
        return session

    def consumer(self, session_id: int) -> ConsumerSession | None:
        session = self.consumers.get(session_id)
        if session is not None:
            self.consumers.move_to_end(session_id)
        return session

    def subscribed(self, topic: str, subscription: str) -> list[ConsumerSession]:
        """The consumer sessions of one subscription (an Ack names no consumer)."""
        ids = self._by_subscription.get((topic, subscription), ())
        return [self.consumers[i] for i in ids]

    def _fresh_id(self) -> int:
        while True:
            candidate = new_id()
            if candidate not in self.producers and candidate not in self.consumers:
                return candidate
