"""JWT bearer tokens with per-namespace permissions, and the gRPC interceptor that checks them.

A token is a JWT (HS256 with a shared secret, or RS256 with a key pair) whose claims are::

    {"sub": "orders-service", "iss": "ballast", "iat": ..., "exp": ...,
     "perms": {"orders": ["produce", "consume"], "*": ["admin"]}}

``perms`` maps a namespace (``*``: every namespace) to permissions: ``produce``,
``consume``, ``admin`` (admin implies the other two). The client sends it as
``authorization: Bearer <jwt>`` (`with_token`), which the 0.5.0 client only does over TLS.

`AuthInterceptor` guards the client protocol on brokers and gateways:

- no token, an expired one, a forged one (bad signature, wrong algorithm or issuer):
  UNAUTHENTICATED, saying which;
- a valid token without the permission the call needs: PERMISSION_DENIED naming the
  subject, the missing permission and the namespace.

What each call needs: TopicLookup / TopicPartitions any permission on the topic's
namespace; CreateProducer and SendMessage ``produce``; Subscribe, Ack and Nack
``consume``; ReceiveMessages and HealthCheck a valid token (they carry only an id that a
checked CreateProducer or Subscribe handed out). The schema registry: reads a valid
token; RegisterSchema ``produce`` on some namespace; SetCompatibilityMode and
DeleteSchemaVersion ``admin`` on ``*``; ConfigureTopicSchema and
UpdateTopicValidationPolicy ``admin`` on the topic's namespace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import grpc
import jwt
from danube.proto import SchemaRegistry_pb2 as spb

from ballast.config import AuthSettings
from ballast.wire.protocol import pb
from ballast.wire.rpc import WrappingInterceptor

__all__ = [
    "AuthError",
    "AuthInterceptor",
    "Binding",
    "Permission",
    "TokenAuthority",
    "TokenClaims",
    "authorize_call",
    "bind",
    "check_bound",
    "parse_permissions",
]

PERMS_CLAIM = "perms"
ANY_NAMESPACE = "*"
_CACHE_SIZE = 4096
_CACHE_SECONDS = 30.0


class Permission(StrEnum):
    PRODUCE = "produce"
    CONSUME = "consume"
    ADMIN = "admin"


def parse_permissions(text: str) -> tuple[Permission, ...]:
    """``"produce,consume"`` → permissions; ValueError names an unknown one."""
    found: list[Permission] = []
    for part in (p.strip().lower() for p in text.split(",")):
        if not part:
            continue
        try:
            found.append(Permission(part))
        except ValueError:
            allowed = ", ".join(p.value for p in Permission)
            raise ValueError(f"permission {part!r}: unknown (use {allowed})") from None
    if not found:
        raise ValueError("permissions: give at least one of produce, consume, admin")
    return tuple(dict.fromkeys(found))


class AuthError(Exception):
    """A refused request: `code` is UNAUTHENTICATED or PERMISSION_DENIED."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class TokenClaims:
    """A verified token: who, until when, and what on which namespace."""

    subject: str
    expires_at: float | None
    permissions: Mapping[str, frozenset[Permission]]

    def allows(self, namespace: str, needed: Iterable[Permission]) -> bool:
        """Whether any of `needed` is granted on `namespace` (admin grants everything)."""
        granted = self.permissions.get(namespace, frozenset()) | self.permissions.get(
            ANY_NAMESPACE, frozenset()
        )
        return Permission.ADMIN in granted or any(p in granted for p in needed)


# The verified claims of the call being handled (None without `auth`): set by the
# interceptor, read by handlers that bind ids to principals.
CALLER: ContextVar[TokenClaims | None] = ContextVar("ballast_caller", default=None)


@dataclass(frozen=True)
class Binding:
    """Whose a producer or consumer id is: its creator, on the namespace of its topic.

    A producer or consumer id works only for the principal that created it (or that took
    it over by name, which needs the same permission on the same namespace), so an id is
    never a bearer credential.
    """

    subject: str
    namespace: str


def bind(namespace: str) -> Binding | None:
    """The binding of an id created by the current call (None without `auth`)."""
    claims = CALLER.get()
    return None if claims is None else Binding(claims.subject, namespace)


def check_bound(binding: Binding | None, needed: tuple[Permission, ...], what: str) -> None:
    """Raise PERMISSION_DENIED unless the current caller owns `binding`'s id."""
    claims = CALLER.get()
    if claims is None:
        return
    if (
        binding is None
        or claims.subject != binding.subject
        or not claims.allows(binding.namespace, needed)
    ):
        raise AuthError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{what} was created by another principal; {claims.subject!r} may not use it "
            "(subscribe or create the producer with your own token)",
        )


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"auth.{what} {path}: cannot read ({exc.strerror})") from None


class TokenAuthority:
    """Issues and verifies tokens with the keys of the `auth` configuration section."""

    def __init__(self, settings: AuthSettings) -> None:
        self.settings = settings
        self.algorithm = settings.algorithm
        self.issuer = settings.issuer
        self._verify_key: Any = None
        self._sign_key: Any = None
        if self.algorithm == "HS256":
            secret = settings.secret
            if secret is None and settings.secret_file:
                secret = _read(settings.secret_file, "secret_file").decode().strip()
            self._verify_key = self._sign_key = secret
        else:
            if settings.private_key_file:
                self._sign_key = _read(settings.private_key_file, "private_key_file")
            if settings.public_key_file:
                self._verify_key = _read(settings.public_key_file, "public_key_file")
            elif self._sign_key is not None:
                from cryptography.hazmat.primitives import serialization

                private = serialization.load_pem_private_key(self._sign_key, password=None)
                self._verify_key = private.public_key()
        self._cache: dict[str, tuple[float, TokenClaims]] = {}

    def issue(
        self,
        subject: str,
        permissions: Mapping[str, Iterable[Permission]],
        ttl_seconds: float | None = 3600.0,
        now: float | None = None,
    ) -> str:
        """A signed token for `subject` (no expiry when `ttl_seconds` is None)."""
        if self._sign_key is None:
            raise ValueError(
                "auth: cannot issue tokens without a signing key "
                "(auth.secret / secret_file for HS256, private_key_file for RS256)"
            )
        issued = time.time() if now is None else now
        claims: dict[str, Any] = {
            "sub": subject,
            "iss": self.issuer,
            "iat": int(issued),
            PERMS_CLAIM: {ns: sorted(str(p) for p in perms) for ns, perms in permissions.items()},
        }
        if ttl_seconds is not None:
            claims["exp"] = int(issued + ttl_seconds)
        return jwt.encode(claims, self._sign_key, algorithm=self.algorithm)

    def verify(self, token: str) -> TokenClaims:
        """The token's claims; `AuthError(UNAUTHENTICATED)` says why it is refused."""
        now = time.time()
        cached = self._cache.get(token)
        if cached is not None:
            until, claims = cached
            if now < until:
                return claims
            del self._cache[token]
        claims = self._decode(token)
        if len(self._cache) >= _CACHE_SIZE:
            self._cache.clear()
        until = now + _CACHE_SECONDS
        if claims.expires_at is not None:
            until = min(until, claims.expires_at)
        self._cache[token] = (until, claims)
        return claims

    def _decode(self, token: str) -> TokenClaims:
        unauthenticated = grpc.StatusCode.UNAUTHENTICATED
        if self._verify_key is None:
            raise AuthError(unauthenticated, "this server has no key to verify tokens")
        try:
            data = jwt.decode(
                token,
                self._verify_key,
                algorithms=[self.algorithm],
                issuer=self.issuer,
                options={"require": ["sub", "iss"]},
            )
        except jwt.ExpiredSignatureError:
            raise AuthError(unauthenticated, "token expired; get a new one") from None
        except jwt.InvalidSignatureError:
            raise AuthError(
                unauthenticated, "token signature is invalid (forged, or another key)"
            ) from None
        except jwt.InvalidIssuerError:
            raise AuthError(unauthenticated, f"token issuer is not {self.issuer!r}") from None
        except jwt.InvalidTokenError as exc:
            raise AuthError(unauthenticated, f"token rejected: {exc}") from None
        perms: dict[str, frozenset[Permission]] = {}
        raw = data.get(PERMS_CLAIM) or {}
        if not isinstance(raw, dict):
            raise AuthError(unauthenticated, f"token claim {PERMS_CLAIM!r} is not an object")
        for namespace, values in raw.items():
            if not isinstance(values, list):
                continue
            perms[str(namespace)] = frozenset(
                Permission(v) for v in values if v in Permission.__members__.values()
            )
        exp = data.get("exp")
        return TokenClaims(str(data["sub"]), float(exp) if exp is not None else None, perms)

    def authorize(
        self, metadata: Iterable[tuple[str, Any]] | None, namespace: str | None,
        needed: tuple[Permission, ...],
    ) -> TokenClaims:  # fmt: skip
        """Check a call's metadata; raises `AuthError` with the code and the reason."""
        token = bearer_token(metadata)
        if token is None:
            raise AuthError(
                grpc.StatusCode.UNAUTHENTICATED,
                "no token: send 'authorization: Bearer <jwt>' (the client's with_token)",
            )
        claims = self.verify(token)
        if namespace == SOME_NAMESPACE:
            granted = any(claims.allows(ns, needed) for ns in claims.permissions)
            if not granted and needed:
                wanted = " or ".join(p.value for p in needed)
                raise AuthError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"token of {claims.subject!r} lacks the {wanted!r} permission on every "
                    "namespace",
                )
            return claims
        if namespace is not None and needed and not claims.allows(namespace, needed):
            wanted = " or ".join(p.value for p in needed)
            raise AuthError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"token of {claims.subject!r} lacks the {wanted!r} permission on namespace "
                f"{namespace!r}",
            )
        return claims


def bearer_token(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The token of an ``authorization: Bearer …`` entry, if any."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


# -- what each RPC needs ---------------------------------------------------------------------

_ANY = (Permission.PRODUCE, Permission.CONSUME)
_PRODUCE = (Permission.PRODUCE,)
_CONSUME = (Permission.CONSUME,)


def _topic(request: Any) -> str:
    return str(request.topic)


def _topic_name(request: Any) -> str:
    return str(request.topic_name)


def _msg_topic(request: Any) -> str:
    return str(request.msg_id.topic_name)


# method path -> (request class, topic getter or None, permissions needed)
RULES: dict[str, tuple[Any, Callable[[Any], str] | None, tuple[Permission, ...]]] = {
    "/danube.Discovery/TopicLookup": (pb.TopicLookupRequest, _topic, _ANY),
    "/danube.Discovery/TopicPartitions": (pb.TopicLookupRequest, _topic, _ANY),
    "/danube.ProducerService/CreateProducer": (pb.ProducerRequest, _topic_name, _PRODUCE),
    "/danube.ProducerService/SendMessage": (pb.StreamMessage, _msg_topic, _PRODUCE),
    "/danube.ConsumerService/Subscribe": (pb.ConsumerRequest, _topic_name, _CONSUME),
    "/danube.ConsumerService/Ack": (pb.AckRequest, _msg_topic, _CONSUME),
    "/danube.ConsumerService/Nack": (pb.NackRequest, _msg_topic, _CONSUME),
    "/danube.ConsumerService/ReceiveMessages": (pb.ReceiveRequest, None, ()),
    "/danube.HealthCheck/HealthCheck": (pb.HealthCheckRequest, None, ()),
}


# The schema registry (subjects are cluster-wide): reading needs a valid token;
# registering needs ``produce`` on some namespace; changing a subject's mode or deleting a
# version needs ``admin`` on every namespace (``*``); binding a topic needs ``admin`` on
# the topic's namespace.
_SCHEMA = "/danube_schema.SchemaRegistry/"
_ADMIN = (Permission.ADMIN,)
SOME_NAMESPACE = "\x00some"  # the permission on any one namespace will do
ALL_NAMESPACES = ANY_NAMESPACE


def _some(request: Any) -> str:
    return "/" + SOME_NAMESPACE + "/x"


def _all(request: Any) -> str:
    return "/" + ALL_NAMESPACES + "/x"


RULES.update(
    {
        _SCHEMA + "RegisterSchema": (spb.RegisterSchemaRequest, _some, _PRODUCE),
        _SCHEMA + "GetSchema": (spb.GetSchemaRequest, None, ()),
        _SCHEMA + "GetLatestSchema": (spb.GetLatestSchemaRequest, None, ()),
        _SCHEMA + "ListVersions": (spb.ListVersionsRequest, None, ()),
        _SCHEMA + "CheckCompatibility": (spb.CheckCompatibilityRequest, None, ()),
        _SCHEMA + "GetTopicSchemaConfig": (spb.GetTopicSchemaConfigRequest, _topic_name, _ANY),
        _SCHEMA + "SetCompatibilityMode": (spb.SetCompatibilityModeRequest, _all, _ADMIN),
        _SCHEMA + "DeleteSchemaVersion": (spb.DeleteSchemaVersionRequest, _all, _ADMIN),
        _SCHEMA + "ConfigureTopicSchema": (spb.ConfigureTopicSchemaRequest, _topic_name, _ADMIN),
        _SCHEMA + "UpdateTopicValidationPolicy": (
            spb.UpdateTopicValidationPolicyRequest,
            _topic_name,
            _ADMIN,
        ),
    }
)


def _namespace(topic: str) -> str | None:
    parts = topic.split("/")
    return parts[1] if len(parts) == 3 and parts[0] == "" and parts[1] else None


def authorize_call(
    authority: TokenAuthority, method: str, request: Any, metadata: Any
) -> TokenClaims:
    """The caller's claims if its token allows the call (`RULES`); `AuthError` if not."""
    rule = RULES.get(method)
    if rule is None:
        return authority.authorize(metadata, None, ())
    cls, getter, needed = rule
    namespace = None
    if getter is not None:
        if isinstance(request, bytes):
            request = cls.FromString(request)
        namespace = _namespace(getter(request))
        if namespace is None:  # a malformed name: the handler answers INVALID_ARGUMENT
            needed = ()
    return authority.authorize(metadata, namespace, needed)


class AuthInterceptor(WrappingInterceptor):
    """Checks the bearer token of every call of the client protocol before its handler."""

    def __init__(self, authority: TokenAuthority, on_refused: Callable[[str, str], None]) -> None:
        super().__init__(self._wrap)
        self.authority = authority
        self.on_refused = on_refused

    def _check(self, method: str, request: Any, metadata: Any) -> None:
        CALLER.set(authorize_call(self.authority, method, request, metadata))

    def _wrap(self, method: str, handler: Any) -> Any:
        check = self._check
        refused = self.on_refused

        if handler.unary_unary is not None:
            inner_unary = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    check(method, request, context.invocation_metadata())
                except AuthError as exc:
                    refused(method, exc.code.name)
                    await context.abort(exc.code, exc.message)
                return await inner_unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    check(method, request, context.invocation_metadata())
                except AuthError as exc:
                    refused(method, exc.code.name)
                    await context.abort(exc.code, exc.message)
                async for item in inner_stream(request, context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                stream,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler
