"""The schema registry, schema-checked producers, nack delays and dead letters, with the
real `danube-client` (``client.schema()`` and the producer/consumer builders)."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import fastavro
import grpc
import pytest
from danube import CompatibilityMode, SchemaType
from google.protobuf import descriptor_pb2
from typer.testing import CliRunner

from ballast.broker.nack import ATTR_OFFSET, ATTR_REASON, ATTR_TOPIC
from ballast.cli.main import app
from ballast.gateway.gateway import Gateway
from ballast.metadata import keys
from ballast.metadata.etcd import EtcdStore
from tests.server.helpers import (
    DataCluster,
    DispatchStrategy,
    SubType,
    data_config,
    new_client,
    wait_until,
)

pytestmark = pytest.mark.timeout(90)

_open: list[Any] = []

USER_V1 = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
    "required": ["id"],
}
# Adds an optional property: backward and forward compatible.
USER_V2 = {**USER_V1, "properties": {**USER_V1["properties"], "email": {"type": "string"}}}
# Requires a new property: not backward compatible.
USER_V3 = {**USER_V2, "required": ["id", "email"]}


def js(doc: Any) -> bytes:
    return json.dumps(doc).encode()


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    while _open:
        await _open.pop().close()


async def producer(client: Any, topic: str, name: str = "p1", subject: str | None = None) -> Any:
    builder = (
        client.new_producer()
        .with_topic(topic)
        .with_name(name)
        .with_dispatch_strategy(DispatchStrategy.RELIABLE)
    )
    if subject is not None:
        builder = builder.with_schema_subject(subject)
    p = builder.build()
    await p.create()
    _open.append(p)
    return p


async def consumer(client: Any, topic: str, sub: str, name: str = "c1") -> tuple[Any, Any]:
    c = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name(name)
        .with_subscription(sub)
        .with_subscription_type(SubType.EXCLUSIVE)
        .build()
    )
    await c.subscribe()
    _open.append(c)
    return c, await c.receive()


async def test_register_get_list_versions_and_compatibility(cluster: DataCluster) -> None:
    client = await new_client(cluster.brokers["b1"].url)
    schema = client.schema()
    sid = (
        await schema.register_schema("users")
        .with_type(SchemaType.JSON_SCHEMA)
        .with_schema_data(js(USER_V1))
        .execute()
    )
    assert sid >= 1
    # The same definition again: the same version.
    again = (
        await schema.register_schema("users")
        .with_type(SchemaType.JSON_SCHEMA)
        .with_schema_data(js(USER_V1))
        .execute()
    )
    assert again == sid
    latest = await schema.get_latest_schema("users")
    assert (latest.schema_id, latest.version, latest.schema_type) == (sid, 1, "json_schema")
    assert latest.fingerprint.startswith("sha256:")
    # Backward (the default): an optional property is fine, a new required one is not.
    ok, errors = await schema.check_compatibility("users", js(USER_V3), SchemaType.JSON_SCHEMA)
    assert not ok and "required-added" in errors[0] and "email" in errors[0]
    await (
        schema.register_schema("users")
        .with_type(SchemaType.JSON_SCHEMA)
        .with_schema_data(js(USER_V2))
        .execute()
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await (
            schema.register_schema("users")
            .with_type(SchemaType.JSON_SCHEMA)
            .with_schema_data(js(USER_V3))
            .execute()
        )
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "compatibility-backward" in refused.value.details()
    assert "email" in refused.value.details()
    # Forward: the old reader (v2) reads what v3 writes (v3 only adds a requirement).
    assert await schema.set_compatibility_mode("users", CompatibilityMode.FORWARD) == (
        True,
        "subject 'users': compatibility forward",
    )
    await (
        schema.register_schema("users")
        .with_type(SchemaType.JSON_SCHEMA)
        .with_schema_data(js(USER_V3))
        .execute()
    )
    assert await schema.list_versions("users") == [1, 2, 3]
    v1 = await schema.get_schema_version(sid, 1)
    assert json.loads(v1.schema_definition) == USER_V1
    # Full: both ways; dropping "name" from the properties of a closed schema is not.
    await schema.set_compatibility_mode("users", CompatibilityMode.FULL)
    closed = {**USER_V3, "additionalProperties": False}
    ok, errors = await schema.check_compatibility("users", js(closed), SchemaType.JSON_SCHEMA)
    assert not ok and any(e.startswith("backward:") for e in errors)
    # None: anything goes, even another type.
    ok, _ = await schema.check_compatibility(
        "users", b'"string"', SchemaType.AVRO, CompatibilityMode.NONE
    )
    assert ok
    assert (await schema.delete_schema_version("users", 2))[0]
    assert await schema.list_versions("users") == [1, 3]
    with pytest.raises(grpc.aio.AioRpcError) as gone:
        await schema.get_schema_version(sid, 2)
    assert gone.value.code() is grpc.StatusCode.NOT_FOUND
    # Another subject gets another id.
    other = (
        await schema.register_schema("orders")
        .with_type(SchemaType.STRING)
        .with_schema_data(b"utf8")
        .execute()
    )
    assert other != sid


async def test_invalid_definitions_name_the_field_and_rule(cluster: DataCluster) -> None:
    schema = (await new_client(cluster.brokers["b1"].url)).schema()
    cases = [
        (SchemaType.JSON_SCHEMA, b'{"type": "objekt"}', "json-schema"),
        (SchemaType.JSON_SCHEMA, b"{not json", "json-syntax"),
        (
            SchemaType.AVRO,
            b'{"type": "record", "name": "U", "fields": [{"name": "a", "type": "nosuch"}]}',
            "avro-schema",
        ),
        (SchemaType.PROTOBUF, b"hello", "protobuf-descriptor"),
    ]
    for kind, data, rule in cases:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await schema.register_schema("bad").with_type(kind).with_schema_data(data).execute()
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "schema_definition" in refused.value.details()
        assert f"[{rule}" in refused.value.details()


async def test_avro_and_protobuf_evolution(cluster: DataCluster) -> None:
    schema = (await new_client(cluster.brokers["b1"].url)).schema()
    v1 = {"type": "record", "name": "U", "fields": [{"name": "id", "type": "long"}]}
    no_default = {**v1, "fields": [*v1["fields"], {"name": "e", "type": "string"}]}
    with_default = {**v1, "fields": [*v1["fields"], {"name": "e", "type": "string", "default": ""}]}
    await (
        schema.register_schema("u-avro")
        .with_type(SchemaType.AVRO)
        .with_schema_data(js(v1))
        .execute()
    )
    ok, errors = await schema.check_compatibility("u-avro", js(no_default), SchemaType.AVRO)
    assert not ok and "field-without-default" in errors[0]
    await schema.set_compatibility_mode("u-avro", CompatibilityMode.FULL)
    ok, errors = await schema.check_compatibility("u-avro", js(with_default), SchemaType.AVRO)
    assert ok, errors

    def proto(field_type: int) -> bytes:
        fd = descriptor_pb2.FileDescriptorProto(name="u.proto", package="t", syntax="proto3")
        m = fd.message_type.add(name="User")
        m.field.add(name="id", number=1, type=3, label=1)
        m.field.add(name="name", number=2, type=field_type, label=1)
        return fd.SerializeToString()

    await (
        schema.register_schema("u-proto")
        .with_type(SchemaType.PROTOBUF)
        .with_schema_data(proto(9))
        .execute()
    )
    ok, errors = await schema.check_compatibility("u-proto", proto(5), SchemaType.PROTOBUF)
    assert not ok and "field-type-changed" in errors[0]


async def test_enforce_refuses_invalid_sends_and_stamps_deliveries(cluster: DataCluster) -> None:
    client = await new_client(cluster.brokers["b1"].url)
    schema = client.schema()
    sid = (
        await schema.register_schema("users")
        .with_type(SchemaType.JSON_SCHEMA)
        .with_schema_data(js(USER_V1))
        .execute()
    )
    topic = "/default/users"
    assert (await schema.configure_topic_schema(topic, "users", "enforce"))[0]
    config = await schema.get_topic_schema_config(topic)
    assert (config.schema_subject, config.validation_policy, config.schema_id) == (
        "users",
        "enforce",
        sid,
    )
    p = await producer(client, topic, subject="users")
    _, queue = await consumer(client, topic, "s1")
    await p.send(js({"id": 1, "name": "a"}))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await p.send(js({"id": "one"}))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details()
    assert "'users' version 1" in details and "'one' is not of type 'integer'" in details
    await p.send(js({"id": 2}))
    got = [await asyncio.wait_for(queue.get(), 10) for _ in range(2)]
    assert [json.loads(m.payload)["id"] for m in got] == [1, 2]  # nothing stored for the bad one
    assert all((m.schema_id, m.schema_version) == (sid, 1) for m in got)
    assert [m.msg_id.topic_offset for m in got] == [0, 1]
    # A producer of another subject is refused at creation.
    await (
        schema.register_schema("other")
        .with_type(SchemaType.STRING)
        .with_schema_data(b"s")
        .execute()
    )
    with pytest.raises(grpc.aio.AioRpcError) as mismatch:
        await producer(client, topic, name="p2", subject="other")
    assert mismatch.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    # Warn: stored, counted.
    assert (await schema.update_topic_validation_policy(topic, "warn"))[0]
    served = cluster.brokers["b1"].host.topics[topic]
    # (The broker that took the change forgets its cached binding at once.)
    await p.send(js({"id": "three"}))
    extra = await asyncio.wait_for(queue.get(), 10)
    assert json.loads(extra.payload) == {"id": "three"} and served.msgs_in == 3
    counters = cluster.brokers["b1"].host.counters
    warned = counters.registry.get_sample_value(
        "ballast_dataplane_schema_checks_total", {"policy": "warn", "outcome": "invalid"}
    )
    assert warned == 1


async def test_schema_survives_a_move_and_the_gateway_forwards(
    etcd_store: EtcdStore, tmp_path: Path
) -> None:
    config = data_config(tmp_path)
    async with (
        DataCluster(etcd_store, config) as c,
        Gateway(etcd_store, config, "127.0.0.1:0") as gateway,
    ):
        b1 = await c.start_broker("b1")
        client = await new_client(gateway.advertise)
        schema = client.schema()
        await (
            schema.register_schema("users")
            .with_type(SchemaType.JSON_SCHEMA)
            .with_schema_data(js(USER_V1))
            .execute()
        )
        topic = "/default/moving"
        await schema.configure_topic_schema(topic, "users", "enforce")
        p = await producer(client, topic, subject="users")
        await p.send(js({"id": 1}))
        owner = await c.wait_served(topic)
        assert owner is b1
        await c.start_broker("b2")
        await c.stop_broker("b1")  # the topic moves to b2
        await c.wait_served(topic)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await p.send(js({"id": "x"}))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        await p.send(js({"id": 2}))
        assert c.owner(topic) is c.brokers["b2"]
        assert (await schema.get_latest_schema("users")).version == 1


async def test_avro_payloads_are_validated(cluster: DataCluster) -> None:
    client = await new_client(cluster.brokers["b1"].url)
    schema = client.schema()
    avro = {"type": "record", "name": "U", "fields": [{"name": "id", "type": "long"}]}
    await (
        schema.register_schema("avro-u")
        .with_type(SchemaType.AVRO)
        .with_schema_data(js(avro))
        .execute()
    )
    await schema.configure_topic_schema("/default/avro", "avro-u", "enforce")
    p = await producer(client, "/default/avro", subject="avro-u")
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(avro), {"id": 7})
    await p.send(out.getvalue())
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await p.send(b'{"id": "x"}')
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_nack_delay_then_dead_letter_across_a_move(
    etcd_store: EtcdStore, tmp_path: Path
) -> None:
    config = data_config(tmp_path, data_plane={"max_deliveries": 4})
    async with DataCluster(etcd_store, config) as c:
        await c.start_broker("b1")
        client = await new_client(c.brokers["b1"].url)
        topic = "/default/work"
        p = await producer(client, topic)
        cons, queue = await consumer(client, topic, "s1")
        await p.send(b"poison", {"k": "v"})
        first = await asyncio.wait_for(queue.get(), 10)
        nacked_at = time.monotonic()
        await cons.nack(first, delay_ms=400, reason="cannot parse")
        second = await asyncio.wait_for(queue.get(), 10)
        assert time.monotonic() - nacked_at >= 0.4  # never before the delay
        assert second.msg_id.topic_offset == first.msg_id.topic_offset
        counters = c.brokers["b1"].host.counters
        assert (
            counters.registry.get_sample_value(
                "ballast_dataplane_nacks_total", {"reason": "cannot parse"}
            )
            == 1
        )
        await cons.nack(second, delay_ms=0, reason="cannot parse")
        third = await asyncio.wait_for(queue.get(), 10)
        stored = await etcd_store.get(keys.subscription_redeliveries(topic, "s1"))
        assert stored is not None and stored.value["deliveries"] == {"0": 2}
        # The third delivery is nacked for 4 s, then the topic moves: the count (3) and the
        # delay go with it.
        nacked_at = time.monotonic()
        await cons.nack(third, delay_ms=4000, reason="try later")
        await c.start_broker("b2")
        await c.stop_broker("b1")
        await c.wait_served(topic)
        await cons.close()
        _open.remove(cons)
        client2 = await new_client(c.brokers["b2"].url)
        # Someone watches the dead letters (a new subscription starts at the latest).
        await producer(client2, f"{topic}-DLQ", name="creates-the-dlq")
        _, dlq_queue = await consumer(client2, f"{topic}-DLQ", "audit", name="c9")
        cons2, queue2 = await consumer(client2, topic, "s1")
        again = await asyncio.wait_for(queue2.get(), 15)
        assert time.monotonic() - nacked_at >= 4.0  # the delay outlived the move
        assert again.msg_id.topic_offset == 0
        await cons2.nack(again, reason="still broken")  # the fourth delivery: dead letters
        dead = await asyncio.wait_for(dlq_queue.get(), 15)
        assert dead.payload == b"poison"
        assert dead.attributes[ATTR_TOPIC] == topic
        assert dead.attributes[ATTR_OFFSET] == "0"
        assert dead.attributes[ATTR_REASON] == "still broken"
        assert dead.attributes["x-dlq-deliveries"] == "4"
        assert dead.attributes["k"] == "v"
        served = c.brokers["b2"].host.topics[topic]

        async def acked() -> bool:
            return served.subscriptions["s1"].cursor == 0

        await wait_until(acked, 5, "the dead-lettered message to be acked on s1")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(queue2.get(), 0.5)


async def cli(*args: str, ok: bool = True) -> Any:
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args))
    if ok:
        assert result.exit_code == 0, result.output
        return json.loads(result.output) if "--json" in args else result.output
    assert result.exit_code != 0
    return result.output


async def test_cli_schemas_topics_and_produce(
    cluster: DataCluster, etcd_server: Any, tmp_path: Path
) -> None:
    etcd = ("--etcd", etcd_server.client_url)
    v1, v3 = tmp_path / "v1.json", tmp_path / "v3.json"
    v1.write_bytes(js(USER_V1))
    v3.write_bytes(js(USER_V3))
    reg = await cli("admin", "schemas", "register", "users", "--file", str(v1), *etcd, "--json")
    assert (reg["version"], reg["is_new_version"], reg["schema_type"]) == (1, True, "json_schema")
    assert "[json-schema" in await cli(
        "admin", "schemas", "register", "bad", "--schema", '{"type": 5}', *etcd, ok=False
    )
    check = await cli("admin", "schemas", "compatibility", "users", "--check", str(v3), *etcd,
                      "--json", ok=False)  # fmt: skip
    assert "required-added" in check
    assert "FAILED" not in check
    assert (await cli("admin", "schemas", "compatibility", "users", "--set", "none", *etcd,
                      "--json"))["compatibility"] == "none"  # fmt: skip
    await cli("admin", "schemas", "register", "users", "--file", str(v3), *etcd)
    assert [v["version"] for v in await cli("admin", "schemas", "versions", "users", *etcd,
                                            "--json")] == [1, 2]  # fmt: skip
    got = await cli("admin", "schemas", "get", "users", "--version", "1", *etcd, "--json")
    assert json.loads(got["definition"]) == USER_V1
    listed = await cli("admin", "schemas", "list", *etcd, "--json")
    assert [(r["subject"], r["versions"]) for r in listed] == [("users", [1, 2])]
    await cli("admin", "schemas", "delete", "users", "--version", "2", *etcd)
    bound = await cli("admin", "topics", "set-schema", "/default/cli", "--subject", "users",
                      "--policy", "enforce", *etcd, "--json")  # fmt: skip
    assert bound["validation_policy"] == "enforce"
    shown = await cli("admin", "topics", "schema", "/default/cli", *etcd, "--json")
    assert (shown["subject"], shown["schema_id"]) == ("users", reg["schema_id"])
    url = cluster.brokers["b1"].url
    good = await cli("produce", "--topic", "/default/cli", "--reliable", "--count", "3",
                     "--schema-subject", "users", "--payload", '{"id": {i}}',
                     "--service-url", url, "--json")  # fmt: skip
    assert good["sent"] == 3 and good["failed"] == 0
    bad = await cli("produce", "--topic", "/default/cli", "--reliable", "--count", "1",
                    "--schema-subject", "users", "--payload", '{"id": "x"}',
                    "--service-url", url, "--json", ok=False)  # fmt: skip
    assert "INVALID_ARGUMENT" in bad and "version 1" in bad


async def test_namespace_dead_letter_policy(cluster: DataCluster, etcd_server: Any) -> None:
    etcd = ("--etcd", etcd_server.client_url)
    set_ = await cli("admin", "namespaces", "dead-letter", "default", "--max-deliveries", "1",
                     "--topic", "/default/graveyard", *etcd, "--json")  # fmt: skip
    assert set_["policy"] == {"max_deliveries": 1, "dead_letter_topic": "/default/graveyard"}
    client = await new_client(cluster.brokers["b1"].url)
    p = await producer(client, "/default/jobs")
    await producer(client, "/default/graveyard", name="creates-it")
    _, graves = await consumer(client, "/default/graveyard", "g", name="g1")
    cons, queue = await consumer(client, "/default/jobs", "s")
    await p.send(b"job-1")
    msg = await asyncio.wait_for(queue.get(), 10)
    await cons.nack(msg, reason="first and last")
    dead = await asyncio.wait_for(graves.get(), 10)
    assert (dead.payload, dead.attributes[ATTR_REASON]) == (b"job-1", "first and last")
    assert dead.attributes["x-dlq-deliveries"] == "1"
    cleared = await cli("admin", "namespaces", "dead-letter", "default", "--clear", *etcd,
                        "--json")  # fmt: skip
    assert cleared["policy"] is None


async def test_ids_and_versions_are_unique_under_concurrent_registrations(
    etcd_store: EtcdStore,
) -> None:
    from ballast.clock import SystemClock
    from ballast.registry.service import SchemaStore

    brokers = [SchemaStore(etcd_store, SystemClock()) for _ in range(3)]  # three brokers
    subjects = [f"s{i}" for i in range(12)]
    created = await asyncio.gather(
        *(brokers[i % 3].register(s, "string", b"x") for i, s in enumerate(subjects))
    )
    assert sorted(v.schema_id for v, _ in created) == list(range(1, 13))
    await brokers[0].set_mode("s0", "none")
    versions = await asyncio.gather(
        *(brokers[i % 3].register("s0", "string", f"v{i}".encode()) for i in range(6))
    )
    assert sorted(v.version for v, _ in versions) == [2, 3, 4, 5, 6, 7]
    assert {v.schema_id for v, _ in versions} == {created[0][0].schema_id}


async def test_dispatcher_holds_an_offset_for_a_delay_that_outlived_a_move() -> None:
    from ballast.broker.dispatch import Delivery, SubscriptionDispatcher

    d = SubscriptionDispatcher("s", "exclusive", window=10, reliable=True, buffer=100)
    d.hold(1, 0.2)  # before the reader offers it
    d.offer(Delivery(0, None, "k", 1))
    d.offer(Delivery(1, None, "k", 1))
    d.offer(Delivery(2, None, "k", 1))
    d.hold(2, 0.2)  # after: taken out of the queue
    assert d.waiting == 1  # offset 0 only
    await asyncio.sleep(0.3)
    assert d.waiting == 3
    assert d.cursor == -1  # held offsets were never acked


async def test_pinned_and_minimum_versions(cluster: DataCluster) -> None:
    client = await new_client(cluster.brokers["b1"].url)
    schema = client.schema()
    for doc in (USER_V1, USER_V2):
        await (
            schema.register_schema("users")
            .with_type(SchemaType.JSON_SCHEMA)
            .with_schema_data(js(doc))
            .execute()
        )
    topic = "/default/pinned"
    await schema.configure_topic_schema(topic, "users", "enforce")

    def builder(name: str) -> Any:
        return (
            client.new_producer()
            .with_topic(topic)
            .with_name(name)
            .with_dispatch_strategy(DispatchStrategy.RELIABLE)
        )

    pinned = builder("v1").with_schema_version("users", 1).build()
    await pinned.create()
    _open.append(pinned)
    latest = builder("v2").with_schema_min_version("users", 2).build()
    await latest.create()
    _open.append(latest)
    _, queue = await consumer(client, topic, "s")
    # Version 1 does not know "email"; version 2 wants a string there.
    await pinned.send(js({"id": 1, "email": 5}))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await latest.send(js({"id": 2, "email": 5}))
    assert "version 2" in refused.value.details()
    got = await asyncio.wait_for(queue.get(), 10)
    assert (got.schema_version, json.loads(got.payload)["id"]) == (1, 1)
    too_new = builder("v3").with_schema_min_version("users", 3).build()
    with pytest.raises(ValueError, match="does not meet minimum 3"):
        await too_new.create()
