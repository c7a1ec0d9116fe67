"""The send link: a gateway's sends batched on one stream per broker, each still checked as
the SendMessage it is (producer, size, token), refusals answered per send, a broker
without the link served by unary calls, and the real client through a gateway."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from ballast.config import TlsSettings, parse_config
from ballast.gateway.brokers import BrokerLinks
from ballast.gateway.gateway import Gateway
from ballast.metadata.etcd import EtcdStore
from ballast.wire.auth import Permission
from ballast.wire.link import (
    ACK_LINK_METHOD,
    LINK_METHOD,
    TCP_PREAMBLE,
    LinkFrameError,
    SendLink,
    decode_records,
    encode_record,
    request_body,
)
from ballast.wire.protocol import pb, pb_grpc
from ballast.wire.security import channel_credentials, client_ssl_context
from tests.server.certs import make_pki
from tests.server.helpers import DataBroker, DataCluster, data_config, new_client
from tests.server.test_hostile import raw_producer
from tests.server.test_security import secured_config, token

pytestmark = pytest.mark.timeout(60)

TOPIC = "/default/linked"


def test_frames_carry_records_and_refuse_a_cut_one() -> None:
    frame = encode_record(1, b"abc") + encode_record(2**40, b"") + encode_record(7, b"x" * 300)
    assert [(i, bytes(b)) for i, b in decode_records(frame)] == [
        (1, b"abc"),
        (2**40, b""),
        (7, b"x" * 300),
    ]
    with pytest.raises(LinkFrameError, match="announced"):
        decode_records(frame[:-1])
    with pytest.raises(LinkFrameError, match="cut short"):
        decode_records(frame + b"\x01\x02")


def accepted(broker: DataBroker) -> float:
    registry = broker.host.counters.registry
    return registry.get_sample_value("ballast_dataplane_messages_in_total") or 0.0


def message(producer_id: int, payload: bytes, topic: str = TOPIC) -> bytes:
    msg_id = pb.MsgID(producer_id=producer_id, topic_name=topic)
    return bytes(pb.StreamMessage(request_id=1, msg_id=msg_id, payload=payload).SerializeToString())


@pytest.fixture
async def broker(etcd_store: EtcdStore, tmp_path: Path) -> AsyncIterator[DataBroker]:
    config = data_config(tmp_path, data_plane={"max_message_bytes": 64 * 1024})
    async with DataCluster(etcd_store, config) as cluster:
        yield await cluster.start_broker("l1")


@pytest.mark.parametrize("tcp", [False, True], ids=["grpc_stream", "tcp"])
async def test_linked_sends_are_batched_and_each_answered_as_a_send(
    broker: DataBroker, tcp: bool
) -> None:
    async with grpc.aio.insecure_channel(broker.url) as channel:
        producer = await raw_producer(channel, TOPIC, pb.Reliable)
        link = SendLink(channel, broker.url, tcp=tcp)
        try:
            good = [link.send(message(producer, b"m%d" % i), None, 10) for i in range(40)]
            replies = await asyncio.gather(*good)
            assert all(pb.MessageResponse.FromString(r).request_id == 1 for r in replies)
            assert link.sends == 40 and link.frames < 40, "concurrent sends share frames"
            assert link.transport == ("tcp" if tcp else "grpc")

            # Refusals come back per send, with the code and words of a direct call, and
            # the link goes on serving.
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await link.send(message(999_999, b"x"), None, 10)
            assert unknown.value.code() is grpc.StatusCode.UNAVAILABLE
            assert "not registered" in (unknown.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as large:
                await link.send(message(producer, b"x" * (65 * 1024)), None, 10)
            assert large.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "max_message_bytes" in (large.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as garbage:
                await link.send(b"\xff\xff\xff", None, 10)
            assert garbage.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "malformed" in (garbage.value.details() or "")
            await link.send(message(producer, b"after"), None, 10)
        finally:
            await link.close()
    counters = broker.host.counters
    assert counters.rejected_count("SendMessage", "unknown_producer") == 1
    assert counters.rejected_count("SendMessage", "message_too_large") == 1
    assert counters.rejected_count("SendMessage", "malformed_request") == 1
    assert accepted(broker) == 41


async def test_a_malformed_frame_ends_the_link_with_invalid_argument(broker: DataBroker) -> None:
    async with grpc.aio.insecure_channel(broker.url) as channel:
        call = channel.stream_stream(LINK_METHOD)()
        await call.write(encode_record(1, request_body(None, b""))[:-1] + b"\x00" * 20)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            async for _ in call:
                pass
    assert ended.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed frame" in (ended.value.details() or "")
    assert broker.host.counters.rejected_count("SendMessages", "malformed_request") == 1


@pytest.mark.parametrize("tcp", [False, True], ids=["grpc_stream", "tcp"])
async def test_each_linked_send_is_checked_against_its_own_token(
    etcd_store: EtcdStore, tmp_path: Path, tcp: bool
) -> None:
    pki = make_pki(tmp_path / "pki")
    config = secured_config(tmp_path / "data", pki, mtls=True)
    gateway_tls = TlsSettings(
        enabled=True,
        cert_file=str(pki.client_cert),
        key_file=str(pki.client_key),
        ca_file=str(pki.ca),
    )
    producer_token = token({"default": [Permission.PRODUCE]})
    reader_token = token({"default": [Permission.CONSUME]})
    async with DataCluster(etcd_store, config) as cluster:
        broker = await cluster.start_broker("s1")
        credentials = channel_credentials(gateway_tls)
        async with grpc.aio.secure_channel(broker.url, credentials) as channel:
            create = channel.unary_unary("/danube.ProducerService/CreateProducer")
            request = pb.ProducerRequest(
                request_id=1, producer_name="p", topic_name=TOPIC, dispatch_strategy=1
            ).SerializeToString()
            auth = (("authorization", f"Bearer {producer_token}"),)
            for _ in range(100):  # the topic gets placed
                try:
                    created = await create(request, metadata=auth, timeout=10)
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() is grpc.StatusCode.UNAVAILABLE, exc.details()
                    await asyncio.sleep(0.1)
            producer = pb.ProducerResponse.FromString(created).producer_id
            link = SendLink(
                channel, broker.url, tcp=tcp, ssl_context=client_ssl_context(gateway_tls)
            )
            try:
                await link.send(message(producer, b"ok"), producer_token, 10)
                assert link.transport == ("tcp" if tcp else "grpc")
                refusals: dict[str | None, Any] = {}
                for who in (reader_token, None, "forged"):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await link.send(message(producer, b"no"), who, 10)
                    refusals[who] = refused.value.code()
            finally:
                await link.close()
    assert refusals == {
        reader_token: grpc.StatusCode.PERMISSION_DENIED,
        None: grpc.StatusCode.UNAUTHENTICATED,
        "forged": grpc.StatusCode.UNAUTHENTICATED,
    }


async def test_a_broker_without_the_link_gets_unary_calls() -> None:
    sent: list[bytes] = []

    async def send(request: bytes, context: Any) -> bytes:
        sent.append(request)
        return bytes(pb.MessageResponse(request_id=7).SerializeToString())

    handler = grpc.method_handlers_generic_handler(
        "danube.ProducerService", {"SendMessage": grpc.unary_unary_rpc_method_handler(send)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    url = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    links = BrokerLinks(None, batch_sends=True)
    try:
        for payload in (b"first", b"second"):
            reply = await links.call(
                url, "/danube.ProducerService/SendMessage", message(1, payload), [], 5
            )
            assert pb.MessageResponse.FromString(reply).request_id == 7
    finally:
        await links.close()
        await server.stop(0)
    assert [pb.StreamMessage.FromString(m).payload for m in sent] == [b"first", b"second"]


async def test_a_link_stream_ended_internal_before_any_answer_asks_why() -> None:
    """grpc may end a stream the broker rejects "Internal error from Core" instead of its
    UNIMPLEMENTED when a send was being written (seen in CI): the link asks again with an
    empty stream, learns the broker has no link, and the sends go as unary calls."""
    sent: list[bytes] = []
    opened = 0

    async def send(request: bytes, context: Any) -> bytes:
        sent.append(request)
        return bytes(pb.MessageResponse(request_id=7).SerializeToString())

    async def link(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        nonlocal opened
        opened += 1
        if opened == 1:
            await context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        yield b""  # an async generator (never reached)

    service, method = LINK_METHOD.rsplit("/", 1)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "danube.ProducerService",
                {"SendMessage": grpc.unary_unary_rpc_method_handler(send)},
            ),
            grpc.method_handlers_generic_handler(
                service.strip("/"), {method: grpc.stream_stream_rpc_method_handler(link)}
            ),
        )
    )
    url = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    links = BrokerLinks(None, batch_sends=True)
    try:
        reply = await links.call(
            url, "/danube.ProducerService/SendMessage", message(1, b"first"), [], 5
        )
        assert pb.MessageResponse.FromString(reply).request_id == 7
        link_of = links.link(url)
        assert link_of is not None and not link_of.supported
    finally:
        await links.close()
        await server.stop(0)
    assert opened == 2  # the stream, then the empty one that asked
    assert [pb.StreamMessage.FromString(m).payload for m in sent] == [b"first"]


async def _closed_without_answer(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        writer.write_eof()  # as a gateway that goes
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def test_a_tcp_link_connection_that_breaks_the_framing_is_closed_and_counted(
    broker: DataBroker,
) -> None:
    port = broker.server.link_port
    assert port, "a broker listens for links by default"
    counters = broker.host.counters
    assert await _closed_without_answer(port, b"GET / HTTP/1.1\r\n\r\n") == b""
    assert counters.rejected_count("SendMessages", "malformed_request") == 1
    oversized = TCP_PREAMBLE + b"S" + struct.pack("<I", 9 * 1024 * 1024)  # above 8 MiB
    assert await _closed_without_answer(port, oversized) == b""
    assert counters.rejected_count("SendMessages", "malformed_request") == 2
    cut = encode_record(1, request_body(None, b"x" * 10))[:-3]
    assert (
        await _closed_without_answer(port, TCP_PREAMBLE + b"A" + struct.pack("<I", len(cut)) + cut)
        == b""
    )
    assert counters.rejected_count("Acks", "malformed_request") == 1
    # A gateway that goes mid-frame is no malformed request.
    assert await _closed_without_answer(port, TCP_PREAMBLE + b"S" + struct.pack("<I", 99)) == b""
    assert counters.rejected_count("SendMessages", "malformed_request") == 2


async def test_a_link_goes_on_the_grpc_stream_when_the_tcp_port_cannot_be_reached(
    broker: DataBroker,
) -> None:
    assert broker.server.link is not None
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        broker.server.link.tcp_port = probe.getsockname()[1]
    async with grpc.aio.insecure_channel(broker.url) as channel:
        producer = await raw_producer(channel, TOPIC, pb.Reliable)
        link = SendLink(channel, broker.url, tcp=True)
        try:
            assert await link.send(message(producer, b"m"), None, 10)
            assert (link.transport, link.tcp) == ("grpc", False)
        finally:
            await link.close()
    assert accepted(broker) == 1


async def test_a_broker_without_a_link_port_gets_the_grpc_stream(
    etcd_store: EtcdStore, tmp_path: Path
) -> None:
    config = data_config(tmp_path, data_plane={"link_port": None})
    async with DataCluster(etcd_store, config) as cluster:
        broker = await cluster.start_broker("n1")
        assert broker.server.link_port == 0
        async with grpc.aio.insecure_channel(broker.url) as channel:
            producer = await raw_producer(channel, TOPIC, pb.Reliable)
            link = SendLink(channel, broker.url, tcp=True)
            try:
                assert await link.send(message(producer, b"m"), None, 10)
                assert link.transport == "grpc" and link.tcp, "nothing failed: none offered"
            finally:
                await link.close()


async def test_a_stopped_broker_ends_its_tcp_links_and_sends_fail_as_on_a_lost_connection(
    etcd_store: EtcdStore, tmp_path: Path
) -> None:
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    try:
        async with DataCluster(etcd_store, data_config(tmp_path)) as cluster:
            broker = await cluster.start_broker("t1")
            async with grpc.aio.insecure_channel(broker.url) as channel:
                producer = await raw_producer(channel, TOPIC, pb.Reliable)
                link = SendLink(channel, broker.url, tcp=True)
                try:
                    await link.send(message(producer, b"before"), None, 10)
                    assert link.transport == "tcp"
                    await cluster.stop_broker("t1")
                    with pytest.raises(grpc.aio.AioRpcError) as ended:
                        await link.send(message(producer, b"after"), None, 10)
                    assert ended.value.code() is grpc.StatusCode.UNAVAILABLE
                finally:
                    await link.close()
    finally:
        loop.set_exception_handler(None)
    # The link's connection ended quietly (no "Exception in callback" on the broker).
    assert not [c for c in unhandled if "link.py" in c.get("message", "")], unhandled


@pytest.mark.parametrize("batch_sends", [True, False])
async def test_the_client_through_a_gateway_sends_on_the_link_or_unary(
    etcd_store: EtcdStore, tmp_path: Path, batch_sends: bool
) -> None:
    config = data_config(tmp_path)
    gateway_config = parse_config({**config.model_dump(), "gateway": {"batch_sends": batch_sends}})
    async with (
        DataCluster(etcd_store, config) as cluster,
        Gateway(etcd_store, gateway_config, "127.0.0.1:0") as gateway,
    ):
        broker = await cluster.start_broker("g1")
        client = await new_client(gateway.advertise)
        producers = []
        for n in range(4):
            producer = client.new_producer().with_topic(TOPIC).with_name(f"p{n}").build()
            await producer.create()
            producers.append(producer)
        await asyncio.gather(*(p.send(b"%d" % i) for p in producers for i in range(25)))
        assert accepted(broker) == 100
        link = gateway.links.link(broker.url)
        if batch_sends:
            assert link is not None and link.sends == 100
            assert link.transport == "tcp", "on the broker's link port"
        else:
            assert link is None


@pytest.mark.parametrize("tcp", [False, True], ids=["grpc_stream", "tcp"])
async def test_acks_travel_on_their_own_link_and_move_the_cursor(
    broker: DataBroker, tcp: bool
) -> None:
    topic = "/default/acked"
    async with grpc.aio.insecure_channel(broker.url) as channel:
        producer = await raw_producer(channel, topic, pb.Reliable)
        sends = SendLink(channel, broker.url, tcp=tcp)
        consumers = pb_grpc.ConsumerServiceStub(channel)
        subscribed = await consumers.Subscribe(
            pb.ConsumerRequest(
                request_id=1,
                topic_name=topic,
                consumer_name="c",
                subscription="s",
                subscription_type=0,
            )
        )
        stream = consumers.ReceiveMessages(
            pb.ReceiveRequest(request_id=2, consumer_id=subscribed.consumer_id)
        )
        acks = SendLink(channel, broker.url, ACK_LINK_METHOD, tcp=tcp)
        try:
            for i in range(5):
                await sends.send(message(producer, b"m%d" % i, topic), None, 10)
            got = [await asyncio.wait_for(stream.read(), 10) for _ in range(5)]
            offsets = [m.msg_id.topic_offset for m in got]
            replies = await asyncio.gather(
                *(
                    acks.send(
                        pb.AckRequest(
                            request_id=10 + n, msg_id=m.msg_id, subscription_name="s"
                        ).SerializeToString(),
                        None,
                        10,
                    )
                    for n, m in enumerate(got)
                )
            )
            assert sorted(pb.AckResponse.FromString(r).request_id for r in replies) == [
                10, 11, 12, 13, 14
            ]  # fmt: skip
            assert acks.sends == 5 and sends.sends == 5, "each kind on its own link"
            assert acks.transport == sends.transport == ("tcp" if tcp else "grpc")
            dispatcher = broker.host.topics[topic].subscriptions["s"]
            assert dispatcher.cursor == max(offsets)

            # A malformed ack is refused alone, naming the call; the link goes on.
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await acks.send(b"\xff\xff\xff", None, 10)
            assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "Ack: malformed request" in (bad.value.details() or "")
            again = pb.AckRequest(request_id=20, msg_id=got[-1].msg_id, subscription_name="s")
            assert await acks.send(again.SerializeToString(), None, 10)
        finally:
            stream.cancel()
            await sends.close()
            await acks.close()


async def test_a_linked_send_the_broker_never_answers_ends_at_its_deadline() -> None:
    """A broker that reads the link and answers nothing: each send fails at its own
    deadline with DEADLINE_EXCEEDED, and a later send still gets its full time."""
    received: list[bytes] = []

    async def silent(frames: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for frame in frames:
            received.append(frame)
        yield b""  # never reached while the gateway keeps the link open

    service, method = LINK_METHOD.strip("/").split("/")
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(
            service, {method: grpc.stream_stream_rpc_method_handler(silent)}
        ),)
    )  # fmt: skip
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    link = SendLink(channel, f"127.0.0.1:{port}")
    try:
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(grpc.aio.AioRpcError) as first:
            await link.send(b"one", None, 0.3)
        assert first.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert 0.25 <= loop.time() - began < 2.0
        began = loop.time()
        with pytest.raises(grpc.aio.AioRpcError) as second:
            await link.send(b"two", None, 0.5)
        assert second.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert 0.45 <= loop.time() - began < 2.0
        assert len(received) == 2  # both went out on the one link
        assert not link._pending  # nothing kept of either
    finally:
        await link.close()
        await channel.close()
        await server.stop(0)


async def test_a_gateway_connects_its_links_to_a_broker_as_soon_as_it_registers(
    etcd_store: EtcdStore, tmp_path: Path
) -> None:
    """A move to a broker the gateway never used must not pay for connecting: its
    channel and its send and ack links are up before any call goes there."""
    config = data_config(tmp_path)
    async with (
        DataCluster(etcd_store, config) as cluster,
        Gateway(etcd_store, config, "127.0.0.1:0") as gateway,
    ):
        broker = await cluster.start_broker("w1")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while True:
            links = [gateway.links.link(broker.url, m) for m in (LINK_METHOD, ACK_LINK_METHOD)]
            if all(link is not None and link.transport == "tcp" for link in links):
                break
            assert loop.time() < deadline, f"links not connected: {links}"
            await asyncio.sleep(0.02)
        assert all(link is not None and link.sends == 0 for link in links)  # no call yet
        channel = gateway.links.channels[broker.url]
        assert channel.get_state() is grpc.ChannelConnectivity.READY
        # And they carry the first sends.
        client = await new_client(gateway.advertise)
        producer = client.new_producer().with_topic(TOPIC).with_name("first").build()
        await producer.create()
        await producer.send(b"one")
        send_link = gateway.links.link(broker.url)
        assert send_link is not None and send_link.sends == 1
