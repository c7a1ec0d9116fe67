"""The gateway's answers when a broker is gone, on the wire (raw stubs, no broker needed):
UNAVAILABLE for producers, a held stream that ends just after the health check said CLOSE,
lenient acks, and lookups that wait for a live owner."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import time
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from ballast.config import parse_config
from ballast.gateway.calls import BROKER_HEADER
from ballast.gateway.gateway import Gateway
from ballast.gateway.routes import OwnerTable
from ballast.metadata import MemoryStore, keys
from ballast.metadata.records import claim_ops, release_ops
from ballast.model import TopicName
from ballast.wire.link import LINK_METHOD, LinkService, SendLink
from ballast.wire.protocol import CLIENT_CONSUMER, HEALTH_CLOSE, pb, pb_grpc
from tests.etcd_fixtures import free_port

pytestmark = pytest.mark.timeout(30)

TOPIC = TopicName.parse("/default/t")


def dead_url() -> str:
    return f"127.0.0.1:{free_port()}"  # nobody listens there afterwards


async def place(store: MemoryStore, broker: str, url: str) -> None:
    """`broker` registered at `url` and owning the reliable topic `TOPIC`."""
    await store.put(keys.register(broker), {"broker_url": url})
    await store.txn([], claim_ops(broker, str(TOPIC), {"assigned_at": 0, "epoch": 1}))
    await store.put(keys.topic_meta(TOPIC), {"dispatch_strategy": "reliable"})


@pytest.fixture
async def gone() -> AsyncIterator[tuple[Gateway, str, MemoryStore]]:
    store = MemoryStore()
    url = dead_url()
    await place(store, "dead", url)
    config = parse_config({"gateway": {"lookup_wait_seconds": 2.0, "close_hold_seconds": 10}})
    async with Gateway(store, config, "127.0.0.1:0") as gateway:
        yield gateway, url, store


async def test_a_gone_broker_holds_the_stream_until_close(
    gone: tuple[Gateway, str, MemoryStore],
) -> None:
    gateway, url, _ = gone
    header = ((BROKER_HEADER, url),)
    async with grpc.aio.insecure_channel(gateway.advertise) as channel:
        consumers = pb_grpc.ConsumerServiceStub(channel)
        stream = consumers.ReceiveMessages(
            pb.ReceiveRequest(request_id=1, consumer_id=5), metadata=header
        )
        reader = asyncio.ensure_future(stream.read())
        await asyncio.sleep(1.0)
        assert not reader.done(), "the stream must stay open until CLOSE (no reopen spin)"
        health = await pb_grpc.HealthCheckStub(channel).HealthCheck(
            pb.HealthCheckRequest(request_id=1, client=CLIENT_CONSUMER, id=5), metadata=header
        )
        assert health.status == HEALTH_CLOSE
        closed_at = time.monotonic()
        assert await asyncio.wait_for(reader, 3) is grpc.aio.EOF
        assert time.monotonic() - closed_at < 2.0

        producers = pb_grpc.ProducerServiceStub(channel)
        message = pb.StreamMessage(
            request_id=3, msg_id=pb.MsgID(producer_id=9, topic_name=str(TOPIC)), payload=b"x"
        )
        with pytest.raises(grpc.aio.AioRpcError) as send:
            await producers.SendMessage(message, metadata=header)
        assert send.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "look the topic up again" in (send.value.details() or "")

        ack = await consumers.Ack(
            pb.AckRequest(request_id=4, msg_id=message.msg_id, subscription_name="s"),
            metadata=header,
        )
        assert ack.request_id == 4  # lenient: the message comes again from the next owner


async def test_lookup_waits_for_a_live_owner(gone: tuple[Gateway, str, MemoryStore]) -> None:
    gateway, _, store = gone
    async with grpc.aio.insecure_channel(gateway.advertise) as channel:
        discovery = pb_grpc.DiscoveryStub(channel)
        request = pb.TopicLookupRequest(request_id=1, topic=str(TOPIC))
        with pytest.raises(grpc.aio.AioRpcError) as waited:
            await discovery.TopicLookup(request)
        assert waited.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "unreachable" in (waited.value.details() or "")

        # A live owner appears while a lookup waits: the lookup names it.
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            pending = asyncio.ensure_future(discovery.TopicLookup(request))
            await asyncio.sleep(0.2)
            live = f"127.0.0.1:{port}"
            await store.put(keys.register("heir"), {"broker_url": live})
            await store.txn([], release_ops("dead", str(TOPIC)))
            await store.txn([], claim_ops("heir", str(TOPIC), {"assigned_at": 1, "epoch": 2}))
            answer = await asyncio.wait_for(pending, 5)
            assert (answer.broker_url, answer.connect_url, answer.proxy) == (
                live,
                gateway.advertise,
                True,
            )
        finally:
            await server.stop(0)


async def test_made_up_method_names_are_unimplemented_and_kept_nowhere(
    gone: tuple[Gateway, str, MemoryStore],
) -> None:
    gateway, _, _ = gone
    known = len(gateway._handlers)
    async with grpc.aio.insecure_channel(gateway.advertise) as channel:
        for n in range(50):
            for prefix in ("/danube_schema.SchemaRegistry/", "/danube.Nothing/"):
                call = channel.unary_unary(f"{prefix}Made{n}")
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call(b"", timeout=5)
                assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED
    # Every real schema method is served (a made-up name used to be remembered for ever).
    assert len(gateway._handlers) == known
    assert "/danube_schema.SchemaRegistry/GetLatestSchema" in gateway._handlers


async def test_a_change_made_while_a_caller_was_busy_is_not_missed() -> None:
    """A carried session reads the owner, asks it (busy), then waits for a change: a new
    owner recorded meanwhile ends the wait at once instead of after its timeout."""
    store = MemoryStore()
    table = OwnerTable(store)
    watching = asyncio.create_task(table.run())
    try:
        await asyncio.wait_for(table.ready.wait(), 5)
        seen = table.version
        assert table.owner(str(TOPIC)) is None
        # While the caller is busy elsewhere, the topic gets an owner.
        await store.put(keys.register("b1"), {"broker_url": "127.0.0.1:1"})
        await store.txn([], claim_ops("b1", str(TOPIC), {"assigned_at": 0, "epoch": 1}))
        for _ in range(100):
            if table.owner(str(TOPIC)) is not None:
                break
            await asyncio.sleep(0.01)
        began = time.monotonic()
        await table.changed(5.0, seen)
        assert time.monotonic() - began < 0.5
        owner = table.owner(str(TOPIC))
        assert owner is not None and owner.broker_id == "b1"
        # Nothing new since: the wait runs to its timeout.
        began = time.monotonic()
        await table.changed(0.2, table.version)
        assert time.monotonic() - began >= 0.19
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching


class FakeBroker(grpc.GenericRpcHandler):
    """A broker that creates producers (with its own ids) and either stores linked sends
    or takes them and never answers (a host that froze or lost power: no RST comes)."""

    def __init__(self, producer_id: int, *, answers: bool) -> None:
        self.producer_id = producer_id
        self.stored: list[pb.StreamMessage] = []
        self.url = ""
        self._server = grpc.aio.server()
        self._link = LinkService(None, lambda rpc, code: None, send=self._store)
        self._answers = answers

    async def _store(self, request: Any, context: Any) -> Any:
        self.stored.append(request)
        return pb.MessageResponse(request_id=request.request_id)

    async def _create(self, request: bytes, context: Any) -> bytes:
        asked = pb.ProducerRequest.FromString(request)
        answer = pb.ProducerResponse(
            request_id=asked.request_id, producer_id=self.producer_id, producer_name="p"
        )
        return bytes(answer.SerializeToString())

    async def _send(self, request: bytes, context: Any) -> bytes:
        if not self._answers:
            await asyncio.Event().wait()  # taken, never answered
        reply = await self._store(pb.StreamMessage.FromString(request), context)
        return bytes(reply.SerializeToString())

    async def _silent(self, frames: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for _ in frames:
            pass  # taken, never answered
        yield b""  # pragma: no cover - the stream never ends

    def service(self, details: grpc.HandlerCallDetails) -> Any:
        if details.method == "/danube.ProducerService/CreateProducer":
            return grpc.unary_unary_rpc_method_handler(self._create)
        if details.method == "/danube.ProducerService/SendMessage":
            return grpc.unary_unary_rpc_method_handler(self._send)
        if details.method == LINK_METHOD and not self._answers:
            return grpc.stream_stream_rpc_method_handler(self._silent)
        return self._link.service(details)

    async def __aenter__(self) -> FakeBroker:
        self._server.add_generic_rpc_handlers((self,))
        self.url = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        await self._server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.stop(0)


@pytest.mark.parametrize("batch_sends", [True, False], ids=["linked", "unary"])
async def test_sends_on_a_silent_owner_move_on_when_its_registration_goes(
    batch_sends: bool,
) -> None:
    """A send taken by an owner that then never answers waits only until the owner's
    registration is gone (not `forward_timeout_seconds`, 30 s): it is carried to the
    topic's next owner, under that owner's producer id — on the send link and as a
    unary call alike."""
    store = MemoryStore()
    config = parse_config({"gateway": {"lookup_wait_seconds": 10.0, "batch_sends": batch_sends}})
    async with FakeBroker(101, answers=False) as hung, FakeBroker(202, answers=True) as heir:
        await place(store, "hung", hung.url)
        async with (
            Gateway(store, config, "127.0.0.1:0") as gateway,
            grpc.aio.insecure_channel(gateway.advertise) as channel,
        ):
            producers = pb_grpc.ProducerServiceStub(channel)
            created = await producers.CreateProducer(
                pb.ProducerRequest(request_id=1, producer_name="p", topic_name=str(TOPIC))
            )
            message = pb.StreamMessage(
                request_id=2,
                msg_id=pb.MsgID(producer_id=created.producer_id, topic_name=str(TOPIC)),
                payload=b"kept",
            )
            sending = asyncio.ensure_future(producers.SendMessage(message))
            await asyncio.sleep(0.5)
            assert not sending.done(), "the silent owner has not answered"

            # Its lease expires; the leader gives the topic to the heir.
            await store.delete(keys.register("hung"))
            await store.put(keys.register("heir"), {"broker_url": heir.url})
            await store.txn([], release_ops("hung", str(TOPIC)))
            await store.txn([], claim_ops("heir", str(TOPIC), {"assigned_at": 1, "epoch": 2}))
            answer = await asyncio.wait_for(sending, 5)
            assert answer.request_id == 2
            assert [m.payload for m in heir.stored] == [b"kept"]
            assert heir.stored[0].msg_id.producer_id == 202


async def test_a_link_abandoned_before_its_stream_ran_fails_its_sends_at_once() -> None:
    """The gateway may end a link (its broker's registration went) in the same turn of
    the loop that opened it: the send must fail UNAVAILABLE then, not wait 30 s."""
    async with (
        FakeBroker(7, answers=False) as silent,
        grpc.aio.insecure_channel(silent.url) as channel,
    ):
        link = SendLink(channel, silent.url)
        sending = asyncio.ensure_future(link.send(b"m", None, 30.0))
        await asyncio.sleep(0)  # the send is written down; the stream task not yet run
        link.abandon()
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await asyncio.wait_for(sending, 2)
        assert failed.value.code() is grpc.StatusCode.UNAVAILABLE
        await link.close()


async def test_the_gateway_exports_its_figures_to_prometheus() -> None:
    """`gateway.metrics_port`: sessions, held sends, events and each link's records and
    frames, read at the scrape."""
    store = MemoryStore()
    port = free_port()
    config = parse_config({"gateway": {"metrics_port": port}})
    async with FakeBroker(5, answers=True) as broker:
        await place(store, "b1", broker.url)
        async with (
            Gateway(store, config, "127.0.0.1:0") as gateway,
            grpc.aio.insecure_channel(gateway.advertise) as channel,
        ):
            assert gateway.metrics_url == f"127.0.0.1:{port}"
            await pb_grpc.DiscoveryStub(channel).TopicLookup(
                pb.TopicLookupRequest(request_id=1, topic=str(TOPIC))
            )
            producers = pb_grpc.ProducerServiceStub(channel)
            created = await producers.CreateProducer(
                pb.ProducerRequest(request_id=1, producer_name="p", topic_name=str(TOPIC))
            )
            for n in range(3):
                msg_id = pb.MsgID(producer_id=created.producer_id, topic_name=str(TOPIC))
                await producers.SendMessage(pb.StreamMessage(request_id=n, msg_id=msg_id))
            gc.collect()  # one pause of the cycle collector to export
            text = await asyncio.to_thread(
                lambda: (
                    urllib.request.urlopen(f"http://{gateway.metrics_url}/metrics", timeout=5)
                    .read()
                    .decode()
                )
            )
        samples = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("ballast_gateway_")
        }
        assert samples['ballast_gateway_events_total{event="lookup"}'] == 1
        assert samples['ballast_gateway_sessions{kind="producer"}'] == 1
        assert samples['ballast_gateway_sessions{kind="consumer"}'] == 0
        assert samples["ballast_gateway_held_sends"] == 0
        assert 'ballast_gc_pause_seconds_count{generation="2"}' in text
        link = f'broker_url="{broker.url}",link="SendMessages"'
        assert samples[f"ballast_gateway_link_records_total{{{link}}}"] == 3
        assert 1 <= samples[f"ballast_gateway_link_frames_total{{{link}}}"] <= 3
        # The fake broker has no link port: the link is a stream on its gRPC port.
        assert samples[f"ballast_gateway_link_tcp{{{link}}}"] == 0
    # Stopped with the gateway: nothing listens there any more (the scrape's connection
    # may linger in TIME_WAIT, which SO_REUSEADDR allows; a listener it would not).
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
