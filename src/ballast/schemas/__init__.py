"""The schema registry's pure logic: types, definitions and payload validators, and
compatibility between versions. No I/O: the registry service (`ballast.registry.service`)
stores and serves what these functions decide."""

from ballast.schemas.compat import check_compatibility, reader_errors
from ballast.schemas.definitions import (
    ParsedSchema,
    PayloadValidator,
    compile_validator,
    parse_definition,
)
from ballast.schemas.types import (
    DEFAULT_COMPATIBILITY,
    CompatibilityMode,
    SchemaError,
    SchemaType,
    SchemaVersion,
    SubjectInfo,
    TopicSchemaConfig,
    ValidationPolicy,
    validate_subject,
)

__all__ = [
    "DEFAULT_COMPATIBILITY",
    "CompatibilityMode",
    "ParsedSchema",
    "PayloadValidator",
    "SchemaError",
    "SchemaType",
    "SchemaVersion",
    "SubjectInfo",
    "TopicSchemaConfig",
    "ValidationPolicy",
    "check_compatibility",
    "compile_validator",
    "parse_definition",
    "reader_errors",
    "validate_subject",
]
