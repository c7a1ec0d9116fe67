"""The gRPC handlers of Danube's client protocol: Discovery, producers, consumers, health.

The rules, as the published `danube-client` (0.5.0) expects a broker to behave:

- every broker answers TopicLookup for every topic from the metadata: Connect when it
  owns the topic, Redirect to the owner otherwise; while a topic waits for an owner the
  lookup waits (up to `lookup_wait_seconds`) so a moving client lands on the new owner;
- a producer or consumer that reaches a broker that does not (or no longer) serve its
  topic gets UNAVAILABLE, the only code on which the 0.5.0 client looks up again and
  recreates; never NOT_FOUND or PERMISSION_DENIED for that;
- CreateProducer and Subscribe are idempotent by name; a reconnecting consumer takes
  over its old stream;
- Ack and Nack identify the message by topic, subscription and offset; unknown or
  duplicate ones answer OK;
- bad input gets INVALID_ARGUMENT (or FAILED_PRECONDITION for a dispatch-strategy
  mismatch) with a message naming the problem; it is logged and counted, and the broker
  goes on serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import grpc

from ballast.aio import both
from ballast.broker.host import DISPATCH_KEY, NON_RELIABLE, RELIABLE, DataPlaneHost
from ballast.broker.nack import NackHandler
from ballast.broker.quotas import QuotaCache, over_quota
from ballast.broker.topics import ServedTopic
from ballast.config import BallastConfig
from ballast.metadata import keys
from ballast.metadata.directory import Owner, partition_index
from ballast.model import InvalidTopicName, TopicName
from ballast.registry.service import (
    SchemaStore,
    TopicSchemas,
    producer_schema_check,
    send_check,
)
from ballast.wire.auth import AuthError, Binding, Permission, bind, check_bound
from ballast.wire.errors import RpcFailure, bad_input, not_served
from ballast.wire.limits import check_message, check_name
from ballast.wire.protocol import (
    CARRIED_HEADER,
    CLIENT_CONSUMER,
    CLIENT_PRODUCER,
    CONNECT,
    HEALTH_CLOSE,
    HEALTH_OK,
    REDIRECT,
    RELAY_HEADER,
    SUBSCRIPTION_TYPES,
    pb,
    pb_grpc,
)
from ballast.wire.rpc import rpc

__all__ = ["DataPlaneService"]

log = logging.getLogger(__name__)

T = TypeVar("T")
UNKNOWN_CONSUMER_DELAY = 0.5

_STRATEGY = {pb.NonReliable: NON_RELIABLE, pb.Reliable: RELIABLE}


def _topic(value: str, what: str = "topic") -> TopicName:
    try:
        return TopicName.parse(value)
    except InvalidTopicName as exc:
        raise bad_input(f"{what}: {exc}", "bad_topic") from None


def _owned(binding: Binding | None, needed: tuple[Permission, ...], what: str) -> None:
    """PERMISSION_DENIED unless the caller owns the id (ids are no bearer credentials)."""
    try:
        check_bound(binding, needed, what)
    except AuthError as exc:
        raise RpcFailure(exc.code, exc.message, "not_owner") from None


# A new topic's first producer waits for its placement in steps of this, looking for an
# owner elsewhere in between (then the client is sent on; the assignment here wakes it at once).
_PLACEMENT_POLL_SECONDS = 0.2
# A CLOSE answer waits at most this long for the relay's give-back (see `relay`).
_GIVE_BACK_WAIT_SECONDS = 1.0
_PRODUCE = (Permission.PRODUCE,)
_CONSUME = (Permission.CONSUME,)


async def _warm_up(read: Awaitable[Any]) -> None:
    """A read that fills a cache ahead of its use: whatever fails here is read again where
    it is needed, and reported there."""
    with contextlib.suppress(Exception):
        await read


class DataPlaneService(
    pb_grpc.DiscoveryServicer,
    pb_grpc.ProducerServiceServicer,
    pb_grpc.ConsumerServiceServicer,
    pb_grpc.HealthCheckServicer,
):
    """All four services of the client protocol, over one `DataPlaneHost`."""

    def __init__(self, host: DataPlaneHost, config: BallastConfig, broker_url: str) -> None:
        self.host = host
        self.broker_id = host.broker_id
        self.broker_url = broker_url
        self.settings = config.data_plane
        self.schemas = TopicSchemas(SchemaStore(host.store, host.clock), host.clock)
        self.nacks = NackHandler(host, host.clock)
        self.rpc_label = host.broker_id
        self.budgets = host.budgets
        self.quotas = QuotaCache(host.store, host.clock)
        host.counters.held_bytes.set_function(lambda: self.budgets.total)

    def refused(self, rpc: str, reason: str) -> None:
        """Count a refused request (`rpc`'s hook)."""
        self.host.counters.reject(rpc, reason)

    # -- Discovery -------------------------------------------------------------------------

    @rpc("TopicLookup")
    async def TopicLookup(self, request: Any, context: Any) -> Any:
        topic = _topic(request.topic)
        served = self.host.topics.get(str(topic))
        if served is not None and served.accepting:
            return self._lookup_answer(request, CONNECT, self.broker_url)
        where = await self.host.directory.whereabouts(topic)
        owner = where.owner
        if owner is None:
            if not where.exists:
                raise RpcFailure(
                    grpc.StatusCode.NOT_FOUND,
                    f"topic {topic} does not exist (a producer creates it)",
                    "unknown_topic",
                )
            owner = await self._wait_for_owner(topic)
        if owner is None or owner.broker_id == self.broker_id:
            # Still unplaced (or loading here): come here; CreateProducer/Subscribe answer
            # UNAVAILABLE until it is served, and the client looks up again.
            return self._lookup_answer(request, CONNECT, self.broker_url)
        return self._lookup_answer(request, REDIRECT, owner.broker_url)

    async def _placed_here(self, topic: TopicName) -> ServedTopic | None:
        """The topic just created, once the leader placed it here and it opened (within
        `lookup_wait_seconds`); None once it is placed elsewhere or the wait ends. Without
        this, the client's first producer retried after a 100-200 ms back-off."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.lookup_wait_seconds
        name = str(topic)
        while loop.time() < deadline:
            if await self.host.assigned_here(name, _PLACEMENT_POLL_SECONDS):
                served = await self.host.serving(name)
                return served if served is not None and served.accepting else None
            owner = await self.host.directory.owner(topic)
            if owner is not None and owner.broker_id != self.broker_id:
                return None
        return None

    async def _wait_for_owner(self, topic: TopicName) -> Owner | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.lookup_wait_seconds
        while loop.time() < deadline:
            await asyncio.sleep(0.05)
            if str(topic) in self.host.topics:
                return Owner(self.broker_id, self.broker_url)
            owner = await self.host.directory.owner(topic)
            if owner is not None:
                return owner
        return None

    @staticmethod
    def _lookup_answer(request: Any, kind: int, url: str) -> Any:
        return pb.TopicLookupResponse(
            request_id=request.request_id,
            response_type=kind,
            connect_url=url,
            broker_url=url,
            proxy=False,
        )

    @rpc("TopicPartitions")
    async def TopicPartitions(self, request: Any, context: Any) -> Any:
        topic = _topic(request.topic)
        names = await self.host.directory.partitions(topic)
        return pb.TopicPartitionsResponse(request_id=request.request_id, partitions=names)

    # -- producers -------------------------------------------------------------------------

    @rpc("CreateProducer")
    async def CreateProducer(self, request: Any, context: Any) -> Any:
        topic = _topic(request.topic_name)
        check_name(request.producer_name, "producer_name")
        strategy = _STRATEGY.get(request.dispatch_strategy)
        if strategy is None:
            raise bad_input(
                f"dispatch_strategy: unknown value {request.dispatch_strategy} "
                "(0 = NonReliable, 1 = Reliable)",
                "bad_dispatch_strategy",
            )
        # Read what the create and the first send check while the topic opens (a move's
        # new owner is asked before it serves), not on their path: the schema binding and
        # the namespace's quotas.
        served, *_ = await asyncio.gather(
            self.host.serving(str(topic)),
            _warm_up(self.schemas.binding(str(topic))),
            _warm_up(self.quotas.get(topic.namespace)),
        )
        if served is None or not served.accepting:
            served = await self._not_here(topic, strategy, create=True)
        self._check_strategy(topic, "reliable" if served.reliable else NON_RELIABLE, strategy)
        if request.producer_name not in served.producers:
            quotas = await self.quotas.get(topic.namespace)
            over_quota(
                topic.namespace,
                "producers_per_topic",
                len(served.producers),
                quotas.max_producers_per_topic,
            )
        if request.HasField("schema_ref"):
            await producer_schema_check(self.schemas, topic, request.schema_ref)
        entry = served.add_producer(request.producer_name, self.host.clock.now())
        entry.owner = bind(topic.namespace)  # a reconnect by name takes the id over
        self.host.add_producer(entry)
        return pb.ProducerResponse(
            request_id=request.request_id, producer_id=entry.id, producer_name=entry.name
        )

    @staticmethod
    def _check_strategy(topic: TopicName, topic_strategy: str, requested: str) -> None:
        if topic_strategy != requested:
            raise RpcFailure(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"topic {topic} is {topic_strategy.replace('_', '-')}; a "
                f"{requested.replace('_', '-')} producer cannot publish to it "
                "(use the topic's dispatch strategy or another topic)",
                "dispatch_mismatch",
            )

    async def _not_here(
        self, topic: TopicName, strategy: str | None, *, create: bool
    ) -> ServedTopic:
        """Answer for a topic this broker does not serve: create it (and serve it, if it
        is placed here at once), or send the client on (raises UNAVAILABLE)."""
        directory = self.host.directory
        meta, namespace_exists = await directory.meta_in_namespace(topic)
        if meta is None:
            if not namespace_exists:
                raise RpcFailure(
                    grpc.StatusCode.NOT_FOUND,
                    f"namespace {topic.namespace!r} does not exist "
                    "(create it with `ballast admin namespaces create`)",
                    "unknown_namespace",
                )
            if not create or strategy is None:
                if await directory.marker(topic) is None:
                    raise RpcFailure(
                        grpc.StatusCode.NOT_FOUND,
                        f"topic {topic} does not exist (a producer creates it)",
                        "unknown_topic",
                    )
                raise not_served(f"topic {topic} is not placed yet; retry")
            quotas = await self.quotas.get(topic.namespace)
            auto = quotas.auto_create_topics
            if not (self.settings.auto_create_topics if auto is None else auto):
                raise RpcFailure(
                    grpc.StatusCode.NOT_FOUND,
                    f"topic {topic} does not exist and auto-creation is off "
                    f"({'the namespace policy' if auto is not None else 'the configuration'})",
                    "unknown_topic",
                )
            if quotas.max_topics:
                count = await self.quotas.topic_count(topic.namespace)
                over_quota(topic.namespace, "topics", count, quotas.max_topics)
            is_partition = partition_index(topic.name.rsplit("-part-", 1)[0], topic.name)
            found = [] if is_partition is not None else await directory.partitions_of(topic)
            if found and found != [str(topic)]:
                raise RpcFailure(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"{topic} is a partitioned topic; publish with partitions",
                    "partitioned_conflict",
                )
            # (`found` naming the topic itself: another producer's create landed since the
            # first look, a plain topic: wait for its placement as for ours.)
            created = not found and await directory.create_topic(topic, {DISPATCH_KEY: strategy})
            if created:
                log.info("%s: created %s topic %s", self.broker_id, strategy, topic)
            served = await self._placed_here(topic)
            if served is not None:
                return served  # the first producer is served without a retry
            if created:
                raise not_served(f"topic {topic} was just created; waiting for its placement")
            raise not_served(f"topic {topic} is not served by this broker; redo the lookup")
        if strategy is not None:
            self._check_strategy(topic, meta.get(DISPATCH_KEY, NON_RELIABLE), strategy)
        owner = await directory.owner(topic)
        if owner is not None and owner.broker_id == self.broker_id:
            # Placed here, and the client (a gateway carrying a producer) heard it first:
            # serve it once this broker's watch has the assignment and the topic opened.
            served = await self._placed_here(topic)
            if served is not None:
                return served
        raise not_served(f"topic {topic} is not served by this broker; redo the lookup")

    @rpc("SendMessage")
    async def SendMessage(self, request: Any, context: Any) -> Any:
        msg_id = request.msg_id
        entry = self.host.producers.get(msg_id.producer_id)
        if entry is None:
            raise not_served(
                f"producer {msg_id.producer_id} is not registered on this broker "
                "(the topic moved?); redo the lookup",
                "unknown_producer",
            )
        if msg_id.topic_name != entry.topic.name:
            raise bad_input(
                f"producer {msg_id.producer_id} belongs to {entry.topic.name}, "
                f"not to {msg_id.topic_name!r}",
                "producer_topic_mismatch",
            )
        _owned(entry.owner, _PRODUCE, f"producer {msg_id.producer_id}")
        size = check_message(request, self.settings.max_message_bytes)
        entry.last_seen = self.host.clock.now()
        await send_check(self.schemas, entry.topic.name, request, self.host.counters)
        with self.budgets.hold(entry.topic.name, size):
            await entry.topic.publish(request)
        self.host.counters.messages_in.inc()
        self.host.counters.bytes_in.inc(size)
        return pb.MessageResponse(request_id=request.request_id)

    # -- consumers -------------------------------------------------------------------------

    @rpc("Subscribe")
    async def Subscribe(self, request: Any, context: Any) -> Any:
        topic = _topic(request.topic_name)
        try:
            keys.subscription_cursor(topic, request.subscription)
        except ValueError as exc:
            raise bad_input(f"subscription: {exc}", "bad_subscription") from None
        sub_type = SUBSCRIPTION_TYPES.get(request.subscription_type)
        if sub_type is None:
            raise bad_input(
                f"subscription_type: unknown value {request.subscription_type} "
                "(0 = Exclusive, 1 = Shared, 2 = Failover, 3 = KeyShared)",
                "bad_subscription_type",
            )
        check_name(request.consumer_name, "consumer_name")
        # A consumer that follows its topic to a new owner waits for the opening: read
        # the quotas meanwhile, and the recorded nack delays while the subscription opens.
        served, _ = await asyncio.gather(
            self.host.serving(str(topic)), _warm_up(self.quotas.get(topic.namespace))
        )
        if served is None or not served.accepting:
            # Raises, unless the ownership record places the topic here (a gateway carrying
            # the consumer heard of the move first): then it waits for the opening.
            served = await self._not_here(topic, None, create=False)
        await self._subscribe_quotas(topic, served, request.subscription, request.consumer_name)
        handle, holds = await both(
            served.subscribe(
                request.subscription,
                sub_type,
                request.consumer_name,
                tuple(request.key_filters),
                self.host.clock.now(),
            ),
            self.nacks.read_holds(served, request.subscription),
        )
        handle.owner = bind(topic.namespace)  # a reconnect by name takes the stream over
        self.host.add_consumer(handle)
        self.nacks.restore_holds(served, request.subscription, holds)
        return pb.ConsumerResponse(
            request_id=request.request_id, consumer_id=handle.id, consumer_name=handle.name
        )

    async def _subscribe_quotas(
        self, topic: TopicName, served: Any, subscription: str, consumer: str
    ) -> None:
        """A new subscription or consumer must fit the namespace's quotas."""
        existing = served.subscriptions.get(subscription)
        if existing is not None and consumer in existing.consumers:
            return  # a reconnect
        quotas = await self.quotas.get(topic.namespace)
        if existing is None:
            over_quota(
                topic.namespace,
                "subscriptions_per_topic",
                len(served.subscriptions),
                quotas.max_subscriptions_per_topic,
            )
        over_quota(
            topic.namespace,
            "consumers_per_topic",
            len(served.consumers()),
            quotas.max_consumers_per_topic,
        )

    async def ReceiveMessages(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """Stream the consumer's messages until it is taken over, leaves or goes away."""
        handle = self.host.consumers.get(request.consumer_id)
        if handle is None or handle.closing:
            # A consumer of a topic that left: slow its reopen loop down (the close
            # handshake normally prevents it).
            self.host.counters.reject("ReceiveMessages", "unknown_consumer")
            await asyncio.sleep(UNKNOWN_CONSUMER_DELAY)
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"consumer {request.consumer_id} is not registered on this broker",
            )
            return
        try:
            check_bound(handle.owner, _CONSUME, f"consumer {request.consumer_id}")
        except AuthError as exc:
            self.host.counters.reject("ReceiveMessages", "not_owner")
            await context.abort(exc.code, exc.message)
            return
        queue = handle.attach()
        handle.last_seen = self.host.clock.now()
        metadata = context.invocation_metadata() or ()
        relay = any(item[0] == RELAY_HEADER for item in metadata)
        handle.carried = any(item[0] == CARRIED_HEADER for item in metadata)
        counter = self.host.counters.messages_out
        try:
            while True:
                delivery = await queue.get()
                if delivery is None or handle.close_sent:
                    return
                counter.inc()
                if delivery.relayed:
                    handle.recent.append((self.host.clock.now(), delivery))
                yield delivery.message
        finally:
            handle.last_seen = self.host.clock.now()
            handle.detach(queue, keep_sent=relay)

    @rpc("Ack")
    async def Ack(self, request: Any, context: Any) -> Any:
        msg_id = request.msg_id
        served = self.host.topics.get(msg_id.topic_name)
        if served is not None:
            if not await served.ack(request.subscription_name, msg_id.topic_offset):
                # Answered OK like any unknown ack; counted, never remembered.
                self.host.counters.acks_ignored.inc()
        else:
            relay = self.host.relay_for(msg_id.topic_name, request.subscription_name)
            if relay is not None:
                await relay.ack(request)
        return pb.AckResponse(request_id=request.request_id)

    @rpc("Nack")
    async def Nack(self, request: Any, context: Any) -> Any:
        msg_id = request.msg_id
        served = self.host.topics.get(msg_id.topic_name)
        if served is not None:
            await self.nacks.nack(served, request)
        else:
            relay = self.host.relay_for(msg_id.topic_name, request.subscription_name)
            if relay is not None:
                await relay.nack(request)
        return pb.NackResponse(request_id=request.request_id)

    # -- health ----------------------------------------------------------------------------

    @rpc("HealthCheck")
    async def HealthCheck(self, request: Any, context: Any) -> Any:
        now = self.host.clock.now()
        if request.client == CLIENT_PRODUCER:
            entry = self.host.producers.get(request.id)
            if entry is None:
                return pb.HealthCheckResponse(status=HEALTH_CLOSE)
            _owned(entry.owner, _PRODUCE, f"producer {request.id}")
            entry.last_seen = now
            return pb.HealthCheckResponse(status=HEALTH_OK)
        if request.client == CLIENT_CONSUMER:
            handle = self.host.consumers.get(request.id)
            if handle is None:
                return pb.HealthCheckResponse(status=HEALTH_CLOSE)
            _owned(handle.owner, _CONSUME, f"consumer {request.id}")
            if handle.closing:
                given_back = self.host.on_close_sent(handle)
                if given_back is not None:
                    # What the relay gives back is at the new owner before the client can
                    # re-attach there: it comes first, in order (bounded wait).
                    await asyncio.wait({given_back}, timeout=_GIVE_BACK_WAIT_SECONDS)
                return pb.HealthCheckResponse(status=HEALTH_CLOSE)
            handle.last_seen = now
            return pb.HealthCheckResponse(status=HEALTH_OK)
        raise bad_input(
            f"client: unknown client type {request.client} (0 = Producer, 1 = Consumer)",
            "bad_client_type",
        )
