"""Real traffic for the demo, the chaos test and the failover benchmark.

`LiveTraffic` runs producers and consumers of the published `danube-client` (through a
gateway, so they survive a broker's death) on reliable topics: one producer and one
Exclusive consumer per topic. Every payload carries ``topic:seq``. It records each send
that was acknowledged, each delivery with its offset, and the pauses; `verdict()` then
checks what a messaging system owes its users:

- **lost**: acknowledged sends never delivered (must be 0);
- **duplicates**: deliveries of a seq already delivered (at-least-once retries);
- **unexplained gaps**: holes in a topic's delivered offsets that the storage state does
  not record as skipped by a crash reservation (must be 0);
- **reused offsets**: one offset carrying two different messages (must be 0);
- the longest pause a producer and a consumer saw while traffic ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ballast.metadata import MetadataStore, keys
from ballast.model import TopicName

__all__ = ["LiveTraffic", "TrafficVerdict"]

log = logging.getLogger(__name__)


@dataclass
class TopicTraffic:
    """What happened on one topic."""

    topic: str
    acked: dict[int, float] = field(default_factory=dict)  # seq -> when acknowledged
    delivered: dict[int, int] = field(default_factory=dict)  # seq -> first offset
    deliveries: int = 0
    offsets: dict[int, int] = field(default_factory=dict)  # offset -> seq
    reused: int = 0
    send_errors: int = 0
    last_ack: float | None = None
    last_delivery: float | None = None
    producer_pause: float = 0.0
    consumer_pause: float = 0.0
    recovered_at: float | None = None


@dataclass(frozen=True)
class TrafficVerdict:
    """The traffic summary: counts and pauses; `ok` when nothing was lost or reused."""

    topics: int
    produced: int
    consumed: int
    lost: int
    duplicates: int
    unexplained_gaps: int
    reused_offsets: int
    send_errors: int
    longest_producer_pause: float
    longest_consumer_pause: float
    lost_examples: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.unexplained_gaps == 0 and self.reused_offsets == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "topics": self.topics,
            "produced": self.produced,
            "consumed": self.consumed,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "unexplained_gaps": self.unexplained_gaps,
            "reused_offsets": self.reused_offsets,
            "send_errors": self.send_errors,
            "longest_producer_pause": round(self.longest_producer_pause, 3),
            "longest_consumer_pause": round(self.longest_consumer_pause, 3),
            "lost_examples": list(self.lost_examples),
            "ok": self.ok,
        }


class LiveTraffic:
    """Producers and consumers of the real client on `topics`, through `service_url`."""

    def __init__(
        self,
        service_url: str,
        topics: Sequence[str],
        *,
        rate: float = 20.0,
        subscription: str = "live",
        client_options: Any = None,
    ) -> None:
        self.service_url = service_url
        self.topics = {t: TopicTraffic(t) for t in topics}
        self.rate = rate
        self.subscription = subscription
        self.client_options = client_options
        self.producing = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._clients: list[Any] = []

    async def _client(self) -> Any:
        from danube import DanubeClientBuilder

        url = self.service_url if "://" in self.service_url else f"http://{self.service_url}"
        builder = DanubeClientBuilder().service_url(url)
        if self.client_options is not None:
            builder = self.client_options(builder)
        client = await builder.build()
        self._clients.append(client)
        return client

    async def start(self) -> None:
        """Create every producer, then every consumer, then let traffic flow."""
        from danube import DispatchStrategy, SubType

        client = await self._client()
        producers = []
        for topic in self.topics:
            producer = (
                client.new_producer()
                .with_topic(topic)
                .with_name(f"live-{topic.rsplit('/', 1)[-1]}")
                .with_dispatch_strategy(DispatchStrategy.RELIABLE)
                .build()
            )
            producers.append(producer)
        await asyncio.gather(*(p.create() for p in producers))
        consumers = []
        for topic in self.topics:
            consumer = (
                client.new_consumer()
                .with_topic(topic)
                .with_consumer_name(f"live-{topic.rsplit('/', 1)[-1]}")
                .with_subscription(self.subscription)
                .with_subscription_type(SubType.EXCLUSIVE)
                .build()
            )
            consumers.append(consumer)
        await asyncio.gather(*(c.subscribe() for c in consumers))
        self.producing.set()
        for (topic, state), producer, consumer in zip(
            self.topics.items(), producers, consumers, strict=True
        ):
            queue = await consumer.receive()
            self._tasks.append(
                asyncio.create_task(self._produce(state, producer), name=f"traffic/p{topic}")
            )
            self._tasks.append(
                asyncio.create_task(self._consume(state, consumer, queue), name=f"traffic/c{topic}")
            )

    async def _produce(self, state: TopicTraffic, producer: Any) -> None:
        seq = 0
        interval = 1.0 / self.rate if self.rate > 0 else 0.0
        try:
            while True:
                await self.producing.wait()
                began = time.monotonic()
                try:
                    await producer.send(f"{state.topic}:{seq}".encode())
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the client raises raw gRPC errors
                    state.send_errors += 1
                    log.debug("send to %s failed: %s", state.topic, exc)
                else:
                    now = time.monotonic()
                    state.acked[seq] = now
                    if state.last_ack is not None:
                        state.producer_pause = max(state.producer_pause, now - state.last_ack)
                    state.last_ack = now
                seq += 1
                left = interval - (time.monotonic() - began)
                if left > 0:
                    await asyncio.sleep(left)
        finally:
            with contextlib.suppress(Exception):
                await producer.close()

    async def _consume(self, state: TopicTraffic, consumer: Any, queue: asyncio.Queue[Any]) -> None:
        try:
            while True:
                message = await queue.get()
                now = time.monotonic()
                seq_text = bytes(message.payload).decode().rpartition(":")[2]
                seq, offset = int(seq_text), int(message.msg_id.topic_offset)
                state.deliveries += 1
                if state.offsets.setdefault(offset, seq) != seq:
                    state.reused += 1
                state.delivered.setdefault(seq, offset)
                if state.last_delivery is not None and self.producing.is_set():
                    state.consumer_pause = max(state.consumer_pause, now - state.last_delivery)
                state.last_delivery = now
                with contextlib.suppress(Exception):
                    await consumer.ack(message)
        finally:
            with contextlib.suppress(Exception):
                await consumer.close()

    def reset_pauses(self) -> None:
        """Forget pauses so far (e.g. the start-up) and measure from now on."""
        for state in self.topics.values():
            state.producer_pause = state.consumer_pause = 0.0
            state.last_ack = state.last_delivery = None

    def missing(self) -> int:
        """Acknowledged sends not delivered yet."""
        return sum(len(set(s.acked) - set(s.delivered)) for s in self.topics.values())

    async def stop_producing(self, settle: float = 30.0) -> None:
        """Stop sending, then wait (up to `settle`) until every acknowledged send arrived."""
        self.producing.clear()
        deadline = time.monotonic() + settle
        while self.missing() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        self.producing.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def verdict(self, store: MetadataStore) -> TrafficVerdict:
        """Counts, and offset gaps checked against the storage states' recorded gaps."""
        produced = consumed = lost = duplicates = gaps = reused = errors = 0
        producer_pause = consumer_pause = 0.0
        examples: list[str] = []
        for state in self.topics.values():
            produced += len(state.acked)
            consumed += len(state.delivered)
            missing = sorted(set(state.acked) - set(state.delivered))
            lost += len(missing)
            examples.extend(f"{state.topic}:{seq}" for seq in missing[:3])
            duplicates += state.deliveries - len(state.delivered)
            reused += state.reused
            errors += state.send_errors
            producer_pause = max(producer_pause, state.producer_pause)
            consumer_pause = max(consumer_pause, state.consumer_pause)
            gaps += await _unexplained_gaps(store, state)
        return TrafficVerdict(
            len(self.topics),
            produced,
            consumed,
            lost,
            duplicates,
            gaps,
            reused,
            errors,
            producer_pause,
            consumer_pause,
            tuple(examples[:5]),
        )


async def _unexplained_gaps(store: MetadataStore, state: TopicTraffic) -> int:
    """Holes between delivered offsets that no recorded crash gap covers."""
    offsets = sorted(state.offsets)
    if len(offsets) < 2:
        return 0
    kv = await store.get(keys.storage_state(TopicName.parse(state.topic)))
    recorded: list[tuple[int, int]] = []
    if kv is not None and isinstance(kv.value, dict):
        for pair in kv.value.get("gaps", []) or []:
            with contextlib.suppress(TypeError, ValueError):
                recorded.append((int(pair[0]), int(pair[1])))
    unexplained = 0
    for before, after in itertools.pairwise(offsets):
        if after == before + 1:
            continue
        hole = (before + 1, after - 1)
        if not any(start <= hole[0] and hole[1] <= end for start, end in _merged(recorded)):
            unexplained += 1
    return unexplained


def _merged(gaps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(gaps):
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
