"""The schema registry's pure rules: definitions, payload validators, compatibility, and
the dead-letter decision. Plain calls on literal inputs."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest
from google.protobuf import descriptor_pb2

from ballast.broker.nack import DeadLetterPolicy, dead_letter_decision, policy_for
from ballast.config import DataPlaneConfig
from ballast.model import TopicName
from ballast.schemas import (
    CompatibilityMode,
    SchemaError,
    SchemaType,
    SchemaVersion,
    TopicSchemaConfig,
    ValidationPolicy,
    check_compatibility,
    compile_validator,
    parse_definition,
)

BACKWARD, FORWARD, FULL, NONE = (
    CompatibilityMode.BACKWARD,
    CompatibilityMode.FORWARD,
    CompatibilityMode.FULL,
    CompatibilityMode.NONE,
)


def jschema(doc: Any) -> Any:
    return parse_definition(SchemaType.JSON_SCHEMA, json.dumps(doc).encode())


def avro(doc: Any) -> Any:
    return parse_definition(SchemaType.AVRO, json.dumps(doc).encode())


def proto(fields: list[tuple[str, int, int, int]], name: str = "User") -> Any:
    fd = descriptor_pb2.FileDescriptorProto(name="u.proto", package="t", syntax="proto2")
    m = fd.message_type.add(name=name)
    for fname, number, ftype, label in fields:
        m.field.add(name=fname, number=number, type=ftype, label=label)
    return parse_definition(SchemaType.PROTOBUF, fd.SerializeToString())


OBJ = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}


def test_json_schema_rules() -> None:
    optional = {**OBJ, "properties": {**OBJ["properties"], "e": {"type": "string"}}}
    required = {**optional, "required": ["id", "e"]}
    assert check_compatibility(BACKWARD, jschema(optional), jschema(OBJ)) == []
    assert check_compatibility(FULL, jschema(optional), jschema(OBJ)) == []
    errors = check_compatibility(BACKWARD, jschema(required), jschema(optional))
    assert errors == [
        "backward: (root)/e: [required-added] property 'e' is required by the reader but "
        "optional (or absent) for the writer"
    ]
    assert check_compatibility(FORWARD, jschema(required), jschema(optional)) == []
    narrowed = {**OBJ, "properties": {"id": {"type": "integer", "maximum": 10}}}
    assert (
        "[maximum-tightened]" in check_compatibility(BACKWARD, jschema(narrowed), jschema(OBJ))[0]
    )
    string_id = {**OBJ, "properties": {"id": {"type": "string"}}}
    assert "[type-narrowed]" in check_compatibility(BACKWARD, jschema(string_id), jschema(OBJ))[0]
    assert check_compatibility(NONE, jschema(string_id), jschema(OBJ)) == []
    assert check_compatibility(BACKWARD, jschema(OBJ), None) == []


def test_type_change_is_incompatible_unless_none() -> None:
    s = parse_definition(SchemaType.STRING, b"")
    assert "[type-change]" in check_compatibility(FULL, s, jschema(OBJ))[0]
    assert check_compatibility(NONE, s, jschema(OBJ)) == []


def test_avro_resolution_rules() -> None:
    v1 = {"type": "record", "name": "U", "fields": [{"name": "id", "type": "int"}]}
    promoted = {"type": "record", "name": "U", "fields": [{"name": "id", "type": "long"}]}
    assert check_compatibility(BACKWARD, avro(promoted), avro(v1)) == []
    assert (
        "[type-mismatch] long cannot be read as int"
        in check_compatibility(FORWARD, avro(promoted), avro(v1))[0]
    )
    renamed = {**v1, "name": "V"}
    assert "[name-mismatch]" in check_compatibility(BACKWARD, avro(renamed), avro(v1))[0]
    enum1 = {"type": "enum", "name": "E", "symbols": ["A", "B"]}
    enum2 = {"type": "enum", "name": "E", "symbols": ["A"]}
    assert "[enum-symbols]" in check_compatibility(BACKWARD, avro(enum2), avro(enum1))[0]
    assert check_compatibility(FORWARD, avro(enum2), avro(enum1)) == []
    union = {"type": "record", "name": "U", "fields": [{"name": "id", "type": ["null", "int"]}]}
    assert check_compatibility(BACKWARD, avro(union), avro(v1)) == []


def test_protobuf_wire_rules() -> None:
    base = proto([("id", 1, 3, 1), ("name", 2, 9, 1)])
    retyped = proto([("id", 1, 3, 1), ("name", 2, 5, 1)])
    required = proto([("id", 1, 3, 1), ("name", 2, 9, 1), ("x", 3, 9, 2)])
    renamed = proto([("id", 1, 3, 1)], name="Person")
    assert "[field-type-changed]" in check_compatibility(BACKWARD, retyped, base)[0]
    assert "[required-added]" in check_compatibility(BACKWARD, required, base)[0]
    assert check_compatibility(FORWARD, required, base) == []
    assert "[message-renamed]" in check_compatibility(BACKWARD, renamed, base)[0]


@pytest.mark.parametrize(
    ("kind", "data", "rule"),
    [
        (SchemaType.JSON_SCHEMA, b"[1", "json-syntax"),
        (SchemaType.JSON_SCHEMA, b'{"minimum": "zero"}', "json-schema:type"),
        (SchemaType.JSON_SCHEMA, b"3", "json-schema"),
        (SchemaType.AVRO, b'{"type": "nosuch"}', "avro-schema"),
        (SchemaType.PROTOBUF, b"\x01\x02", "protobuf-descriptor"),
    ],
)
def test_invalid_definitions(kind: SchemaType, data: bytes, rule: str) -> None:
    with pytest.raises(SchemaError) as refused:
        parse_definition(kind, data)
    assert refused.value.field == "schema_definition"
    assert refused.value.rule == rule


def test_payload_validators() -> None:
    check = compile_validator(jschema(OBJ))
    assert check(b'{"id": 1}') is None
    assert check(b'{"id": "1"}') == "at id: '1' is not of type 'integer' (rule type)"
    assert check(b"{}") == "at (root): 'id' is a required property (rule required)"
    assert check(b"nope").startswith("payload is not JSON")
    schema = avro({"type": "record", "name": "U", "fields": [{"name": "id", "type": "long"}]})
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema.parsed, {"id": 3})
    assert compile_validator(schema)(out.getvalue()) is None
    assert compile_validator(schema)(b'{"id": 3}') is None  # a JSON datum
    assert compile_validator(schema)(b'{"id": "x"}') is not None
    p = proto([("id", 1, 3, 2)])
    assert compile_validator(p)(p.parsed.message_class(id=1).SerializeToString()) is None
    assert "required field(s) missing: id" in str(compile_validator(p)(b""))
    assert compile_validator(parse_definition(SchemaType.STRING, b""))(b"\xff") is not None
    assert compile_validator(parse_definition(SchemaType.NUMBER, b""))(b"1.5") is None
    assert compile_validator(parse_definition(SchemaType.NUMBER, b""))(b"true") is not None


def test_fingerprint_ignores_json_formatting() -> None:
    a = parse_definition(SchemaType.JSON_SCHEMA, b'{"type": "object", "required": []}')
    b = parse_definition(SchemaType.JSON_SCHEMA, b'{"required":[],"type":"object"}')
    assert a.fingerprint == b.fingerprint and a.fingerprint.startswith("sha256:")


def test_records_round_trip() -> None:
    v = SchemaVersion("s", 2, 7, SchemaType.AVRO, b"\x00{}", "sha256:x", tags=("a",))
    assert SchemaVersion.from_dict(v.to_dict()) == v
    c = TopicSchemaConfig("s", ValidationPolicy.ENFORCE, True, 1.0)
    assert TopicSchemaConfig.from_dict(c.to_dict()) == c
    with pytest.raises(SchemaError) as bad:
        ValidationPolicy.parse("strict")
    assert str(bad.value) == (
        "validation_policy: [unknown-value] 'strict': use one of none, warn, enforce"
    )


def test_dead_letter_decision_and_policy() -> None:
    topic = TopicName("shop", "orders")
    config = DataPlaneConfig(max_deliveries=3)
    policy = policy_for(topic, config, None)
    assert policy == DeadLetterPolicy(3, "/shop/orders-DLQ")
    assert [dead_letter_decision(n, policy, "/shop/orders") for n in (1, 2, 3, 4)] == [
        False,
        False,
        True,
        True,
    ]
    assert not dead_letter_decision(5, policy, "/shop/orders-DLQ")  # never into itself
    named = policy_for(topic, config, {"max_deliveries": 0, "dead_letter_topic": "/shop/bad"})
    assert named == DeadLetterPolicy(0, "/shop/bad")
    assert not dead_letter_decision(100, named, "/shop/orders")
    assert policy_for(topic, DataPlaneConfig(), {"max_deliveries": "x"}).max_deliveries == 0


def test_schema_calls_need_the_right_permission() -> None:
    from danube.proto import SchemaRegistry_pb2 as spb

    from ballast.config import AuthSettings
    from ballast.wire.auth import AuthError, AuthInterceptor, Permission, TokenAuthority

    authority = TokenAuthority(AuthSettings(mode="jwt", secret="s" * 32))
    check = AuthInterceptor(authority, lambda rpc, code: None)._check

    def token(perms: dict[str, list[Permission]]) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {authority.issue('t', perms)}")]

    producer = token({"shop": [Permission.PRODUCE]})
    shop_admin = token({"shop": [Permission.ADMIN]})
    root = token({"*": [Permission.ADMIN]})
    service = "/danube_schema.SchemaRegistry/"
    register = spb.RegisterSchemaRequest(subject="s")
    check(service + "RegisterSchema", register, producer)  # produce somewhere will do
    check(service + "GetLatestSchema", spb.GetLatestSchemaRequest(subject="s"), producer)
    with pytest.raises(AuthError) as refused:
        check(service + "RegisterSchema", register, token({"shop": [Permission.CONSUME]}))
    assert "lacks the 'produce' permission on every namespace" in refused.value.message
    configure = spb.ConfigureTopicSchemaRequest(topic_name="/shop/orders", schema_subject="s")
    check(service + "ConfigureTopicSchema", configure, shop_admin)
    with pytest.raises(AuthError):
        check(service + "ConfigureTopicSchema", configure, producer)
    mode = spb.SetCompatibilityModeRequest(subject="s", compatibility_mode="full")
    check(service + "SetCompatibilityMode", mode, root)
    with pytest.raises(AuthError) as denied:
        check(service + "SetCompatibilityMode", mode, shop_admin)
    assert "'admin' permission on namespace '*'" in denied.value.message
    with pytest.raises(AuthError):
        check(service + "GetSchema", spb.GetSchemaRequest(schema_id=1), [])


def test_schema_keys() -> None:
    from ballast.metadata import keys

    assert keys.schema_subject("users") == "/schemas/subjects/users/meta"
    assert keys.schema_version("users", 3) == "/schemas/subjects/users/versions/0000000003"
    assert keys.parse_schema_version_key(keys.schema_version("users", 3)) == ("users", 3)
    assert keys.parse_schema_subject_key(keys.schema_subject("users")) == "users"
    assert keys.schema_id(7) == "/schemas/ids/00000000000000000007"
    assert keys.topic_schema("/default/t") == "/topics/default/t/schema"
    assert keys.dead_letter_policy("shop") == "/policies/dead_letter/shop"
    for bad in (lambda: keys.schema_subject("a/b"), lambda: keys.schema_version("s", 0),
                lambda: keys.schema_id(0)):  # fmt: skip
        with pytest.raises(ValueError):
            bad()
    with pytest.raises(keys.KeyLayoutError):
        keys.parse_schema_version_key("/schemas/subjects/users/versions/3")
