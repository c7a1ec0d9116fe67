"""Compatibility of a new schema version with the subject's latest one.

Semantics (Danube's modes, with Confluent's definitions where Danube documents none):

- ``backward``: the new schema, as a *reader*, can read data written with the latest
  registered version (upgrade consumers first). Danube's default.
- ``forward``: the latest version, as a reader, can read data written with the new one
  (upgrade producers first).
- ``full``: both.
- ``none``: anything, including a change of schema type.

Checks are *non-transitive*: against the latest version only (Confluent's BACKWARD, not
BACKWARD_TRANSITIVE), which is what Danube's registry does. A change of schema type is
incompatible in every mode but ``none``.

Per type, "reader R can read data of writer W" means:

- Avro: the Avro specification's schema resolution (records match by full name or alias;
  a reader field missing from the writer needs a default; primitives follow the promotion
  rules; enums: every writer symbol is a reader symbol or the reader has a default;
  unions: every writer branch resolves to some reader branch; fixed: same size).
- JSON Schema: every document valid under W is valid under R, judged structurally: R may
  not require a property W does not require, may not narrow a property's ``type`` or
  ``enum``, may not close ``additionalProperties`` over properties W allows, may not
  tighten ``minimum``/``maximum``/``minLength``/``maxLength``/``minItems``/``maxItems``;
  nested objects and array items are compared the same way.
- Protobuf: wire compatibility by field number: a number present in both with another
  wire type (or a different message/enum type) is an error, and so is a ``required``
  field of R that W does not have; the payload message must keep its full name.
- string, number, bytes: compatible with themselves.

Errors read ``"<path>: [<rule>] <what>"``. Pure functions.
"""

from __future__ import annotations

from typing import Any

from ballast.schemas.definitions import ParsedSchema
from ballast.schemas.types import CompatibilityMode, SchemaType

__all__ = ["check_compatibility", "reader_errors"]


def check_compatibility(
    mode: CompatibilityMode, new: ParsedSchema, latest: ParsedSchema | None
) -> list[str]:
    """Why `new` may not follow `latest` under `mode` (empty: it may)."""
    if latest is None or mode is CompatibilityMode.NONE:
        return []
    errors: list[str] = []
    if mode in (CompatibilityMode.BACKWARD, CompatibilityMode.FULL):
        errors += [f"backward: {e}" for e in reader_errors(new, latest)]
    if mode in (CompatibilityMode.FORWARD, CompatibilityMode.FULL):
        errors += [f"forward: {e}" for e in reader_errors(latest, new)]
    return errors


def reader_errors(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    """Why data written with `writer` cannot be read with `reader`."""
    if reader.schema_type is not writer.schema_type:
        return [
            f"(root): [type-change] schema type {writer.schema_type.value} cannot become "
            f"{reader.schema_type.value}"
        ]
    kind = reader.schema_type
    if kind is SchemaType.AVRO:
        return _Avro(reader.parsed, writer.parsed).reads(reader.parsed, writer.parsed, "(root)")
    if kind is SchemaType.JSON_SCHEMA:
        return _json_reads(reader.parsed, writer.parsed, "(root)")
    if kind is SchemaType.PROTOBUF:
        return _proto_reads(reader.parsed, writer.parsed)
    return []


# -- Avro ---------------------------------------------------------------------------------

_PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "double": {"double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}
_NAMED = ("record", "enum", "fixed", "error")


def _collect_names(schema: Any, names: dict[str, Any]) -> None:
    if isinstance(schema, list):
        for branch in schema:
            _collect_names(branch, names)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in _NAMED and "name" in schema:
            if schema["name"] in names:
                return
            names[schema["name"]] = schema
        if kind in ("record", "error"):
            for f in schema.get("fields", ()):
                _collect_names(f.get("type"), names)
        elif kind == "array":
            _collect_names(schema.get("items"), names)
        elif kind == "map":
            _collect_names(schema.get("values"), names)
        elif isinstance(kind, dict | list):
            _collect_names(kind, names)


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


class _Avro:
    """Avro schema resolution between two parsed (fastavro) schemas."""

    def __init__(self, reader_root: Any, writer_root: Any) -> None:
        self.reader_names: dict[str, Any] = {}
        self.writer_names: dict[str, Any] = {}
        _collect_names(reader_root, self.reader_names)
        _collect_names(writer_root, self.writer_names)
        self._seen: set[tuple[str, str]] = set()

    def _resolve(self, schema: Any, names: dict[str, Any]) -> Any:
        while True:
            if isinstance(schema, str) and schema in names:
                schema = names[schema]
            elif isinstance(schema, dict) and isinstance(schema.get("type"), dict | list | str):
                inner = schema["type"]
                if (
                    isinstance(inner, str)
                    and inner not in _NAMED
                    and inner
                    not in (
                        "array",
                        "map",
                    )
                ):
                    schema = inner  # {"type": "int", "logicalType": ...}: its base type
                    continue
                if isinstance(inner, dict | list):
                    schema = inner
                    continue
                return schema
            else:
                return schema

    @staticmethod
    def _kind(schema: Any) -> str:
        if isinstance(schema, list):
            return "union"
        if isinstance(schema, dict):
            return str(schema.get("type"))
        return str(schema)

    def reads(self, reader: Any, writer: Any, path: str) -> list[str]:
        r = self._resolve(reader, self.reader_names)
        w = self._resolve(writer, self.writer_names)
        rk, wk = self._kind(r), self._kind(w)
        if wk == "union":
            errors: list[str] = []
            for branch in w:
                errors += self.reads(r, branch, path)
            return errors
        if rk == "union":
            for branch in r:
                if not self.reads(branch, w, path):
                    return []
            return [
                f"{path}: [union-branch] writer type {wk} matches no branch of the reader union"
            ]
        if rk in _PROMOTIONS or rk in ("null", "boolean"):
            if wk == rk or (wk in _PROMOTIONS and rk in _PROMOTIONS[wk]):
                return []
            return [f"{path}: [type-mismatch] {wk} cannot be read as {rk}"]
        if rk != wk and not (rk in ("record", "error") and wk in ("record", "error")):
            return [f"{path}: [type-mismatch] {wk} cannot be read as {rk}"]
        if rk in ("record", "error", "enum", "fixed"):
            rname, wname = str(r.get("name", "")), str(w.get("name", ""))
            aliases = {_short(a) for a in r.get("aliases", ())} | set(r.get("aliases", ()))
            if (
                _short(rname) != _short(wname)
                and wname not in aliases
                and (_short(wname) not in aliases)
            ):
                return [f"{path}: [name-mismatch] {rk} {wname} cannot be read as {rname}"]
        if rk == "array":
            return self.reads(r["items"], w["items"], f"{path}/items")
        if rk == "map":
            return self.reads(r["values"], w["values"], f"{path}/values")
        if rk == "fixed":
            if r.get("size") != w.get("size"):
                return [f"{path}: [fixed-size] size {w.get('size')} cannot become {r.get('size')}"]
            return []
        if rk == "enum":
            missing = [s for s in w.get("symbols", ()) if s not in r.get("symbols", ())]
            if missing and "default" not in r:
                return [
                    f"{path}: [enum-symbols] writer symbol(s) {', '.join(missing)} unknown to "
                    "the reader (and the reader enum has no default)"
                ]
            return []
        key = (str(r.get("name")), str(w.get("name")))
        if key in self._seen:  # a recursive record already being compared
            return []
        self._seen.add(key)
        errors = []
        writer_fields = {f["name"]: f for f in w.get("fields", ())}
        for f in r.get("fields", ()):
            match = writer_fields.get(f["name"])
            if match is None:
                for alias in f.get("aliases", ()):
                    match = writer_fields.get(alias)
                    if match is not None:
                        break
            where = f"{path}/{f['name']}"
            if match is None:
                if "default" not in f:
                    errors.append(
                        f"{where}: [field-without-default] reader field {f['name']!r} is not "
                        "in the writer's schema and has no default"
                    )
                continue
            errors += self.reads(f["type"], match["type"], where)
        return errors


# -- JSON Schema ----------------------------------------------------------------------------

_JSON_TYPES = {"null", "boolean", "object", "array", "number", "string", "integer"}


def _types(schema: Any) -> set[str]:
    if not isinstance(schema, dict) or "type" not in schema:
        return set(_JSON_TYPES)
    t = schema["type"]
    found = set(t) if isinstance(t, list) else {t}
    if "number" in found:
        found.add("integer")
    return found


def _json_reads(reader: Any, writer: Any, path: str) -> list[str]:
    if reader is True or reader == {}:
        return []
    if writer is False:
        return []
    if reader is False:
        return [f"{path}: [schema-false] the reader accepts nothing"]
    if not isinstance(reader, dict) or not isinstance(writer, dict):
        return []
    errors: list[str] = []
    narrowed = _types(writer) - _types(reader)
    if narrowed:
        errors.append(
            f"{path}: [type-narrowed] type(s) {', '.join(sorted(narrowed))} written but "
            "not accepted by the reader"
        )
    if "enum" in reader:
        allowed = reader["enum"]
        written = writer.get("enum")
        if written is None:
            errors.append(f"{path}: [enum-added] the reader restricts values to an enum")
        else:
            extra = [v for v in written if v not in allowed]
            if extra:
                errors.append(f"{path}: [enum-narrowed] value(s) {extra!r} no longer allowed")
    for key, tighter in (
        ("minimum", lambda r, w: w is None or r > w),
        ("exclusiveMinimum", lambda r, w: w is None or r > w),
        ("minLength", lambda r, w: w is None or r > w),
        ("minItems", lambda r, w: w is None or r > w),
        ("minProperties", lambda r, w: w is None or r > w),
        ("maximum", lambda r, w: w is None or r < w),
        ("exclusiveMaximum", lambda r, w: w is None or r < w),
        ("maxLength", lambda r, w: w is None or r < w),
        ("maxItems", lambda r, w: w is None or r < w),
        ("maxProperties", lambda r, w: w is None or r < w),
    ):
        if key in reader and isinstance(reader[key], int | float):
            w = writer.get(key)
            if tighter(reader[key], w if isinstance(w, int | float) else None):
                errors.append(f"{path}: [{key}-tightened] {key} {w} became {reader[key]}")
    if "pattern" in reader and reader.get("pattern") != writer.get("pattern"):
        errors.append(f"{path}: [pattern-changed] pattern {reader['pattern']!r} added or changed")
    required_before = set(writer.get("required", ()))
    for name in reader.get("required", ()):
        if name not in required_before:
            errors.append(
                f"{path}/{name}: [required-added] property {name!r} is required by the reader "
                "but optional (or absent) for the writer"
            )
    r_props: dict[str, Any] = reader.get("properties", {}) or {}
    w_props: dict[str, Any] = writer.get("properties", {}) or {}
    r_additional = reader.get("additionalProperties", True)
    w_additional = writer.get("additionalProperties", True)
    for name, w_schema in w_props.items():
        where = f"{path}/{name}"
        if name in r_props:
            errors += _json_reads(r_props[name], w_schema, where)
        elif r_additional is False:
            errors.append(
                f"{where}: [property-removed] property {name!r} is written but the reader "
                "has additionalProperties false"
            )
        elif isinstance(r_additional, dict):
            errors += _json_reads(r_additional, w_schema, where)
    if r_additional is False and w_additional is not False:
        errors.append(
            f"{path}: [additional-properties-closed] the reader sets additionalProperties "
            "false; the writer allows other properties"
        )
    if isinstance(reader.get("items"), dict) and isinstance(writer.get("items"), dict):
        errors += _json_reads(reader["items"], writer["items"], f"{path}/items")
    elif isinstance(reader.get("items"), dict) and "items" not in writer:
        errors += _json_reads(reader["items"], {}, f"{path}/items")
    return errors


# -- Protobuf ------------------------------------------------------------------------------

# FieldDescriptorProto.Type -> wire-compatible group (varint types interchange on the wire
# only within the same signedness family; Confluent treats these groups as compatible).
_WIRE_GROUP = {
    1: "fixed64",  # double
    2: "fixed32",  # float
    3: "varint",  # int64
    4: "varint",  # uint64
    5: "varint",  # int32
    6: "fixed64",  # fixed64
    7: "fixed32",  # fixed32
    8: "varint",  # bool
    9: "length",  # string
    10: "group",
    11: "message",
    12: "length",  # bytes
    13: "varint",  # uint32
    14: "enum",
    15: "fixed32",  # sfixed32
    16: "fixed64",  # sfixed64
    17: "zigzag32",  # sint32
    18: "zigzag64",  # sint64
}
_LABEL_REQUIRED = 2


def _proto_reads(reader: Any, writer: Any) -> list[str]:
    errors: list[str] = []
    if reader.root != writer.root:
        errors.append(
            f"(root): [message-renamed] payload message {writer.root} cannot become {reader.root}"
        )
        return errors
    for full, r_msg in sorted(reader.messages.items()):
        w_msg = writer.messages.get(full)
        if w_msg is None:
            continue
        w_fields = {f.number: f for f in w_msg.field}
        for f in r_msg.field:
            where = f"{full}.{f.name}"
            match = w_fields.get(f.number)
            if match is None:
                if f.label == _LABEL_REQUIRED:
                    errors.append(
                        f"{where}: [required-added] required field {f.number} is not written"
                    )
                continue
            r_group, w_group = _WIRE_GROUP.get(f.type), _WIRE_GROUP.get(match.type)
            if r_group != w_group:
                errors.append(
                    f"{where}: [field-type-changed] field {f.number} changed wire type "
                    f"({w_group} -> {r_group})"
                )
            elif r_group in ("message", "enum") and f.type_name.lstrip(".") != (
                match.type_name.lstrip(".")
            ):
                errors.append(
                    f"{where}: [field-type-changed] field {f.number} changed type "
                    f"{match.type_name.lstrip('.')} -> {f.type_name.lstrip('.')}"
                )
            if f.label == _LABEL_REQUIRED and match.label != _LABEL_REQUIRED:
                errors.append(f"{where}: [required-added] field {f.number} became required")
    return errors
