"""Value types of the schema registry: schema types, modes, policies, versions, topic bindings.

Everything is a frozen dataclass with a JSON codec (`to_dict` / `from_dict`); names and
wire strings are Danube's (``danube_schema`` package of the client): schema types
``bytes``, ``string``, ``number``, ``avro``, ``json_schema``, ``protobuf``; compatibility
modes ``none``, ``backward``, ``forward``, ``full``; validation policies ``none``,
``warn``, ``enforce``.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = [
    "DEFAULT_COMPATIBILITY",
    "CompatibilityMode",
    "SchemaError",
    "SchemaType",
    "SchemaVersion",
    "SubjectInfo",
    "TopicSchemaConfig",
    "ValidationPolicy",
    "validate_subject",
]

_SUBJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")


class SchemaError(ValueError):
    """A refused schema, payload or setting: `field` and `rule` say what and why.

    The gRPC layer turns it into INVALID_ARGUMENT (`precondition` False) or
    FAILED_PRECONDITION (an incompatible version, a missing subject the request relies on).
    """

    def __init__(
        self, field_name: str, rule: str, message: str, *, precondition: bool = False
    ) -> None:
        super().__init__(f"{field_name}: [{rule}] {message}")
        self.field = field_name
        self.rule = rule
        self.detail = message
        self.precondition = precondition


def _choice(enum: type[StrEnum], value: object, field_name: str) -> Any:
    text = str(value).strip().lower()
    try:
        return enum(text)
    except ValueError:
        allowed = ", ".join(str(m.value) for m in enum)
        raise SchemaError(field_name, "unknown-value", f"{value!r}: use one of {allowed}") from None


class SchemaType(StrEnum):
    BYTES = "bytes"
    STRING = "string"
    NUMBER = "number"
    AVRO = "avro"
    JSON_SCHEMA = "json_schema"
    PROTOBUF = "protobuf"

    @classmethod
    def parse(cls, value: object, field_name: str = "schema_type") -> SchemaType:
        """The type named `value` (``jsonschema`` and ``proto`` as the client accepts)."""
        aliases = {"jsonschema": "json_schema", "json": "json_schema", "proto": "protobuf"}
        if isinstance(value, str):
            value = aliases.get(value.strip().lower(), value)
        parsed: SchemaType = _choice(cls, value, field_name)
        return parsed


class CompatibilityMode(StrEnum):
    NONE = "none"
    BACKWARD = "backward"
    FORWARD = "forward"
    FULL = "full"

    @classmethod
    def parse(cls, value: object, field_name: str = "compatibility_mode") -> CompatibilityMode:
        parsed: CompatibilityMode = _choice(cls, value, field_name)
        return parsed


class ValidationPolicy(StrEnum):
    NONE = "none"
    WARN = "warn"
    ENFORCE = "enforce"

    @classmethod
    def parse(cls, value: object, field_name: str = "validation_policy") -> ValidationPolicy:
        parsed: ValidationPolicy = _choice(cls, value, field_name)
        return parsed


# Danube's default: a new version must read what the previous one wrote.
DEFAULT_COMPATIBILITY = CompatibilityMode.BACKWARD


def validate_subject(subject: object, field_name: str = "subject") -> str:
    """A subject becomes one key segment: 1-128 letters, digits, '_', '.', '-'."""
    if not isinstance(subject, str) or _SUBJECT.fullmatch(subject) is None:
        raise SchemaError(
            field_name,
            "subject-name",
            f"{subject!r} must be 1-128 characters of letters, digits, '_', '.', '-' "
            "and start with a letter or digit",
        )
    return subject


@dataclass(frozen=True)
class SchemaVersion:
    """One registered version of a subject."""

    subject: str
    version: int
    schema_id: int  # the subject's cluster-wide id (Danube: one id per subject)
    schema_type: SchemaType
    definition: bytes
    fingerprint: str
    description: str = ""
    created_by: str = ""
    created_at: float = 0.0
    tags: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "version": self.version,
            "schema_id": self.schema_id,
            "schema_type": self.schema_type.value,
            "definition_b64": base64.b64encode(self.definition).decode(),
            "fingerprint": self.fingerprint,
            "description": self.description,
            "created_by": self.created_by,
            "created_at": self.created_at,
            "tags": list(self.tags),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SchemaVersion:
        try:
            return cls(
                subject=str(data["subject"]),
                version=int(data["version"]),
                schema_id=int(data["schema_id"]),
                schema_type=SchemaType.parse(data["schema_type"]),
                definition=base64.b64decode(data["definition_b64"]),
                fingerprint=str(data["fingerprint"]),
                description=str(data.get("description", "")),
                created_by=str(data.get("created_by", "")),
                created_at=float(data.get("created_at", 0.0)),
                tags=tuple(str(t) for t in data.get("tags", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError("record", "malformed", f"schema version record: {exc}") from None


@dataclass(frozen=True)
class SubjectInfo:
    """A subject: its id and compatibility mode."""

    subject: str
    schema_id: int
    compatibility: CompatibilityMode = DEFAULT_COMPATIBILITY
    created_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "schema_id": self.schema_id,
            "compatibility": self.compatibility.value,
            "created_at": self.created_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SubjectInfo:
        try:
            return cls(
                subject=str(data["subject"]),
                schema_id=int(data["schema_id"]),
                compatibility=CompatibilityMode.parse(data.get("compatibility", "backward")),
                created_at=float(data.get("created_at", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError("record", "malformed", f"subject record: {exc}") from None


@dataclass(frozen=True)
class TopicSchemaConfig:
    """A topic's binding to a subject and how strictly sends are checked."""

    subject: str
    policy: ValidationPolicy = ValidationPolicy.NONE
    payload_validation: bool = False  # the client's enable_payload_validation, as set
    updated_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "validation_policy": self.policy.value,
            "enable_payload_validation": self.payload_validation,
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TopicSchemaConfig:
        try:
            return cls(
                subject=str(data["subject"]),
                policy=ValidationPolicy.parse(data.get("validation_policy", "none")),
                payload_validation=bool(data.get("enable_payload_validation", False)),
                updated_at=float(data.get("updated_at", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError("record", "malformed", f"topic schema record: {exc}") from None
