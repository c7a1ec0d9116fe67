"""The schema registry on every broker: Danube's ``danube_schema.SchemaRegistry`` service.

Everything lives in the metadata store (`ballast.metadata.keys`: ``/schemas/…`` and
``/topics/{ns}/{topic}/schema``), so any broker (and the gateway, which forwards the
service to any broker) answers the same, and topics keep their schema across moves.

- A subject gets one id, unique cluster-wide, when its first version is registered; the id
  comes from the counter ``/schemas/next_id``, advanced by compare-and-swap in the same
  transaction that creates the subject (two brokers racing get distinct ids: the loser's
  compare fails and it retries). As in Danube, the id names the subject and `version`
  names a version of it (`GetSchema(schema_id, version)`).
- A new version is written in a transaction that compares the subject record's
  mod_revision: two concurrent registrations cannot both pass the compatibility check
  against the same latest version. Version numbers are never reused (the subject record
  keeps the last one), even after a delete.
- Registering a definition already registered (same fingerprint) returns that version
  (`is_new_version` false).
- Errors: an invalid definition or argument is INVALID_ARGUMENT naming the field and the
  rule; an incompatible version, or a topic bound to an unknown subject, is
  FAILED_PRECONDITION listing the rules broken; an unknown subject/id/version NOT_FOUND.

Validation policies (a topic's binding): ``none`` checks nothing; ``warn`` validates every
payload and logs and counts (``ballast_dataplane_schema_checks``) the ones that fail, which
are stored; ``enforce`` refuses them with INVALID_ARGUMENT naming the subject, version and
first error, and stores nothing. Under warn and enforce the payload is always validated:
the client's ``enable_payload_validation`` flag is stored and reported, not needed. A send
is checked against the version it carries (`schema_version`, stamped by a producer built
with a schema reference), else the subject's latest, which is then stamped on it, so every
delivered message of a bound topic names its schema id and version. A message whose
`schema_id` is not the subject's is refused under enforce. Brokers cache a topic's binding
for two seconds (a change through another broker or the CLI applies within that).

`TopicSchemas` is the broker's cached view of topic bindings and compiled validators, used
by SendMessage (the policy check runs before the topic's publish) and CreateProducer.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from danube.proto import SchemaRegistry_pb2 as spb
from danube.proto import SchemaRegistry_pb2_grpc as spb_grpc

from ballast.clock import Clock
from ballast.metadata import Compare, MetadataStore, Put, keys
from ballast.metadata.store import Delete
from ballast.model import InvalidTopicName, TopicName
from ballast.schemas import (
    DEFAULT_COMPATIBILITY,
    CompatibilityMode,
    ParsedSchema,
    PayloadValidator,
    SchemaError,
    SchemaType,
    SchemaVersion,
    SubjectInfo,
    TopicSchemaConfig,
    ValidationPolicy,
    check_compatibility,
    compile_validator,
    parse_definition,
    validate_subject,
)
from ballast.wire.errors import RpcFailure, bad_input, not_served
from ballast.wire.rpc import rpc

__all__ = [
    "SCHEMA_SERVICE_PREFIX",
    "SchemaRegistryService",
    "SchemaStore",
    "TopicSchemas",
    "Verdict",
    "producer_schema_check",
    "send_check",
    "spb",
    "spb_grpc",
    "subject_rows",
    "topic_binding",
    "version_dict",
]

log = logging.getLogger(__name__)

SCHEMA_SERVICE_PREFIX = "/danube_schema.SchemaRegistry/"
_CAS_ATTEMPTS = 20
T = TypeVar("T")


def _not_found(message: str) -> RpcFailure:
    return RpcFailure(grpc.StatusCode.NOT_FOUND, message, "schema_not_found")


def _topic(value: str, field_name: str = "topic_name") -> TopicName:
    try:
        return TopicName.parse(value)
    except InvalidTopicName as exc:
        raise bad_input(f"{field_name}: {exc}", "bad_topic") from None


class SchemaStore:
    """Subjects, versions, ids and topic bindings in the metadata store."""

    def __init__(self, store: MetadataStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    # -- reading ---------------------------------------------------------------------------

    async def subject(self, subject: str) -> tuple[SubjectInfo, int, int] | None:
        """(record, its mod_revision, last version number) of a subject, or None."""
        validate_subject(subject)
        kv = await self.store.get(keys.schema_subject(subject))
        if kv is None:
            return None
        info = SubjectInfo.from_dict(kv.value)
        last = int(kv.value.get("last_version", 0)) if isinstance(kv.value, dict) else 0
        return info, kv.mod_revision, last

    async def versions(self, subject: str) -> list[SchemaVersion]:
        """Every live version of `subject`, oldest first."""
        validate_subject(subject)
        listing = await self.store.get_prefix(keys.schema_versions_prefix(subject))
        return [SchemaVersion.from_dict(kv.value) for kv in listing.items]

    async def version(self, subject: str, version: int) -> SchemaVersion | None:
        kv = await self.store.get(keys.schema_version(subject, version))
        return None if kv is None else SchemaVersion.from_dict(kv.value)

    async def latest(self, subject: str) -> SchemaVersion:
        """The newest version; NOT_FOUND names the subject."""
        found = await self.versions(subject)
        if not found:
            raise _not_found(f"subject {subject!r} has no registered schema (register one first)")
        return found[-1]

    async def by_id(self, schema_id: int, version: int | None) -> SchemaVersion:
        """A version of the subject with id `schema_id` (latest when `version` is None)."""
        if schema_id <= 0:
            raise bad_input("schema_id: [positive] must be >= 1", "schema_bad_id")
        kv = await self.store.get(keys.schema_id(schema_id))
        if kv is None or not isinstance(kv.value, dict):
            raise _not_found(f"schema id {schema_id} is not registered")
        subject = str(kv.value.get("subject"))
        if version is None:
            return await self.latest(subject)
        if version <= 0:
            raise bad_input("version: [positive] must be >= 1", "schema_bad_version")
        found = await self.version(subject, version)
        if found is None:
            raise _not_found(f"subject {subject!r} (id {schema_id}) has no version {version}")
        return found

    async def subjects(self) -> list[SubjectInfo]:
        """Every subject, sorted by name."""
        listing = await self.store.get_prefix(keys.SCHEMA_SUBJECTS_PREFIX)
        out = []
        for kv in listing.items:
            try:
                keys.parse_schema_subject_key(kv.key)
            except ValueError:
                continue
            out.append(SubjectInfo.from_dict(kv.value))
        return out

    # -- registering -------------------------------------------------------------------------

    async def register(
        self,
        subject: str,
        schema_type: str,
        definition: bytes,
        *,
        description: str = "",
        created_by: str = "",
        tags: tuple[str, ...] = (),
    ) -> tuple[SchemaVersion, bool]:
        """Register a version (or find the identical one); (version, is_new)."""
        validate_subject(subject)
        kind = SchemaType.parse(schema_type)
        if not definition:
            raise SchemaError("schema_definition", "required", "must not be empty")
        parsed = parse_definition(kind, definition)
        for _ in range(_CAS_ATTEMPTS):
            current = await self.subject(subject)
            now = self.clock.now()
            if current is None:
                created = await self._create_subject(subject, parsed, now, description,
                                                     created_by, tags)  # fmt: skip
                if created is not None:
                    return created, True
                continue
            info, revision, last = current
            existing = await self.versions(subject)
            for v in existing:
                if v.fingerprint == parsed.fingerprint and v.schema_type is kind:
                    return v, False
            latest = existing[-1] if existing else None
            errors = check_compatibility(
                info.compatibility, parsed, _parsed(latest) if latest else None
            )
            if errors:
                raise SchemaError(
                    "schema_definition",
                    f"compatibility-{info.compatibility.value}",
                    f"not {info.compatibility.value}-compatible with version "
                    f"{latest.version if latest else '?'} of {subject!r}: " + "; ".join(errors),
                    precondition=True,
                )
            record = SchemaVersion(
                subject,
                last + 1,
                info.schema_id,
                kind,
                definition,
                parsed.fingerprint,
                description,
                created_by,
                now,
                tags,
            )
            meta = {**info.to_dict(), "last_version": record.version}
            result = await self.store.txn(
                [Compare.mod_revision_equals(keys.schema_subject(subject), revision)],
                [
                    Put(keys.schema_subject(subject), meta),
                    Put(keys.schema_version(subject, record.version), record.to_dict()),
                ],
            )
            if result.succeeded:
                log.info("schema %s: registered version %d", subject, record.version)
                return record, True
        raise not_served(f"subject {subject!r}: too many concurrent registrations; retry")

    async def _create_subject(
        self,
        subject: str,
        parsed: ParsedSchema,
        now: float,
        description: str,
        created_by: str,
        tags: tuple[str, ...],
    ) -> SchemaVersion | None:
        counter = await self.store.get(keys.SCHEMA_ID_COUNTER)
        next_id = 1
        revision = 0
        if counter is not None:
            revision = counter.mod_revision
            if isinstance(counter.value, dict):
                next_id = max(1, int(counter.value.get("next", 1)))
        info = SubjectInfo(subject, next_id, DEFAULT_COMPATIBILITY, now)
        record = SchemaVersion(subject, 1, next_id, parsed.schema_type, parsed.definition,
                               parsed.fingerprint, description, created_by, now, tags)  # fmt: skip
        result = await self.store.txn(
            [
                Compare.mod_revision_equals(keys.SCHEMA_ID_COUNTER, revision),
                Compare.absent(keys.schema_subject(subject)),
            ],
            [
                Put(keys.SCHEMA_ID_COUNTER, {"next": next_id + 1}),
                Put(keys.schema_subject(subject), {**info.to_dict(), "last_version": 1}),
                Put(keys.schema_id(next_id), {"subject": subject}),
                Put(keys.schema_version(subject, 1), record.to_dict()),
            ],
        )
        if not result.succeeded:
            return None
        log.info("schema %s: created with id %d", subject, next_id)
        return record

    async def check(
        self, subject: str, schema_type: str, definition: bytes, mode: str | None
    ) -> list[str]:
        """Why `definition` could not be registered next (empty: it could)."""
        validate_subject(subject)
        parsed = parse_definition(SchemaType.parse(schema_type), definition)
        current = await self.subject(subject)
        if current is None:
            return []
        info = current[0]
        chosen = CompatibilityMode.parse(mode) if mode else info.compatibility
        existing = await self.versions(subject)
        latest = _parsed(existing[-1]) if existing else None
        return check_compatibility(chosen, parsed, latest)

    async def set_mode(self, subject: str, mode: str) -> CompatibilityMode:
        chosen = CompatibilityMode.parse(mode)
        for _ in range(_CAS_ATTEMPTS):
            current = await self.subject(subject)
            if current is None:
                raise _not_found(f"subject {subject!r} does not exist (register a schema first)")
            info, revision, last = current
            meta = {**info.to_dict(), "compatibility": chosen.value, "last_version": last}
            if await self.store.compare_and_swap(keys.schema_subject(subject), revision, meta):
                return chosen
        raise not_served(f"subject {subject!r}: too many concurrent changes; retry")

    async def delete_version(self, subject: str, version: int) -> None:
        validate_subject(subject)
        if version <= 0:
            raise bad_input("version: [positive] must be >= 1", "schema_bad_version")
        deleted = await self.store.txn(
            [Compare.present(keys.schema_version(subject, version))],
            [Delete(keys.schema_version(subject, version))],
        )
        if not deleted.succeeded:
            raise _not_found(f"subject {subject!r} has no version {version}")

    # -- topics ----------------------------------------------------------------------------

    async def topic_config(self, topic: TopicName) -> TopicSchemaConfig | None:
        kv = await self.store.get(keys.topic_schema(topic))
        return None if kv is None else TopicSchemaConfig.from_dict(kv.value)

    async def configure_topic(
        self, topic: TopicName, subject: str, policy: str, payload_validation: bool
    ) -> TopicSchemaConfig:
        validate_subject(subject, "schema_subject")
        chosen = ValidationPolicy.parse(policy or "none")
        if await self.subject(subject) is None:
            raise SchemaError(
                "schema_subject",
                "unknown-subject",
                f"{subject!r} has no registered schema (register one before binding a topic)",
                precondition=True,
            )
        config = TopicSchemaConfig(subject, chosen, payload_validation, self.clock.now())
        await self.store.put(keys.topic_schema(topic), config.to_dict())
        return config

    async def bind_if_unbound(self, topic: TopicName, subject: str) -> TopicSchemaConfig:
        """The first schema producer of an unbound topic binds it (policy none), as Danube."""
        config = TopicSchemaConfig(subject, ValidationPolicy.NONE, False, self.clock.now())
        if await self.store.create_if_absent(keys.topic_schema(topic), config.to_dict()):
            return config
        found = await self.topic_config(topic)
        return found if found is not None else config

    async def update_policy(
        self, topic: TopicName, policy: str, payload_validation: bool
    ) -> TopicSchemaConfig:
        chosen = ValidationPolicy.parse(policy)
        for _ in range(_CAS_ATTEMPTS):
            kv = await self.store.get(keys.topic_schema(topic))
            if kv is None:
                raise SchemaError(
                    "topic_name",
                    "no-schema",
                    f"topic {topic} has no schema subject (ConfigureTopicSchema first)",
                    precondition=True,
                )
            old = TopicSchemaConfig.from_dict(kv.value)
            config = TopicSchemaConfig(old.subject, chosen, payload_validation, self.clock.now())
            if await self.store.compare_and_swap(
                keys.topic_schema(topic), kv.mod_revision, config.to_dict()
            ):
                return config
        raise not_served(f"topic {topic}: too many concurrent changes; retry")


# -- admin views (the JSON of `ballast admin schemas … --json` and of the console's API) ----


def version_dict(v: SchemaVersion, *, definition: bool = False) -> dict[str, Any]:
    """A version as the admin tools show it; with `definition`, its text (or hex)."""
    out: dict[str, Any] = {
        "subject": v.subject,
        "schema_id": v.schema_id,
        "version": v.version,
        "schema_type": v.schema_type.value,
        "fingerprint": v.fingerprint,
        "description": v.description,
        "created_by": v.created_by,
        "created_at": v.created_at,
        "tags": list(v.tags),
    }
    if definition:
        try:
            out["definition"] = v.definition.decode()
        except UnicodeDecodeError:
            out["definition_hex"] = v.definition.hex()
    return out


async def subject_rows(schemas: SchemaStore) -> list[dict[str, Any]]:
    """Every subject with its id, compatibility mode, version numbers and latest type."""
    rows = []
    for info in await schemas.subjects():
        versions = await schemas.versions(info.subject)
        rows.append(
            {
                **info.to_dict(),
                "versions": [v.version for v in versions],
                "schema_type": versions[-1].schema_type.value if versions else None,
            }
        )
    return rows


async def topic_binding(schemas: SchemaStore, topic: TopicName) -> dict[str, Any] | None:
    """A topic's binding (subject, policy) with the subject's id, or None when unbound."""
    config = await schemas.topic_config(topic)
    if config is None:
        return None
    current = await schemas.subject(config.subject)
    return {
        "topic": str(topic),
        **config.to_dict(),
        "schema_id": current[0].schema_id if current is not None else None,
    }


@functools.lru_cache(maxsize=1024)
def _parsed_cached(kind: SchemaType, definition: bytes) -> ParsedSchema:
    return parse_definition(kind, definition)


def _parsed(version: SchemaVersion) -> ParsedSchema:
    return _parsed_cached(version.schema_type, version.definition)


@functools.lru_cache(maxsize=1024)
def _validator(kind: SchemaType, definition: bytes) -> PayloadValidator:
    return compile_validator(parse_definition(kind, definition))


# -- the broker's view for sends -------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What a send's check found: the version it was checked against and the first error."""

    schema_id: int
    version: int
    error: str | None


@dataclass
class _Binding:
    config: TopicSchemaConfig | None
    fetched: float
    subject: SubjectInfo | None = None
    latest: SchemaVersion | None = None


class TopicSchemas:
    """Topic bindings and compiled validators, cached for `ttl` seconds per topic."""

    def __init__(self, schemas: SchemaStore, clock: Clock, ttl: float = 2.0) -> None:
        self.schemas = schemas
        self.clock = clock
        self.ttl = ttl
        self._bindings: dict[str, _Binding] = {}
        self._versions: dict[tuple[str, int], SchemaVersion | None] = {}
        self._counters: dict[tuple[str, str], Any] = {}
        self._refreshing: set[str] = set()

    def counted(self, counters: Any, policy: str, outcome: str) -> Any:
        """The (cached) counter child of one policy and outcome."""
        key = (policy, outcome)
        child = self._counters.get(key)
        if child is None:
            child = self._counters[key] = counters.schema_checks.labels(
                policy=policy, outcome=outcome
            )
        return child

    def forget(self, topic: str) -> None:
        self._bindings.pop(topic, None)

    async def binding(self, topic: str) -> _Binding:
        """The topic's binding; once stale, one caller re-reads it while the others go on
        with the stale one (no herd of identical reads under load)."""
        now = self.clock.now()
        cached = self._bindings.get(topic)
        if cached is not None and (now - cached.fetched < self.ttl or topic in self._refreshing):
            return cached
        self._refreshing.add(topic)
        try:
            return await self._fetch(topic, now)
        finally:
            self._refreshing.discard(topic)

    async def _fetch(self, topic: str, now: float) -> _Binding:
        name = TopicName.parse(topic)
        config = await self.schemas.topic_config(name)
        binding = _Binding(config, now)
        if config is not None and config.policy is not ValidationPolicy.NONE:
            current = await self.schemas.subject(config.subject)
            if current is not None:
                binding.subject = current[0]
                versions = await self.schemas.versions(config.subject)
                binding.latest = versions[-1] if versions else None
        self._bindings[topic] = binding
        return binding

    async def _version(self, subject: str, version: int) -> SchemaVersion | None:
        key = (subject, version)
        if key not in self._versions:
            self._versions[key] = await self.schemas.version(subject, version)
        return self._versions[key]

    async def check(self, topic: str, message: Any) -> tuple[TopicSchemaConfig, Verdict] | None:
        """Check one StreamMessage against its topic's binding (None: nothing to check).

        The version is the message's `schema_version` (the producer resolved it), else the
        subject's latest; a message without schema fields is stamped with what it was
        checked against, so consumers always learn the version.
        """
        binding = await self.binding(topic)
        config = binding.config
        if config is None or config.policy is ValidationPolicy.NONE:
            return None
        info, latest = binding.subject, binding.latest
        if info is None or latest is None:
            return config, Verdict(0, 0, f"subject {config.subject!r} has no registered schema")
        if message.HasField("schema_id") and message.schema_id != info.schema_id:
            return config, Verdict(
                message.schema_id,
                message.schema_version,
                f"schema_id {message.schema_id} is not the id of subject {config.subject!r} "
                f"({info.schema_id})",
            )
        chosen: SchemaVersion | None = latest
        if message.HasField("schema_version") and message.schema_version != latest.version:
            chosen = await self._version(config.subject, message.schema_version)
            if chosen is None:
                return config, Verdict(
                    info.schema_id,
                    message.schema_version,
                    f"subject {config.subject!r} has no version {message.schema_version}",
                )
        assert chosen is not None
        error = _validator(chosen.schema_type, chosen.definition)(message.payload)
        if error is None and not message.HasField("schema_id"):
            message.schema_id = info.schema_id
            message.schema_version = chosen.version
        return config, Verdict(info.schema_id, chosen.version, error)


async def send_check(topics: TopicSchemas, topic: str, message: Any, counters: Any) -> None:
    """SendMessage's schema check, before the topic's publish (nothing stored if refused).

    ``enforce``: a payload that does not validate gets INVALID_ARGUMENT naming the subject,
    the version and the first error. ``warn``: it is logged and counted, and stored.
    """
    found = await topics.check(topic, message)
    if found is None:
        return
    config, verdict = found
    policy = config.policy.value
    if verdict.error is None:
        topics.counted(counters, policy, "valid").inc()
        return
    topics.counted(counters, policy, "invalid").inc()
    text = (
        f"payload refused by topic {topic}: subject {config.subject!r} version "
        f"{verdict.version} (schema id {verdict.schema_id}): {verdict.error}"
    )
    if config.policy is ValidationPolicy.ENFORCE:
        raise bad_input(text, "schema_invalid_payload")
    log.warning("%s (policy warn: stored anyway)", text)


async def producer_schema_check(topics: TopicSchemas, topic: TopicName, ref: Any) -> None:
    """CreateProducer with a schema reference: the subject must exist and be the topic's.

    An unbound topic is bound to the producer's subject (policy ``none``), as in Danube.
    """
    subject = validate_subject(ref.subject, "schema_ref.subject")
    schemas = topics.schemas
    if await schemas.subject(subject) is None:
        raise SchemaError(
            "schema_ref.subject",
            "unknown-subject",
            f"{subject!r} has no registered schema (register one first)",
            precondition=True,
        )
    config = await schemas.topic_config(topic)
    if config is None:
        config = await schemas.bind_if_unbound(topic, subject)
        topics.forget(str(topic))
    if config.subject != subject:
        raise SchemaError(
            "schema_ref.subject",
            "subject-mismatch",
            f"topic {topic} uses subject {config.subject!r}, not {subject!r}",
            precondition=True,
        )


# -- the gRPC service --------------------------------------------------------------------------


def _response(v: SchemaVersion, mode: CompatibilityMode) -> Any:
    return spb.GetSchemaResponse(
        schema_id=v.schema_id,
        version=v.version,
        subject=v.subject,
        schema_type=v.schema_type.value,
        schema_definition=v.definition,
        description=v.description,
        created_at=int(v.created_at),
        created_by=v.created_by,
        tags=list(v.tags),
        fingerprint=v.fingerprint,
        compatibility_mode=mode.value,
    )


class SchemaRegistryService(spb_grpc.SchemaRegistryServicer):
    """The 10 RPCs of ``danube_schema.SchemaRegistry`` over a `SchemaStore`."""

    def __init__(
        self,
        schemas: SchemaStore,
        topics: TopicSchemas | None = None,
        on_refused: Callable[[str, str], None] | None = None,
    ) -> None:
        self.schemas = schemas
        self.topics = topics
        self.on_refused = on_refused
        self.rpc_label = "schema registry"

    def refused(self, rpc: str, reason: str) -> None:
        """Count a refused request (`rpc`'s hook)."""
        if self.on_refused is not None:
            self.on_refused(rpc, reason)

    async def _mode(self, subject: str) -> CompatibilityMode:
        current = await self.schemas.subject(subject)
        return current[0].compatibility if current is not None else DEFAULT_COMPATIBILITY

    @rpc("RegisterSchema")
    async def RegisterSchema(self, request: Any, context: Any) -> Any:
        version, is_new = await self.schemas.register(
            request.subject,
            request.schema_type,
            request.schema_definition,
            description=request.description,
            created_by=request.created_by,
            tags=tuple(request.tags),
        )
        return spb.RegisterSchemaResponse(
            schema_id=version.schema_id,
            version=version.version,
            is_new_version=is_new,
            fingerprint=version.fingerprint,
        )

    @rpc("GetSchema")
    async def GetSchema(self, request: Any, context: Any) -> Any:
        wanted = request.version if request.HasField("version") else None
        found = await self.schemas.by_id(request.schema_id, wanted)
        return _response(found, await self._mode(found.subject))

    @rpc("GetLatestSchema")
    async def GetLatestSchema(self, request: Any, context: Any) -> Any:
        validate_subject(request.subject)
        found = await self.schemas.latest(request.subject)
        return _response(found, await self._mode(found.subject))

    @rpc("ListVersions")
    async def ListVersions(self, request: Any, context: Any) -> Any:
        if await self.schemas.subject(request.subject) is None:
            raise _not_found(f"subject {request.subject!r} does not exist")
        versions = await self.schemas.versions(request.subject)
        return spb.ListVersionsResponse(
            versions=[
                spb.SchemaVersionInfo(
                    version=v.version,
                    created_at=int(v.created_at),
                    created_by=v.created_by,
                    description=v.description,
                    fingerprint=v.fingerprint,
                    schema_id=v.schema_id,
                )
                for v in versions
            ]
        )

    @rpc("CheckCompatibility")
    async def CheckCompatibility(self, request: Any, context: Any) -> Any:
        mode = request.compatibility_mode if request.HasField("compatibility_mode") else None
        errors = await self.schemas.check(
            request.subject, request.schema_type, request.new_schema_definition, mode
        )
        return spb.CheckCompatibilityResponse(is_compatible=not errors, errors=errors)

    @rpc("SetCompatibilityMode")
    async def SetCompatibilityMode(self, request: Any, context: Any) -> Any:
        mode = await self.schemas.set_mode(request.subject, request.compatibility_mode)
        return spb.SetCompatibilityModeResponse(
            success=True, message=f"subject {request.subject!r}: compatibility {mode.value}"
        )

    @rpc("DeleteSchemaVersion")
    async def DeleteSchemaVersion(self, request: Any, context: Any) -> Any:
        await self.schemas.delete_version(request.subject, request.version)
        return spb.DeleteSchemaVersionResponse(
            success=True, message=f"deleted version {request.version} of {request.subject!r}"
        )

    @rpc("ConfigureTopicSchema")
    async def ConfigureTopicSchema(self, request: Any, context: Any) -> Any:
        topic = _topic(request.topic_name)
        config = await self.schemas.configure_topic(
            topic,
            request.schema_subject,
            request.validation_policy,
            request.enable_payload_validation,
        )
        if self.topics is not None:
            self.topics.forget(str(topic))
        return spb.ConfigureTopicSchemaResponse(
            success=True,
            message=f"topic {topic}: subject {config.subject!r}, policy {config.policy.value}",
        )

    @rpc("UpdateTopicValidationPolicy")
    async def UpdateTopicValidationPolicy(self, request: Any, context: Any) -> Any:
        topic = _topic(request.topic_name)
        config = await self.schemas.update_policy(
            topic, request.validation_policy, request.enable_payload_validation
        )
        if self.topics is not None:
            self.topics.forget(str(topic))
        return spb.UpdateTopicValidationPolicyResponse(
            success=True, message=f"topic {topic}: policy {config.policy.value}"
        )

    @rpc("GetTopicSchemaConfig")
    async def GetTopicSchemaConfig(self, request: Any, context: Any) -> Any:
        topic = _topic(request.topic_name)
        config = await self.schemas.topic_config(topic)
        if config is None:
            raise _not_found(f"topic {topic} has no schema subject")
        current = await self.schemas.subject(config.subject)
        return spb.GetTopicSchemaConfigResponse(
            schema_subject=config.subject,
            validation_policy=config.policy.value,
            enable_payload_validation=config.payload_validation,
            schema_id=current[0].schema_id if current is not None else 0,
        )
