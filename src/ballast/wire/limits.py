"""Limits on what clients send: whole messages, the names they register, parseable requests.

A message counts its payload, attribute keys and values and routing key against
`data_plane.max_message_bytes` (the schema fields and ids are small and fixed). The limit
is capped below the 0.5.0 client's 4 MiB receive limit with room for the delivered
message's other fields, and names are capped at `MAX_NAME_BYTES`: so whatever is stored is
deliverable, and a poison message (one the consumer's stream cannot carry, redelivered
for ever) is refused at produce time instead of being skipped later.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from ballast.wire.errors import bad_input
from ballast.wire.rpc import WrappingInterceptor

__all__ = [
    "MAX_NAME_BYTES",
    "DecodeInterceptor",
    "check_message",
    "check_name",
    "message_bytes",
]

# Producer and consumer names travel with every delivered message (producer_name) or
# label metrics: a name of a few hundred bytes is plenty.
MAX_NAME_BYTES = 256


def message_bytes(message: Any) -> int:
    """The bytes of a `StreamMessage` that count against `max_message_bytes`."""
    attributes = sum(len(k.encode()) + len(v.encode()) for k, v in message.attributes.items())
    return len(message.payload) + attributes + len(message.routing_key.encode())


def check_message(message: Any, limit: int) -> int:
    """The message's size; INVALID_ARGUMENT naming size and limit when it is over."""
    size = message_bytes(message)
    if size > limit:
        raise bad_input(
            f"message of {size} bytes (payload {len(message.payload)}, attributes and "
            f"routing key {size - len(message.payload)}) exceeds the limit of {limit} bytes "
            "(data_plane.max_message_bytes)",
            "message_too_large",
        )
    if len(message.producer_name.encode()) > MAX_NAME_BYTES:
        raise bad_input(f"producer_name: longer than {MAX_NAME_BYTES} bytes", "name_too_long")
    return size


def check_name(value: str, field: str) -> None:
    """INVALID_ARGUMENT for an empty name or one over `MAX_NAME_BYTES`."""
    if not value:
        raise bad_input(f"{field}: must not be empty", f"bad_{field}")
    if len(value.encode()) > MAX_NAME_BYTES:
        raise bad_input(
            f"{field}: {len(value.encode())} bytes, longer than {MAX_NAME_BYTES}",
            "name_too_long",
        )


class DecodeInterceptor(WrappingInterceptor):
    """Parses requests itself so that malformed protobuf gets INVALID_ARGUMENT, counted.

    gRPC's own deserializer answers UNKNOWN and logs an error with a traceback; this one
    (the outermost interceptor) hands the raw bytes to the request class and refuses what
    does not parse, before authorization and the handler.
    """

    def __init__(self, on_refused: Callable[[str, str], None]) -> None:
        super().__init__(self._wrap)
        self.on_refused = on_refused

    def _wrap(self, method: str, handler: Any) -> Any:
        parse = handler.request_deserializer
        if parse is None:
            return handler
        refused = self.on_refused

        async def decode(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            try:
                return parse(raw)
            except DecodeError as exc:
                refused(method, "malformed_request")
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{method}: malformed request ({exc})"
                )

        if handler.unary_unary is not None:
            inner_unary = handler.unary_unary

            async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
                return await inner_unary(await decode(raw, context), context)

            return grpc.unary_unary_rpc_method_handler(
                unary, response_serializer=handler.response_serializer
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
                async for item in inner_stream(await decode(raw, context), context):
                    yield item

            return grpc.unary_stream_rpc_method_handler(
                stream, response_serializer=handler.response_serializer
            )
        return handler
