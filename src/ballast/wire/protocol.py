"""The wire contract: the descriptor compiled into the published `danube-client`.

Ballast serves the client's own generated stubs (package `danube`, file
`DanubeApi.proto`), so the served descriptor is the client's by construction; a test
checks it byte for byte. Enum values are re-exported under readable names.
"""

from __future__ import annotations

import secrets
from typing import Any

from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeApi_pb2_grpc as pb_grpc

__all__ = [
    "CARRIED_HEADER",
    "CLIENT_CONSUMER",
    "CLIENT_PRODUCER",
    "CONNECT",
    "HEALTH_CLOSE",
    "HEALTH_OK",
    "NON_RELIABLE",
    "REDIRECT",
    "RELAY_HEADER",
    "RELIABLE",
    "SUBSCRIPTION_TYPES",
    "new_id",
    "pb",
    "pb_grpc",
    "served_descriptor",
]

NON_RELIABLE: int = pb.NonReliable
RELIABLE: int = pb.Reliable
REDIRECT: int = pb.TopicLookupResponse.Redirect
CONNECT: int = pb.TopicLookupResponse.Connect
CLIENT_PRODUCER: int = pb.HealthCheckRequest.Producer
CLIENT_CONSUMER: int = pb.HealthCheckRequest.Consumer
HEALTH_OK: int = pb.HealthCheckResponse.OK
HEALTH_CLOSE: int = pb.HealthCheckResponse.CLOSE

# ConsumerRequest.SubscriptionType: wire number -> Ballast's name.
SUBSCRIPTION_TYPES: dict[int, str] = {
    pb.ConsumerRequest.Exclusive: "exclusive",
    pb.ConsumerRequest.Shared: "shared",
    pb.ConsumerRequest.Failover: "failover",
    pb.ConsumerRequest.KeyShared: "key_shared",
}


# Marks a relay's stream, so the new owner keeps what was sent for the client to ack.
RELAY_HEADER = "x-ballast-relay"
# Marks a gateway's stream of a consumer it carries across moves itself: no relay for it
# (the relay would subscribe on the new owner under the same name as the gateway does,
# and each would take the other's stream over).
CARRIED_HEADER = "x-ballast-carried"


def new_id() -> int:
    """A random non-zero 64-bit id, as Danube hands out for producers and consumers."""
    return secrets.randbits(64) or 1


def served_descriptor() -> Any:
    """The file descriptor whose services the broker registers."""
    return pb.DESCRIPTOR
