"""The wire contract: the descriptor compiled into the published `danube-client`.

Ballast serves the client's own generated stubs (package `danube`, file
`DanubeApi.proto`), so the served descriptor is the client's by construction; a test
checks it byte for byte. Enum values are re-exported under readable names.
"""

from __future__ import annotations

from typing import Any

from danube.proto import DanubeApi_pb2 as pb
from danube.proto import DanubeApi_pb2_grpc as pb_grpc

__all__ = [
    "CLIENT_CONSUMER",
    "CLIENT_PRODUCER",
    "CONNECT",
    "HEALTH_CLOSE",
    "HEALTH_OK",
    "NON_RELIABLE",
    "REDIRECT",
    "RELIABLE",
    "SUBSCRIPTION_TYPES",
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


def served_descriptor() -> Any:
    """The file descriptor whose services the broker registers."""
    return pb.DESCRIPTOR
