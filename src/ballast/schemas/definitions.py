"""Schema definitions: parsed and checked by the format's own library, fingerprinted, and
compiled into payload validators.

- ``json_schema``: a JSON document checked against its metaschema by `jsonschema`
  (`$schema` picks the draft; Draft 2020-12 when absent); payloads are JSON documents,
  checked by `jsonschema_rs` when it takes the schema (the yes/no answer), and by
  `jsonschema` for the error of a refused payload (the authority: it has the last word).
- ``avro``: a schema parsed by `fastavro.parse_schema`; payloads are Avro binary datums
  (what `fastavro.schemaless_writer` writes) or, failing that, a JSON datum that
  `fastavro.validation.validate` accepts.
- ``protobuf``: a serialized ``FileDescriptorSet`` (``protoc --descriptor_set_out``, with
  ``--include_imports``) or a single ``FileDescriptorProto``, loaded into a fresh
  `DescriptorPool`; the payload's message is the first message of the last file (the one
  that imports the others); payloads must parse as that message.
- ``string``: UTF-8 text; ``number``: a JSON number as UTF-8 text; ``bytes``: anything.

Pure functions: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ballast.schemas.types import SchemaError, SchemaType

__all__ = [
    "ParsedSchema",
    "PayloadValidator",
    "compile_validator",
    "parse_definition",
]

# A validator returns None for a valid payload, else the first error (one line).
PayloadValidator = Callable[[bytes], str | None]


@dataclass(frozen=True)
class ParsedSchema:
    """A checked definition: its type, the parsed form and the fingerprint."""

    schema_type: SchemaType
    definition: bytes
    parsed: Any  # dict (JSON Schema), fastavro's parsed schema, or protobuf descriptors
    fingerprint: str


def _field_error(rule: str, message: str) -> SchemaError:
    return SchemaError("schema_definition", rule, message)


def parse_definition(schema_type: SchemaType, definition: bytes) -> ParsedSchema:
    """Check `definition` with the format's library; `SchemaError` names the rule broken."""
    if schema_type is SchemaType.JSON_SCHEMA:
        parsed: Any = _parse_json_schema(definition)
        canonical = json.dumps(parsed, sort_keys=True, separators=(",", ":")).encode()
    elif schema_type is SchemaType.AVRO:
        parsed = _parse_avro(definition)
        from fastavro.schema import to_parsing_canonical_form

        canonical = to_parsing_canonical_form(parsed).encode()
    elif schema_type is SchemaType.PROTOBUF:
        parsed = _parse_protobuf(definition)
        canonical = parsed.canonical
    else:
        parsed = None
        canonical = schema_type.value.encode() + b":" + definition
    return ParsedSchema(
        schema_type, definition, parsed, "sha256:" + hashlib.sha256(canonical).hexdigest()
    )


def _json_document(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _field_error("json-syntax", f"{what} is not valid JSON: {exc}") from None


def _parse_json_schema(definition: bytes) -> Any:
    from jsonschema import SchemaError as JsonSchemaError
    from jsonschema.validators import validator_for

    document = _json_document(definition, "the JSON Schema")
    if not isinstance(document, dict | bool):
        raise _field_error("json-schema", "a JSON Schema must be an object (or a boolean)")
    cls = validator_for(document)
    try:
        cls.check_schema(document)
    except JsonSchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise _field_error(f"json-schema:{exc.validator}", f"at {where}: {exc.message}") from None
    return document


def _parse_avro(definition: bytes) -> Any:
    from fastavro.schema import SchemaParseException, UnknownType, parse_schema

    document = _json_document(definition, "the Avro schema")
    try:
        return parse_schema(document, _write_hint=False)
    except (SchemaParseException, UnknownType) as exc:
        raise _field_error("avro-schema", str(exc)) from None
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise _field_error("avro-schema", f"not a valid Avro schema: {exc!r}") from None


@dataclass(frozen=True)
class ProtoSchema:
    """Protobuf descriptors of a definition, and the message payloads are checked against."""

    files: tuple[Any, ...]  # FileDescriptorProto
    messages: dict[str, Any]  # full name -> DescriptorProto
    root: str  # full name of the payload message
    canonical: bytes
    message_class: Any


def _parse_protobuf(definition: bytes) -> ProtoSchema:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from google.protobuf.message import DecodeError

    files: list[Any] = []
    file_set = descriptor_pb2.FileDescriptorSet()
    try:
        file_set.ParseFromString(definition)
        files = [f for f in file_set.file if f.name]
    except DecodeError:
        files = []
    if not files:
        single = descriptor_pb2.FileDescriptorProto()
        try:
            single.ParseFromString(definition)
        except DecodeError as exc:
            raise _field_error(
                "protobuf-descriptor",
                f"not a serialized FileDescriptorSet or FileDescriptorProto ({exc}); "
                "use protoc --descriptor_set_out=FILE --include_imports",
            ) from None
        if not single.name:
            raise _field_error(
                "protobuf-descriptor",
                "not a serialized FileDescriptorSet or FileDescriptorProto (no file name); "
                "use protoc --descriptor_set_out=FILE --include_imports",
            )
        files = [single]
    pool = descriptor_pool.DescriptorPool()
    try:
        for f in files:
            pool.Add(f)
        for f in files:
            pool.FindFileByName(f.name)
    except (TypeError, KeyError, ValueError) as exc:
        raise _field_error("protobuf-descriptor", f"descriptors do not load: {exc}") from None
    messages: dict[str, Any] = {}

    def collect(prefix: str, types: Any) -> None:
        for m in types:
            full = f"{prefix}.{m.name}" if prefix else m.name
            messages[full] = m
            collect(full, m.nested_type)

    for f in files:
        collect(f.package, f.message_type)
    last = files[-1]
    if not last.message_type:
        raise _field_error(
            "protobuf-message", f"file {last.name!r} declares no message to validate against"
        )
    root = (
        f"{last.package}.{last.message_type[0].name}"
        if last.package
        else (last.message_type[0].name)
    )
    message_class = message_factory.GetMessageClass(pool.FindMessageTypeByName(root))
    canonical = b"".join(f.SerializeToString(deterministic=True) for f in files)
    return ProtoSchema(tuple(files), messages, root, canonical, message_class)


# -- payload validators ---------------------------------------------------------------------


def compile_validator(schema: ParsedSchema) -> PayloadValidator:
    """A function checking one payload against `schema` (compiled once per version)."""
    kind = schema.schema_type
    if kind is SchemaType.JSON_SCHEMA:
        return _json_validator(schema.parsed)
    if kind is SchemaType.AVRO:
        return _avro_validator(schema.parsed)
    if kind is SchemaType.PROTOBUF:
        return _protobuf_validator(schema.parsed)
    if kind is SchemaType.STRING:
        return _string_validator
    if kind is SchemaType.NUMBER:
        return _number_validator
    return _any_payload


def _any_payload(payload: bytes) -> str | None:
    return None


def _string_validator(payload: bytes) -> str | None:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"payload is not UTF-8 text ({exc.reason} at byte {exc.start})"
    return None


def _number_validator(payload: bytes) -> str | None:
    try:
        value = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        value = None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "payload is not a number (expected a JSON number as UTF-8 text)"
    return None


def _local_refs_only(document: Any) -> bool:
    """Whether every ``$ref`` points inside the document (nothing to fetch)."""
    if isinstance(document, dict):
        ref = document.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            return False
        return all(_local_refs_only(v) for v in document.values())
    if isinstance(document, list):
        return all(_local_refs_only(v) for v in document)
    return True


def _fast_json(document: Any) -> Callable[[Any], bool] | None:
    """`jsonschema_rs` (Rust, ~100x faster) for the yes/no answer, when it compiles the
    schema and nothing is remote; `jsonschema` stays the authority and writes the errors."""
    if not _local_refs_only(document):
        return None
    try:
        import jsonschema_rs

        fast: Callable[[Any], bool] = jsonschema_rs.validator_for(document).is_valid
    except Exception:  # not installed, or a schema it does not take: the slow path only
        return None
    return fast


def _json_validator(document: Any) -> PayloadValidator:
    from jsonschema.validators import validator_for

    validator = validator_for(document)(document)
    is_valid = _fast_json(document) or validator.is_valid
    loads = json.loads

    def check(payload: bytes) -> str | None:
        try:
            instance = loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"payload is not JSON: {exc}"
        try:
            if is_valid(instance):
                return None
        except (ValueError, TypeError, OverflowError):
            pass  # e.g. a number too large for the fast validator: ask jsonschema
        error = next(iter(validator.iter_errors(instance)), None)
        if error is None:
            return None  # jsonschema decides
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return f"at {where}: {error.message} (rule {error.validator})"

    return check


def _avro_validator(parsed: Any) -> PayloadValidator:
    from fastavro import schemaless_reader
    from fastavro.validation import ValidationError, validate

    def check(payload: bytes) -> str | None:
        stream = io.BytesIO(payload)
        try:
            schemaless_reader(stream, parsed, None)
            if stream.tell() == len(payload):
                return None
            binary_error = f"{len(payload) - stream.tell()} bytes left after the Avro datum"
        except Exception as exc:  # fastavro raises many types on bad binary data
            binary_error = f"not an Avro binary datum ({type(exc).__name__}: {exc})"
        try:
            datum = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return binary_error
        try:
            validate(datum, parsed, raise_errors=True)
        except ValidationError as exc:
            text = " ".join(str(exc).replace('"', "").split()).strip("[] ")
            return f"JSON datum does not match the Avro schema: {text}"
        return None

    return check


def _protobuf_validator(schema: ProtoSchema) -> PayloadValidator:
    from google.protobuf.message import DecodeError

    cls = schema.message_class

    def check(payload: bytes) -> str | None:
        message = cls()
        try:
            message.ParseFromString(payload)
        except DecodeError as exc:
            return f"payload is not a {schema.root} message: {exc}"
        missing = message.FindInitializationErrors()
        if missing:
            return f"{schema.root}: required field(s) missing: {', '.join(missing)}"
        return None

    return check
