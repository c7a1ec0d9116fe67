"""Failures a handler answers with: a gRPC code and a message naming the problem."""

from __future__ import annotations

import grpc

__all__ = ["RpcFailure", "bad_input", "not_served"]


class RpcFailure(Exception):
    """End the RPC with `code` and `message`; `reason` labels the metric."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason


def bad_input(message: str, reason: str) -> RpcFailure:
    """INVALID_ARGUMENT: the request itself is wrong; retrying cannot help."""
    return RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, message, reason)


def not_served(message: str, reason: str = "not_served") -> RpcFailure:
    """UNAVAILABLE: the only code on which the 0.5.0 client looks up again and recreates."""
    return RpcFailure(grpc.StatusCode.UNAVAILABLE, message, reason)
