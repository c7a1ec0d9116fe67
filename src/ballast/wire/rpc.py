"""How every gRPC handler of the data plane answers: one decorator for all services.

A handler raises `RpcFailure` (or a `SchemaError`, or lets a metadata-store error
through); the decorator turns it into the RPC's status, counts the refusal through the
service's `refused` hook and logs it (UNAVAILABLE, the everyday "look up again", at DEBUG).
Anything else is a bug: logged with its traceback and answered INTERNAL.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc

from ballast.metadata import MetadataError
from ballast.schemas import SchemaError
from ballast.wire.errors import RpcFailure, not_served

__all__ = ["RpcService", "WrappingInterceptor", "rpc", "schema_failure"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class RpcService(Protocol):
    """What `rpc` needs of the service it decorates."""

    rpc_label: str  # who answers, for logs (a broker id, "schema registry")

    def refused(self, rpc: str, reason: str) -> None:
        """Count one refused request."""
        ...


def schema_failure(exc: SchemaError) -> RpcFailure:
    """The gRPC answer to a refused schema request."""
    code = (
        grpc.StatusCode.FAILED_PRECONDITION
        if exc.precondition
        else grpc.StatusCode.INVALID_ARGUMENT
    )
    return RpcFailure(code, str(exc), f"schema_{exc.rule.split(':', 1)[0]}")


def rpc(name: str) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
    """Answer the handler's failures with their status; count and log refusals."""

    def wrap(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        @functools.wraps(fn)
        async def handler(self: RpcService, request: Any, context: Any) -> T:
            try:
                try:
                    return await fn(self, request, context)
                except SchemaError as exc:
                    raise schema_failure(exc) from None
                except MetadataError as exc:
                    # etcd unreachable or timing out: a retry may well succeed.
                    raise not_served(f"metadata store unavailable: {exc}", "metadata") from None
                except (RpcFailure, asyncio.CancelledError):
                    raise
                except Exception as exc:
                    log.exception("%s: %s failed", self.rpc_label, name)
                    raise RpcFailure(
                        grpc.StatusCode.INTERNAL, f"{name} failed: {exc}", "internal"
                    ) from None
            except RpcFailure as failure:
                self.refused(name, failure.reason)
                level = (
                    logging.DEBUG if failure.code is grpc.StatusCode.UNAVAILABLE else logging.INFO
                )
                log.log(
                    level,
                    "%s: %s refused (%s): %s",
                    self.rpc_label,
                    name,
                    failure.code.name,
                    failure.message,
                )
                await context.abort(failure.code, failure.message)
                raise AssertionError("unreachable") from None

        return handler

    return wrap


class WrappingInterceptor(grpc.aio.ServerInterceptor):
    """An interceptor that wraps each method's handler once, not on every call.

    gRPC asks the interceptors for a handler on every call; rebuilding the wrapper each
    time costs tens of microseconds per call on the hot path (SendMessage). The handlers
    behind are the same objects for the same method, so the wrapper is kept per method
    (only for methods that exist: unknown names get None and keep nothing).
    """

    def __init__(self, wrap: Callable[[str, Any], Any]) -> None:
        self.wrap = wrap  # (method, handler) -> the handler to serve `method` with
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self.wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped
