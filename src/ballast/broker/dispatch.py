"""Subscriptions: which consumer gets which message, unacked windows, acks and redelivery.

A `SubscriptionDispatcher` owns the consumers of one subscription on one served topic.
Messages come in (`offer`) in offset order; each is given to one consumer chosen by the
subscription type:

- ``exclusive``: the single consumer;
- ``failover``: the earliest-connected consumer that is still connected (the next one
  takes over, with everything the previous one left unacked, when it goes);
- ``shared``: round-robin over the connected consumers that have window space;
- ``key_shared``: by routing key (falling back to the producer name), among the
  consumers whose glob `key_filters` match the key (no filter: every key): the one of
  highest rendezvous weight, so a joining consumer takes over about 1/n of the keys and
  the others keep theirs. Per-key order holds across consumers joining and leaving
  (reliable): a key whose messages another consumer still holds unacked waits (only
  that key) until they are acked, and what a departing consumer leaves unacked goes
  back ahead of everything newer, so each key's older messages are delivered first.

Each consumer holds at most `window` delivered-but-unacked messages, which bounds memory
and, for reliable topics, how far the storage reader runs ahead. A message a consumer
leaves unacked when its stream ends goes back to the head of the queue for the others;
a nack sends it back after its delay.

For reliable subscriptions acks arrive in any order (shared, key_shared); the dispatcher
keeps the lowest offset not yet acked and reports the cursor, "everything up to here is
acked", as `cursor`, and the offsets acked above it; the served topic persists both
through the storage engine, and a new owner (a move, a failover) starts from them, so
it delivers again only what was not acked.
"""

from __future__ import annotations

import asyncio
import fnmatch
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

from ballast.storage.cursor import AckRanges
from ballast.wire.auth import Binding
from ballast.wire.errors import RpcFailure
from ballast.wire.protocol import new_id

__all__ = [
    "ConsumerHandle",
    "Delivery",
    "SubscriptionDispatcher",
    "drain",
    "fnv1a64",
]

log = logging.getLogger(__name__)

# After a takeover, messages the previous stream sent stay the consumer's this long (it
# most likely has them and acks them) before they are redelivered.
REDELIVERY_GRACE = 5.0
# After a subscription opens here (a move), acks of what the previous owner delivered are
# taken this long; later, an ack for an offset never delivered here is ignored. Only
# offsets below where this owner began can have been delivered by a previous one.
MOVED_ACKS_SECONDS = 10.0

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64-bit: the hash the client uses to pick a partition by key."""
    h = _FNV_OFFSET
    for byte in data:
        h ^= byte
        h = (h * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def rendezvous_score(key_hash: int, consumer_hash: int) -> int:
    """A key's weight for one consumer (splitmix64 of the two hashes): the key goes to the
    consumer of highest weight, so a consumer joining or leaving moves only its keys."""
    x = (key_hash ^ consumer_hash) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


@dataclass(slots=True)
class Delivery:
    """One message on its way to a consumer: the wire message, its offset and its key."""

    offset: int
    message: Any  # pb.StreamMessage, stamped with the topic name, offset and subscription
    key: str
    size: int
    relayed: bool = False  # received from the topic's new owner (see `relay`)


_join_seq = itertools.count()


@dataclass(eq=False)
class ConsumerHandle:
    """One named consumer of a subscription, and its current stream (if connected)."""

    id: int
    name: str
    dispatcher: SubscriptionDispatcher
    key_filters: tuple[str, ...] = ()
    joined: int = field(default_factory=lambda: next(_join_seq))
    unacked: dict[int, Delivery] = field(default_factory=dict)  # change by `hold`/`release`
    unacked_keys: dict[str, int] = field(default_factory=dict)  # key -> unacked messages
    queue: asyncio.Queue[Delivery | None] | None = None  # the open stream's queue
    closing: bool = False  # the topic is leaving: CLOSE on the next health check
    close_sent: bool = False  # CLOSE was answered: send nothing more, the stream ends soon
    carried: bool = False  # the open stream is a gateway's, which follows moves itself
    # Relayed messages sent most recently, with when (the client may drop one at CLOSE).
    recent: deque[tuple[float, Delivery]] = field(default_factory=lambda: deque(maxlen=256))
    last_seen: float = 0.0
    owner: Binding | None = None  # who may use the id (see `auth.Binding`)
    name_hash: int = field(init=False)  # KeyShared: the name's part of rendezvous weights

    def __post_init__(self) -> None:
        self.name_hash = fnv1a64(self.name.encode())

    @property
    def connected(self) -> bool:
        """True while a ReceiveMessages stream is open for this consumer."""
        return self.queue is not None

    def matches(self, key: str) -> bool:
        """Whether this consumer's key filters accept `key` (no filter: everything)."""
        return not self.key_filters or any(fnmatch.fnmatchcase(key, p) for p in self.key_filters)

    def hold(self, d: Delivery) -> None:
        """`d` was given to this consumer and waits for its ack."""
        self.unacked[d.offset] = d
        self.unacked_keys[d.key] = self.unacked_keys.get(d.key, 0) + 1

    def release(self, offset: int) -> Delivery | None:
        """`offset` is no longer this consumer's (acked, nacked, given back)."""
        d = self.unacked.pop(offset, None)
        if d is not None:
            left = self.unacked_keys[d.key] - 1
            if left:
                self.unacked_keys[d.key] = left
            else:
                del self.unacked_keys[d.key]
        return d

    def release_all(self) -> list[Delivery]:
        """Everything this consumer holds unacked, given back."""
        held = list(self.unacked.values())
        self.unacked.clear()
        self.unacked_keys.clear()
        return held

    def attach(self) -> asyncio.Queue[Delivery | None]:
        """Open a new stream; a previous one of this consumer ends (takeover).

        What the previous stream had not sent yet goes back to the queue at once. What it
        had sent is most likely in the client's hands (it reconnects with the same name
        after a move, and acks what it received): it stays this consumer's for
        `REDELIVERY_GRACE` seconds, and only what is still unacked then is redelivered.
        """
        old = self.queue
        self.queue = asyncio.Queue()
        if old is not None:
            unsent = drain(old)
            for d in unsent:
                self.release(d.offset)
            self.dispatcher.requeue(unsent)
            old.put_nowait(None)
        in_flight = list(self.unacked.values())
        if in_flight:
            self.dispatcher.schedule(REDELIVERY_GRACE, lambda: self._expire(in_flight))
        self.dispatcher.pump()
        return self.queue

    def _expire(self, deliveries: list[Delivery]) -> None:
        expired = [d for d in deliveries if self.unacked.get(d.offset) is d]
        for d in expired:
            self.release(d.offset)
        if expired:
            self.dispatcher.requeue(expired)
            self.dispatcher.pump()

    def detach(self, queue: asyncio.Queue[Delivery | None], *, keep_sent: bool = False) -> None:
        """The stream on `queue` ended; its unacked messages go to the other consumers.

        With `keep_sent` (a relay's stream: the real client is about to attach here and
        ack what it received), what was sent stays this consumer's for the grace period.
        """
        if self.queue is not queue:
            return  # taken over already
        self.queue = None
        unsent = drain(queue)
        for d in unsent:
            self.release(d.offset)
        if keep_sent:
            self.dispatcher.requeue(unsent)
            in_flight = list(self.unacked.values())
            if in_flight:
                self.dispatcher.schedule(REDELIVERY_GRACE, lambda: self._expire(in_flight))
        else:
            self.dispatcher.requeue([*unsent, *self.release_all()])
        self.dispatcher.pump()

    def end_stream(self) -> None:
        """End the open stream (after the close handshake)."""
        queue, self.queue = self.queue, None
        if queue is not None:
            queue.put_nowait(None)


def drain(queue: asyncio.Queue[Delivery | None]) -> list[Delivery]:
    """Take everything waiting in a stream's queue (the end-of-stream marker is dropped)."""
    items = []
    while not queue.empty():
        item = queue.get_nowait()
        if item is not None:
            items.append(item)
    return items


class SubscriptionDispatcher:
    """The consumers of one subscription and the messages waiting for them."""

    def __init__(
        self,
        name: str,
        sub_type: str,
        *,
        window: int,
        reliable: bool,
        buffer: int,
        start_cursor: int = -1,
        acked_above: tuple[tuple[int, int], ...] = (),
        buffer_bytes: int = 16 * 1024 * 1024,
        previous_owner_below: int = 0,
    ) -> None:
        self.name = name
        self.sub_type = sub_type
        self.window = window
        self.reliable = reliable
        self.buffer = buffer
        self.buffer_bytes = buffer_bytes  # read ahead, waiting for a consumer, in bytes
        self._fresh_bytes = 0
        self.consumers: dict[str, ConsumerHandle] = {}
        self._fresh: deque[Delivery] = deque()
        self._redeliver: deque[Delivery] = deque()
        self._owner: dict[int, ConsumerHandle] = {}
        self._rr = 0
        self._space = asyncio.Event()
        self._space.set()
        self._timers: set[asyncio.TimerHandle] = set()
        self.closed = False
        self.dropped = 0  # non-reliable messages dropped because the queue was full
        self.delivered = 0
        self.delivered_bytes = 0
        # Reliable: the cursor is the highest offset below which everything is acked.
        self.cursor = start_cursor
        self._read_through = start_cursor  # highest offset offered so far
        self._pending: list[int] = []  # heap of offered offsets not yet acked
        self._acked: set[int] = set()  # acked offsets still in the heap (or not yet offered)
        # Acked above the cursor before this owner opened the subscription (persisted by
        # the previous owner): skipped when read, forgotten as the cursor passes them.
        self._acked_before = AckRanges(acked_above) if acked_above else None
        self._holds: dict[int, float] = {}  # offset -> seconds to hold it when offered
        self._delivered: set[int] = set()  # offsets given to a consumer, not yet acked
        # A previous owner delivered at most the offsets below this one.
        self._previous_owner_below = previous_owner_below
        self._foreign_acks_until = time.monotonic() + MOVED_ACKS_SECONDS

    # -- consumers -----------------------------------------------------------------------

    def join(
        self, consumer_name: str, sub_type: str, key_filters: Iterable[str], now: float
    ) -> ConsumerHandle:
        """The consumer named `consumer_name`: the existing one (reconnect) or a new one."""
        existing = self.consumers.get(consumer_name)
        if existing is not None:
            existing.key_filters = tuple(key_filters)
            existing.last_seen = now
            return existing
        if sub_type != self.sub_type:
            if self.consumers:
                raise RpcFailure(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"subscription {self.name!r} is {self.sub_type}; a {sub_type} consumer "
                    "cannot join it (use another subscription name)",
                    "subscription_type_mismatch",
                )
            self.sub_type = sub_type
        if self.sub_type == "exclusive":
            for other in list(self.consumers.values()):
                if other.connected:
                    raise RpcFailure(
                        grpc.StatusCode.PERMISSION_DENIED,
                        f"subscription {self.name!r} is exclusive and consumer {other.name!r} "
                        "is connected to it",
                        "exclusive_taken",
                    )
                self.remove(other)
        handle = ConsumerHandle(new_id(), consumer_name, self, tuple(key_filters), last_seen=now)
        self.consumers[consumer_name] = handle
        return handle

    def remove(self, handle: ConsumerHandle) -> None:
        """Forget a consumer; its unacked messages go to the others."""
        if self.consumers.get(handle.name) is handle:
            del self.consumers[handle.name]
        unsent = drain(handle.queue) if handle.queue is not None else []
        handle.end_stream()
        # Reliable: what its queue held is among its unacked messages too.
        self.requeue(handle.release_all() if self.reliable else unsent)
        self.pump()

    def _candidates(self) -> list[ConsumerHandle]:
        return sorted(
            (c for c in self.consumers.values() if c.connected and not c.closing),
            key=lambda c: c.joined,
        )

    def _has_space(self, c: ConsumerHandle) -> bool:
        if self.reliable:
            return len(c.unacked) < self.window
        assert c.queue is not None
        return c.queue.qsize() < self.window

    def _choose(self, d: Delivery, candidates: list[ConsumerHandle]) -> ConsumerHandle | None:
        if not candidates:
            return None
        if self.sub_type in ("exclusive", "failover"):
            active = candidates[0]
            return active if self._has_space(active) else None
        if self.sub_type == "key_shared":
            chosen = self._key_consumer(d.key, candidates)
            return chosen if chosen is not None and self._has_space(chosen) else None
        n = len(candidates)
        for i in range(n):
            c = candidates[(self._rr + i) % n]
            if self._has_space(c):
                self._rr = (self._rr + i + 1) % n
                return c
        return None

    def _key_consumer(self, key: str, candidates: list[ConsumerHandle]) -> ConsumerHandle | None:
        """KeyShared: who takes `key` now, space aside (None: the key waits).

        The key belongs to the matching consumer of highest rendezvous weight. While
        another consumer still holds unacked messages of the key (it had the key before
        this one joined, or it is away within its redelivery grace), the key waits for
        those acks ("draining", as Pulsar's PIP-379): two consumers never work on one key
        at once, and a joining consumer still gets its share of busy keys.
        """
        key_hash = fnv1a64(key.encode())
        owner: ConsumerHandle | None = None
        best = -1
        for c in candidates:
            if c.matches(key):
                score = rendezvous_score(key_hash, c.name_hash)
                if score > best:
                    owner, best = c, score
        for c in self.consumers.values():
            if c is not owner and key in c.unacked_keys:  # it holds the key unacked
                return None
        return owner

    # -- messages ------------------------------------------------------------------------

    def offer(self, d: Delivery) -> None:
        """A new message, in offset order."""
        if self.closed:
            return
        if self.reliable:
            self._read_through = max(self._read_through, d.offset)
            if d.offset in self._acked or (
                self._acked_before is not None and d.offset in self._acked_before
            ):
                self._acked.discard(d.offset)  # acked before we read it (after a move)
                self._advance()
                return
            heapq.heappush(self._pending, d.offset)
            if self._holds and d.offset in self._holds:
                self._later(self._holds.pop(d.offset), d)
                return
        else:
            # A slow subscription drops its oldest: bounded memory, and the producers
            # (and every other subscription) never wait for it.
            while self._fresh and (
                len(self._fresh) >= self.buffer or self._fresh_bytes + d.size > self.buffer_bytes
            ):
                self._fresh_bytes -= self._fresh.popleft().size
                self.dropped += 1
        self._fresh.append(d)
        self._fresh_bytes += d.size
        if self.reliable and self._full():
            self._space.clear()
        self.pump()

    async def wait_for_space(self) -> None:
        """Wait until the reliable reader may offer more (the buffer is not full)."""
        await self._space.wait()

    def requeue(self, deliveries: Iterable[Delivery]) -> None:
        """Messages to give to a consumer again (before any fresh one), in offset order."""
        items = sorted(
            (d for d in deliveries if not self._is_acked(d.offset)),
            key=lambda d: d.offset,
        )
        if not items:
            return
        for d in items:
            self._owner.pop(d.offset, None)
        waiting = self._redeliver
        if not waiting or items[-1].offset < waiting[0].offset:
            waiting.extendleft(reversed(items))
        elif items[0].offset > waiting[-1].offset:
            waiting.extend(items)
        else:  # interleaved (nacks one at a time, in any order): merge
            merged = list(heapq.merge(waiting, items, key=lambda d: d.offset))
            waiting.clear()
            waiting.extend(merged)

    def pump(self) -> None:
        """Give waiting messages to consumers with window space, in order."""
        if self.closed:
            return
        candidates = self._candidates()
        if not candidates:
            return
        blocked: set[str] = set()  # key_shared: keys waiting, in either queue
        for source in (self._redeliver, self._fresh):
            while source:
                d = source[0]
                if self._is_acked(d.offset):
                    self._take(source)
                    continue
                c = None if d.key in blocked else self._choose(d, candidates)
                if c is None:
                    if self.sub_type == "key_shared":
                        self._pump_other_keys(source, candidates, blocked)
                    break
                self._take(source)
                self._give(c, d)
        if not self._full():
            self._space.set()

    def _full(self) -> bool:
        return len(self._fresh) >= self.buffer or self._fresh_bytes >= self.buffer_bytes

    def _take(self, source: deque[Delivery]) -> None:
        d = source.popleft()
        if source is self._fresh:
            self._fresh_bytes -= d.size

    def _pump_other_keys(
        self, source: deque[Delivery], candidates: list[ConsumerHandle], blocked: set[str]
    ) -> None:
        """KeyShared: a key whose consumer is full (or absent) holds back only that key.

        Order is kept per key: once a message of a key waits, every later message of that
        key waits behind it, in this queue and (`blocked` is shared) in the fresh one
        after a redelivered one.
        """
        kept: deque[Delivery] = deque()
        for d in source:
            if self._is_acked(d.offset):
                continue
            c = None if d.key in blocked else self._choose(d, candidates)
            if c is None:
                blocked.add(d.key)
                kept.append(d)
            else:
                self._give(c, d)
        source.clear()
        source.extend(kept)
        if source is self._fresh:
            self._fresh_bytes = sum(d.size for d in kept)

    def _give(self, c: ConsumerHandle, d: Delivery) -> None:
        assert c.queue is not None
        if self.reliable:
            c.hold(d)
            self._owner[d.offset] = c
            self._delivered.add(d.offset)
        c.queue.put_nowait(d)
        self.delivered += 1
        self.delivered_bytes += d.size

    def ack(self, offset: int) -> bool:
        """Acknowledge one message; False when it was ignored as never delivered.

        Duplicate acks are fine. An ack for an offset this subscription never delivered
        is ignored (remembered, it would make the subscription skip that message later),
        except, during `MOVED_ACKS_SECONDS` after the subscription opened here, for the
        offsets a previous owner wrote: their acks arrive, maybe before we read them.
        An offset this owner wrote was delivered here or by nobody.
        """
        if not self.reliable or self._is_acked(offset):
            return True
        if offset not in self._delivered and not self._previous_owner_delivered(offset):
            return False
        self._delivered.discard(offset)
        owner = self._owner.pop(offset, None)
        if owner is not None:
            owner.release(offset)
        self._acked.add(offset)
        self._advance()
        self.pump()
        return True

    def _previous_owner_delivered(self, offset: int) -> bool:
        """Whether `offset` may be one the previous owner delivered, acked only now."""
        return offset < self._previous_owner_below and time.monotonic() <= self._foreign_acks_until

    def unacked_message(self, offset: int) -> Any | None:
        """The wire message delivered at `offset` and not yet acked, if any."""
        owner = self._owner.get(offset)
        d = owner.unacked.get(offset) if owner is not None else None
        return d.message if d is not None else None

    def hold(self, offset: int, delay_seconds: float) -> None:
        """Give `offset` to no consumer before `delay_seconds` from now (a nack's delay
        that outlived a move: the previous owner's timer is gone)."""
        if not self.reliable or delay_seconds <= 0 or offset <= self.cursor:
            return
        for source in (self._fresh, self._redeliver):
            for d in source:
                if d.offset == offset:
                    source.remove(d)
                    if source is self._fresh:
                        self._fresh_bytes -= d.size
                    self._later(delay_seconds, d)
                    return
        self._holds[offset] = delay_seconds

    def _later(self, delay_seconds: float, d: Delivery) -> None:
        def due() -> None:
            self.requeue([d])
            self.pump()

        self.schedule(delay_seconds, due)

    def nack(self, offset: int, delay_seconds: float) -> None:
        """Give the message to a consumer again after `delay_seconds`."""
        if not self.reliable:
            return
        owner = self._owner.pop(offset, None)
        if owner is None:
            return
        d = owner.release(offset)
        if d is None:
            return
        if delay_seconds <= 0:
            self.requeue([d])
            self.pump()
            return
        self._later(delay_seconds, d)

    def schedule(self, delay: float, fn: Callable[[], None]) -> None:
        """Run `fn` after `delay` seconds, unless the subscription closes first."""
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None

        def run() -> None:
            if timer is not None:
                self._timers.discard(timer)
            if not self.closed:
                fn()

        timer = loop.call_later(delay, run)
        self._timers.add(timer)

    def _advance(self) -> None:
        pending, acked = self._pending, self._acked
        while pending and pending[0] in acked:
            acked.discard(heapq.heappop(pending))
        cursor = pending[0] - 1 if pending else self._read_through
        if cursor > self.cursor:
            self.cursor = cursor
            if self._acked_before is not None:
                self._acked_before.trim(cursor)
                if not self._acked_before:
                    self._acked_before = None

    def _is_acked(self, offset: int) -> bool:
        """Reliable: whether `offset` is acked (a copy may still wait in a stream's queue,
        which a detach gives back: it must not be delivered again)."""
        return self.reliable and (
            offset <= self.cursor
            or offset in self._acked
            or (self._acked_before is not None and offset in self._acked_before)
        )

    def acked_above_cursor(self, offset: int) -> bool:
        """Whether `offset` is acked and above the cursor (to persist on its own)."""
        return offset > self.cursor and self._is_acked(offset)

    # -- figures and shutdown ------------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        """Bytes read ahead and not yet given to a consumer (against `buffer_bytes`)."""
        return self._fresh_bytes

    @property
    def waiting(self) -> int:
        """Messages read but not yet given to a consumer."""
        return len(self._fresh) + len(self._redeliver)

    def close(self) -> None:
        """Stop dispatching (the topic is leaving); consumers keep their handles."""
        self.closed = True
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self._space.set()
