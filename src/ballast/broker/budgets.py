"""Byte budgets for messages a broker holds while it stores them, and backpressure.

A reliable message is acknowledged only once it is in object storage, so between a
SendMessage and its answer the broker holds it (the WAL's pending batch, its cache, the
next upload). The bytes held are counted per topic and for the broker; a send that would
go over either budget is refused with RESOURCE_EXHAUSTED, on which the real client backs
off and retries, instead of queueing without bound while an fsync or an upload stalls.
(What a slow subscription holds is bounded separately, per subscription, by the
dispatcher's `buffer_bytes`: it never refuses producers, so it never slows the others.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import grpc

from ballast.wire.errors import RpcFailure

__all__ = ["ByteBudgets"]


class ByteBudgets:
    """Bytes held per topic and in total, against their budgets."""

    def __init__(self, topic_limit: int, broker_limit: int) -> None:
        self.topic_limit = topic_limit
        self.broker_limit = broker_limit
        self.held: dict[str, int] = {}
        self.total = 0
        self.refused: dict[str, int] = {}  # sends refused per topic (either budget)

    def check(self, topic: str, size: int) -> None:
        """RESOURCE_EXHAUSTED when holding `size` more bytes of `topic` would not fit.

        One message always fits an empty budget (a budget below the message limit must
        not refuse a message for ever).
        """
        held = self.held.get(topic, 0)
        if (held and held + size > self.topic_limit) or (
            self.total and self.total + size > self.broker_limit
        ):
            self.refused[topic] = self.refused.get(topic, 0) + 1
        if held and held + size > self.topic_limit:
            raise RpcFailure(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"topic {topic} holds {held} bytes not yet stored, its budget is "
                f"{self.topic_limit} (data_plane.topic_budget_bytes); retry later",
                "topic_budget_full",
            )
        if self.total and self.total + size > self.broker_limit:
            raise RpcFailure(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this broker holds {self.total} bytes not yet stored, its budget is "
                f"{self.broker_limit} (data_plane.broker_budget_bytes); retry later",
                "broker_budget_full",
            )

    @contextmanager
    def hold(self, topic: str, size: int) -> Iterator[None]:
        """Count `size` bytes of `topic` as held for the block (checked first)."""
        self.check(topic, size)
        self.held[topic] = self.held.get(topic, 0) + size
        self.total += size
        try:
            yield
        finally:
            left = self.held[topic] - size
            if left:
                self.held[topic] = left
            else:
                del self.held[topic]
            self.total -= size
