"""Quotas per namespace: how many topics, producers, consumers and subscriptions.

A namespace's record at ``/policies/quotas/{ns}`` (``ballast admin namespaces set-policy``)
holds its limits; 0 or absent means unlimited, and `auto_create_topics` absent means the
configuration's `data_plane.auto_create_topics`. Brokers re-read a record every few
seconds. A request over a quota gets FAILED_PRECONDITION naming the quota (not
RESOURCE_EXHAUSTED: the client would retry it for ever), and is counted
(``rejected_total{reason="quota_…"}``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import grpc

from ballast.clock import Clock
from ballast.metadata import MetadataStore, keys
from ballast.wire.errors import RpcFailure

__all__ = ["QUOTA_FIELDS", "NamespaceQuotas", "QuotaCache", "over_quota", "quotas_from"]

_TTL_SECONDS = 5.0


@dataclass(frozen=True)
class NamespaceQuotas:
    """A namespace's limits (0: unlimited; `auto_create_topics` None: the configuration's)."""

    max_topics: int = 0
    max_producers_per_topic: int = 0
    max_consumers_per_topic: int = 0
    max_subscriptions_per_topic: int = 0
    auto_create_topics: bool | None = None


QUOTA_FIELDS = tuple(f.name for f in fields(NamespaceQuotas) if f.name.startswith("max_"))


def quotas_from(record: Any) -> NamespaceQuotas:
    """The quotas of a stored record (wrong values are ignored: unlimited)."""
    if not isinstance(record, dict):
        return NamespaceQuotas()
    values: dict[str, Any] = {}
    for name in QUOTA_FIELDS:
        value = record.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            values[name] = value
    auto = record.get("auto_create_topics")
    if isinstance(auto, bool):
        values["auto_create_topics"] = auto
    return NamespaceQuotas(**values)


def over_quota(namespace: str, what: str, have: int, limit: int) -> None:
    """FAILED_PRECONDITION when `have` already reaches a non-zero `limit`."""
    if limit and have >= limit:
        raise RpcFailure(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"namespace {namespace!r} allows at most {limit} {what.replace('_', ' ')} "
            f"(quota max_{what}; `ballast admin namespaces set-policy`)",
            f"quota_{what}",
        )


class QuotaCache:
    """Namespace quotas read from the metadata store, each kept a few seconds."""

    def __init__(self, store: MetadataStore, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self._cached: dict[str, tuple[float, NamespaceQuotas]] = {}

    async def get(self, namespace: str) -> NamespaceQuotas:
        now = self.clock.now()
        cached = self._cached.get(namespace)
        if cached is None or now - cached[0] >= _TTL_SECONDS:
            kv = await self.store.get(keys.quota_policy(namespace))
            cached = (now, quotas_from(kv.value if kv is not None else None))
            self._cached[namespace] = cached
        return cached[1]

    async def topic_count(self, namespace: str) -> int:
        """Topics of the namespace (a full read: only when a topic is about to be created)."""
        listing = await self.store.get_prefix(f"{keys.TOPICS_PREFIX}{namespace}/")
        return sum(1 for kv in listing.items if keys.is_topic_meta_key(kv.key))
