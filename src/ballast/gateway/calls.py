"""What every part of the gateway says about a call: the methods it serves, the headers it
reads, and how a call forwarded to a broker fails."""

from __future__ import annotations

import grpc

from ballast.wire.link import ACK_LINK_METHOD, LINK_METHOD

__all__ = [
    "ACK",
    "BROKER_HEADER",
    "CREATE_PRODUCER",
    "HEALTH",
    "LINKED",
    "LOOKUP",
    "NACK",
    "PARTITIONS",
    "RECEIVE",
    "REFUSALS",
    "SEND",
    "SUBSCRIBE",
    "Abort",
    "connection_lost",
    "split_metadata",
]

BROKER_HEADER = "x-danube-broker-url"
FORWARDED_HEADERS = ("authorization",)
LOOKUP = "/danube.Discovery/TopicLookup"
PARTITIONS = "/danube.Discovery/TopicPartitions"
CREATE_PRODUCER = "/danube.ProducerService/CreateProducer"
SEND = "/danube.ProducerService/SendMessage"
SUBSCRIBE = "/danube.ConsumerService/Subscribe"
RECEIVE = "/danube.ConsumerService/ReceiveMessages"
ACK = "/danube.ConsumerService/Ack"
NACK = "/danube.ConsumerService/Nack"
HEALTH = "/danube.HealthCheck/HealthCheck"
LINKED = {SEND: LINK_METHOD, ACK: ACK_LINK_METHOD}  # client RPC -> the link carrying it

# What a broker answers about the client itself: carrying the call elsewhere cannot help.
REFUSALS = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.INVALID_ARGUMENT,
)


class Abort(Exception):
    """A forwarded call's answer to the client (its status and message)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def connection_lost(exc: grpc.aio.AioRpcError) -> bool:
    """A failure of the link, not an answer of the broker (which always names a reason)."""
    if exc.code() is not grpc.StatusCode.UNAVAILABLE:
        return False
    details = (exc.details() or "").lower()
    return any(
        hint in details
        for hint in (
            "connect",
            "socket",
            "connection",
            "endpoint",
            "unreachable",
            "broken pipe",
            "goaway",
            "closed",
            "reset",
            "dns",
            "handshake",
            "ssl",
        )
    )


def split_metadata(context: grpc.aio.ServicerContext) -> tuple[str | None, list[tuple[str, str]]]:
    """(the proxy header, the entries passed on to the broker)."""
    header = None
    forwarded: list[tuple[str, str]] = []
    for key, value in context.invocation_metadata() or ():
        text = value.decode() if isinstance(value, bytes) else str(value)
        if key == BROKER_HEADER:
            header = text
        elif key in FORWARDED_HEADERS:
            forwarded.append((key, text))
    return header, forwarded
