"""Wire compatibility with the client's descriptor, and bad input: a clear gRPC error
naming the problem, a counted rejection, and a broker that keeps serving."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from danube.proto import DanubeApi_pb2, DanubeApi_pb2_grpc
from google.protobuf import descriptor_pb2

from ballast.wire.protocol import served_descriptor
from tests.server.helpers import DataCluster, DispatchStrategy, SubType, new_client

pytestmark = pytest.mark.timeout(60)


def test_the_served_descriptor_is_the_clients() -> None:
    served, client = descriptor_pb2.FileDescriptorProto(), descriptor_pb2.FileDescriptorProto()
    served_descriptor().CopyToProto(served)
    DanubeApi_pb2.DESCRIPTOR.CopyToProto(client)
    assert served == client
    assert served.package == "danube"
    assert {s.name for s in served.service} == {
        "Discovery",
        "ProducerService",
        "ConsumerService",
        "HealthCheck",
    }


async def test_every_method_of_the_descriptor_is_served(cluster: DataCluster) -> None:
    """Each RPC path of the client's descriptor answers (never UNIMPLEMENTED)."""
    url = cluster.brokers["b1"].url
    async with grpc.aio.insecure_channel(url) as channel:
        for service in DanubeApi_pb2.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                request = method.input_type._concrete_class()
                if method.output_type.name == "StreamMessage":
                    call: Any = channel.unary_stream(path)(request.SerializeToString())
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        async for _ in call:
                            pass
                    code = err.value.code()
                else:
                    try:
                        await channel.unary_unary(path)(request.SerializeToString())
                        code = grpc.StatusCode.OK
                    except grpc.aio.AioRpcError as exc:
                        code = exc.code()
                assert code != grpc.StatusCode.UNIMPLEMENTED, path


async def _stubs(url: str) -> tuple[Any, Any, Any, Any]:
    channel = grpc.aio.insecure_channel(url)
    return (
        DanubeApi_pb2_grpc.DiscoveryStub(channel),
        DanubeApi_pb2_grpc.ProducerServiceStub(channel),
        DanubeApi_pb2_grpc.ConsumerServiceStub(channel),
        DanubeApi_pb2_grpc.HealthCheckStub(channel),
    )


async def _code(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


async def test_bad_input_gets_a_clear_error_and_the_broker_keeps_serving(
    cluster: DataCluster,
) -> None:
    broker = cluster.brokers["b1"]
    client = await new_client(broker.url)
    # Malformed topic, through the real client: INVALID_ARGUMENT naming the form.
    bad = client.new_producer().with_topic("/default/a/b").with_name("p").build()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await bad.create()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "/namespace/topic" in (err.value.details() or "")
    # A missing namespace: NOT_FOUND naming it and the command that creates it.
    nons = client.new_producer().with_topic("/nowhere/t").with_name("p").build()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await nons.create()
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "namespace 'nowhere'" in (err.value.details() or "")

    producer = (
        client.new_producer()
        .with_topic("/default/bad")
        .with_name("p")
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        .build()
    )
    await producer.create()
    # Oversized payload: INVALID_ARGUMENT with the size and the limit.
    limit = cluster.config.data_plane.max_message_bytes
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await producer.send(b"x" * (limit + 1))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(limit) in (err.value.details() or "")
    # A non-reliable producer on a reliable topic: FAILED_PRECONDITION.
    other = client.new_producer().with_topic("/default/bad").with_name("p2").build()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await other.create()
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "reliable" in (err.value.details() or "")

    _, producers, consumers, health = await _stubs(broker.url)
    # Unknown subscription type.
    code, details = await _code(
        consumers.Subscribe(
            DanubeApi_pb2.ConsumerRequest(
                topic_name="/default/bad", consumer_name="c", subscription="s", subscription_type=7
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "subscription_type" in details
    # A producer id used for another topic.
    producer_id = producer._producers[0].producer_id
    code, details = await _code(
        producers.SendMessage(
            DanubeApi_pb2.StreamMessage(
                request_id=1,
                msg_id=DanubeApi_pb2.MsgID(producer_id=producer_id, topic_name="/default/else"),
                payload=b"x",
            )
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "/default/bad" in details
    # An unknown producer id: UNAVAILABLE (the client re-looks-up), never NOT_FOUND.
    code, _ = await _code(
        producers.SendMessage(
            DanubeApi_pb2.StreamMessage(
                msg_id=DanubeApi_pb2.MsgID(producer_id=12345, topic_name="/default/bad")
            )
        )
    )
    assert code == grpc.StatusCode.UNAVAILABLE
    # Unknown health-check client type; unknown ids get CLOSE.
    code, details = await _code(health.HealthCheck(DanubeApi_pb2.HealthCheckRequest(client=5)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "client type" in details
    reply = await health.HealthCheck(DanubeApi_pb2.HealthCheckRequest(client=1, id=99))
    assert reply.status == DanubeApi_pb2.HealthCheckResponse.CLOSE
    # Unknown and duplicate acks are fine.
    for _ in range(2):
        await consumers.Ack(
            DanubeApi_pb2.AckRequest(
                msg_id=DanubeApi_pb2.MsgID(topic_name="/default/bad", topic_offset=42),
                subscription_name="nope",
            )
        )
    # Counted, and the broker still serves.
    counters = broker.host.counters
    assert counters.rejected_count("CreateProducer", "bad_topic") >= 1
    assert counters.rejected_count("SendMessage", "message_too_large") == 1
    assert counters.rejected_count("Subscribe", "bad_subscription_type") == 1
    assert counters.rejected_count("SendMessage", "producer_topic_mismatch") == 1
    consumer = (
        client.new_consumer()
        .with_topic("/default/bad")
        .with_consumer_name("c")
        .with_subscription("s")
        .with_subscription_type(SubType.EXCLUSIVE)
        .build()
    )
    await consumer.subscribe()
    queue = await consumer.receive()
    await producer.send(b"still fine")
    message = await queue.get()
    assert message.payload == b"still fine"
    await consumer.close()
    await producer.close()


async def test_lookup_of_an_unknown_topic_is_not_found(cluster: DataCluster) -> None:
    discovery, *_ = await _stubs(cluster.brokers["b1"].url)
    code, details = await _code(
        discovery.TopicLookup(DanubeApi_pb2.TopicLookupRequest(topic="/default/none"))
    )
    assert code == grpc.StatusCode.NOT_FOUND and "/default/none" in details
    code, _ = await _code(discovery.TopicLookup(DanubeApi_pb2.TopicLookupRequest(topic="bad")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    reply = await discovery.TopicPartitions(DanubeApi_pb2.TopicLookupRequest(topic="/default/x"))
    assert list(reply.partitions) == []
