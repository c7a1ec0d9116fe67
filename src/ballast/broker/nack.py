"""Nack with delay, delivery counts and dead-letter topics (reliable subscriptions).

A consumer's ``nack(msg, delay_ms, reason)`` gives the message back: it is redelivered no
earlier than `delay_ms` later (the dispatcher's timer), the reason is logged and counted.
Each nack is one more delivery of that offset on that subscription; the counts live in the
metadata store (``/topics/{ns}/{topic}/subscriptions/{sub}/redeliveries``, offset ->
deliveries, updated by compare-and-swap), so they survive the topic's moves: the next owner
goes on counting, and a nack's delay still running when the topic moves holds the message
on the next owner too (``not_before``, in the same record). When a nacked message has
been delivered `max_deliveries` times it is published to the dead-letter topic
(``/{ns}/{topic}-DLQ``, or the namespace policy's topic) with attributes naming its
origin, and acknowledged on the original subscription (only after the dead-letter topic
took it: a failure means an ordinary redelivery instead).

The limit comes from the namespace's policy record (``/policies/dead_letter/{ns}``:
``{max_deliveries, dead_letter_topic?}``), else `data_plane.max_deliveries` (0: no limit).

`dead_letter_decision` is the pure rule; `NackHandler` does the I/O.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass
from typing import Any

import grpc

from ballast.config import DataPlaneConfig
from ballast.metadata import MetadataStore, keys
from ballast.model import InvalidTopicName, TopicName
from ballast.wire.protocol import pb, pb_grpc

__all__ = [
    "ATTR_DELIVERIES",
    "ATTR_OFFSET",
    "ATTR_REASON",
    "ATTR_SUBSCRIPTION",
    "ATTR_TOPIC",
    "DeadLetterPolicy",
    "NackHandler",
    "dead_letter_decision",
    "dead_letter_message",
]

log = logging.getLogger(__name__)

ATTR_TOPIC = "x-dlq-original-topic"
ATTR_OFFSET = "x-dlq-original-offset"
ATTR_SUBSCRIPTION = "x-dlq-original-subscription"
ATTR_REASON = "x-dlq-reason"
ATTR_DELIVERIES = "x-dlq-deliveries"
_POLICY_TTL = 5.0
_DLQ_TIMEOUT = 10.0
_CAS_ATTEMPTS = 20
_MAX_REASON_LABELS = 50


@dataclass(frozen=True)
class DeadLetterPolicy:
    """How many deliveries a subscription allows, and where a message goes after."""

    max_deliveries: int  # 0: no limit
    topic: str  # the dead-letter topic


def policy_for(topic: TopicName, config: DataPlaneConfig, record: Any) -> DeadLetterPolicy:
    """The namespace record's policy over the configuration's (a bad record is ignored)."""
    limit = config.max_deliveries
    target = f"/{topic.namespace}/{topic.name}{config.dead_letter_suffix}"
    if isinstance(record, dict):
        value = record.get("max_deliveries")
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            limit = value
        named = record.get("dead_letter_topic")
        if isinstance(named, str) and named:
            try:
                target = str(TopicName.parse(named))
            except InvalidTopicName:
                log.warning("dead-letter policy of %s: bad topic %r ignored", topic, named)
    return DeadLetterPolicy(limit, target)


def _offsets(raw: Any, cursor: int) -> dict[str, Any]:
    """offset -> number of a stored map, without offsets at or below `cursor` (acked)."""
    if not isinstance(raw, dict):
        return {}
    return {
        k: v
        for k, v in raw.items()
        if isinstance(k, str) and k.isdigit() and int(k) > cursor
        and isinstance(v, int | float) and not isinstance(v, bool)
    }  # fmt: skip


def dead_letter_decision(deliveries: int, policy: DeadLetterPolicy, topic: str) -> bool:
    """Whether a message nacked after `deliveries` deliveries goes to the dead letters."""
    return (
        policy.max_deliveries > 0
        and deliveries >= policy.max_deliveries
        and (
            topic != policy.topic  # never dead-letter the dead-letter topic into itself
        )
    )


def dead_letter_message(
    message: Any, dlq: str, subscription: str, reason: str, deliveries: int
) -> Any:
    """The copy published to the dead-letter topic, with its origin as attributes."""
    copy = pb.StreamMessage()
    copy.CopyFrom(message)
    copy.attributes[ATTR_TOPIC] = message.msg_id.topic_name
    copy.attributes[ATTR_OFFSET] = str(message.msg_id.topic_offset)
    copy.attributes[ATTR_SUBSCRIPTION] = subscription
    copy.attributes[ATTR_REASON] = reason
    copy.attributes[ATTR_DELIVERIES] = str(deliveries)
    copy.msg_id.topic_name = dlq
    copy.msg_id.topic_offset = 0
    copy.subscription_name = ""
    return copy


class NackHandler:
    """Counts deliveries, applies the delay, dead-letters (one per broker)."""

    def __init__(self, host: Any, clock: Any) -> None:
        self.host = host  # DataPlaneHost
        self.store: MetadataStore = host.store
        self.clock = clock
        self.config: DataPlaneConfig = host.settings
        self._policies: dict[str, tuple[float, Any]] = {}
        self._reasons: set[str] = set()
        self._restored: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    async def policy(self, topic: TopicName) -> DeadLetterPolicy:
        """The topic's policy (namespace records are re-read every few seconds)."""
        now = self.clock.now()
        cached = self._policies.get(topic.namespace)
        if cached is None or now - cached[0] >= _POLICY_TTL:
            kv = await self.store.get(keys.dead_letter_policy(topic.namespace))
            cached = (now, kv.value if kv is not None else None)
            self._policies[topic.namespace] = cached
        return policy_for(topic, self.config, cached[1])

    def _count(self, reason: str) -> None:
        label = (reason or "-")[:64]
        if label not in self._reasons:
            if len(self._reasons) >= _MAX_REASON_LABELS:
                label = "other"
            else:
                self._reasons.add(label)
        self.host.counters.nacks.labels(reason=label).inc()

    async def nack(self, served: Any, request: Any) -> None:
        """Handle one Nack for a topic served here."""
        msg_id = request.msg_id
        subscription = request.subscription_name
        offset = msg_id.topic_offset
        delay = request.delay_ms / 1000.0 if request.HasField("delay_ms") else 0.0
        reason = request.reason if request.HasField("reason") else ""
        self._count(reason)
        dispatcher = served.subscriptions.get(subscription)
        message = dispatcher.unacked_message(offset) if dispatcher is not None else None
        if not served.reliable or message is None:
            served.nack(subscription, offset, delay)
            return
        topic = TopicName.parse(served.name)
        deliveries = await self._record(topic, subscription, offset, dispatcher.cursor, delay)
        log.info(
            "%s: nack of %s offset %d on %s (delivery %d, redeliver in %.3fs): %s",
            self.host.broker_id,
            served.name,
            offset,
            subscription,
            deliveries,
            delay,
            reason or "no reason given",
        )
        policy = await self.policy(topic)
        if dead_letter_decision(deliveries, policy, served.name):
            copy = dead_letter_message(message, policy.topic, subscription, reason, deliveries)
            try:
                async with asyncio.timeout(_DLQ_TIMEOUT):
                    await self._publish(TopicName.parse(policy.topic), copy)
            except Exception as exc:
                log.warning(
                    "%s: dead-lettering %s offset %d to %s failed (%s); redelivering",
                    self.host.broker_id, served.name, offset, policy.topic, exc,
                )  # fmt: skip
                served.nack(subscription, offset, delay)
                return
            await served.ack(subscription, offset)
            self.host.counters.dead_lettered.inc()
            log.info(
                "%s: %s offset %d dead-lettered to %s after %d deliveries (%s)",
                self.host.broker_id, served.name, offset, policy.topic, deliveries, reason,
            )  # fmt: skip
            return
        served.nack(subscription, offset, delay)

    async def _record(
        self, topic: TopicName, subscription: str, offset: int, cursor: int, delay: float
    ) -> int:
        """Add one delivery of `offset` (and when it may come again); the deliveries so far.

        Offsets acked since (at or below the cursor) and holds already over are forgotten.
        """
        key = keys.subscription_redeliveries(topic, subscription)
        for _ in range(_CAS_ATTEMPTS):
            now = self.clock.now()
            kv = await self.store.get(key)
            value = kv.value if kv is not None and isinstance(kv.value, dict) else {}
            counts = _offsets(value.get("deliveries"), cursor)
            holds = {k: v for k, v in _offsets(value.get("not_before"), cursor).items() if v > now}
            deliveries = int(counts.get(str(offset), 0)) + 1
            counts[str(offset)] = deliveries
            if delay > 0:
                holds[str(offset)] = now + delay
            else:
                holds.pop(str(offset), None)
            revision = kv.mod_revision if kv is not None else 0
            record = {"deliveries": counts, "not_before": holds}
            if await self.store.compare_and_swap(key, revision, record):
                return deliveries
        return 1

    async def read_holds(self, served: Any, subscription: str) -> Any:
        """The subscription's recorded nack delays, for `restore_holds`; read while the
        subscription opens (None when there is nothing to restore)."""
        dispatcher = served.subscriptions.get(subscription)
        if not served.reliable or (dispatcher is not None and id(dispatcher) in self._restored):
            return None
        kv = await self.store.get(keys.subscription_redeliveries(served.name, subscription))
        return kv.value if kv is not None and isinstance(kv.value, dict) else None

    def restore_holds(self, served: Any, subscription: str, record: Any) -> None:
        """A subscription opened here after a move: nack delays still running elsewhere
        (`record`, from `read_holds`) hold their messages here too (each dispatcher once)."""
        dispatcher = served.subscriptions.get(subscription)
        if dispatcher is None or id(dispatcher) in self._restored or record is None:
            return
        self._restored[id(dispatcher)] = dispatcher
        now = self.clock.now()
        for offset, due in _offsets(record.get("not_before"), dispatcher.cursor).items():
            if due > now:
                dispatcher.hold(int(offset), due - now)

    async def deliveries(self, topic: TopicName, subscription: str) -> dict[int, int]:
        """The recorded delivery counts of a subscription's nacked messages."""
        kv = await self.store.get(keys.subscription_redeliveries(topic, subscription))
        if kv is None or not isinstance(kv.value, dict):
            return {}
        return {int(k): int(v) for k, v in kv.value.get("deliveries", {}).items()}

    async def _publish(self, topic: TopicName, message: Any) -> None:
        """Publish to `topic` wherever it is served (creating it, reliable, if absent)."""
        from ballast.broker.host import DISPATCH_KEY, RELIABLE

        directory = self.host.directory
        name = str(topic)
        while True:
            served = self.host.topics.get(name)
            if served is not None and served.accepting:
                await served.publish(message)
                return
            if await directory.meta(topic) is None:
                await directory.create_topic(topic, {DISPATCH_KEY: RELIABLE})
            owner = await directory.owner(topic)
            remote = owner is not None and owner.broker_id != self.host.broker_id
            if remote and await self._send_remote(owner.broker_url, name, message):
                return
            await asyncio.sleep(0.1)

    async def _send_remote(self, url: str, topic: str, message: Any) -> bool:
        dialer = self.host.dialer
        async with dialer.channel(url) as channel:
            stub = pb_grpc.ProducerServiceStub(channel)
            try:
                reply = await stub.CreateProducer(
                    pb.ProducerRequest(
                        request_id=1,
                        producer_name=f"ballast-dead-letters-{self.host.broker_id}",
                        topic_name=topic,
                        dispatch_strategy=pb.Reliable,
                    ),
                    timeout=2.0,
                    metadata=dialer.metadata(),
                )
                message.msg_id.producer_id = reply.producer_id
                await stub.SendMessage(message, timeout=2.0, metadata=dialer.metadata())
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.UNAVAILABLE:
                    return False
                raise
        return True
