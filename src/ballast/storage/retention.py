"""Retention per namespace: which of a topic's oldest objects the owner may delete.

A namespace's policy (``keys.retention_policy(ns)``, set with ``ballast admin namespaces
set-retention``) bounds the time and/or the size a reliable topic keeps in object storage;
without one everything is kept. The owner releases whole objects, oldest first, while one
of the limits is exceeded — but never an object a subscription still needs: only objects
ending at or before the lowest subscription cursor (as written in the metadata store:
every subscription's cursor is written when it is created, and a stale cursor is lower,
hence safe) are released, so a slow or idle subscription holds retention back. The newest
object is never released (its end tells the next owner where offsets continue).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ballast.clock import Clock
from ballast.metadata import keys
from ballast.metadata.store import MetadataStore
from ballast.model import TopicName
from ballast.storage.catalog import ObjectDescriptor
from ballast.storage.cursor import CursorError, parse_cursor

__all__ = [
    "RetentionError",
    "RetentionPolicies",
    "RetentionPolicy",
    "load_policy",
    "lowest_cursor",
    "parse_retention_size",
    "parse_retention_time",
    "releasable",
]

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_TIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


class RetentionError(ValueError):
    """A retention value that cannot be used; the message names it."""


def parse_retention_time(text: str) -> float:
    """`90s`, `30m`, `12h`, `7d`, `2w` or plain seconds → seconds (positive)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhdw]?)\s*", text.lower())
    if match is None or not float(match.group(1)) > 0:
        raise RetentionError(
            f"invalid retention time {text!r}: use a positive number with s, m, h, d or w (e.g. 7d)"
        )
    return float(match.group(1)) * _TIME_UNITS.get(match.group(2), 1)


def parse_retention_size(text: str) -> int:
    """`10GiB`, `500MB`, `1024` (bytes) → bytes (positive)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in _SIZE_UNITS or not float(match.group(1)) > 0:
        raise RetentionError(
            f"invalid retention size {text!r}: use a positive number with B, KB, MB, GB, "
            "TB, KiB, MiB, GiB or TiB (e.g. 10GiB)"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long and how much a namespace's reliable topics keep (None: no limit)."""

    time_seconds: float | None = None
    size_bytes: int | None = None

    @property
    def keeps_everything(self) -> bool:
        """True when no limit is set (the default)."""
        return self.time_seconds is None and self.size_bytes is None

    def to_dict(self) -> dict[str, Any]:
        """JSON form stored in the metadata store."""
        return {"time_seconds": self.time_seconds, "size_bytes": self.size_bytes}

    @classmethod
    def from_dict(cls, data: Any, ctx: str) -> RetentionPolicy:
        """Validate a stored policy; raises `RetentionError` naming the bad field."""
        if not isinstance(data, Mapping):
            raise RetentionError(f"{ctx}: expected a JSON object, got {type(data).__name__}")
        time_seconds = data.get("time_seconds")
        if time_seconds is not None and (
            isinstance(time_seconds, bool)
            or not isinstance(time_seconds, int | float)
            or not time_seconds > 0
        ):
            raise RetentionError(f"{ctx}.time_seconds: expected a positive number or null")
        size_bytes = data.get("size_bytes")
        if size_bytes is not None and (
            isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes <= 0
        ):
            raise RetentionError(f"{ctx}.size_bytes: expected a positive integer or null")
        return cls(None if time_seconds is None else float(time_seconds), size_bytes)


def releasable(
    described: Sequence[ObjectDescriptor],
    policy: RetentionPolicy,
    now: float,
    lowest: int | None,
) -> int:
    """How many of the oldest objects `policy` releases (pure).

    `described` is in offset order; `lowest` is the lowest subscription cursor (last acked
    offset; None: no subscription). The newest object is always kept.
    """
    if policy.keeps_everything:
        return 0
    total = sum(d.size for d in described)
    released = 0
    for descriptor in described[:-1]:
        if lowest is not None and descriptor.end > lowest:
            break  # a subscription still needs it (and everything after it)
        expired = (
            policy.time_seconds is not None and descriptor.created <= now - policy.time_seconds
        )
        oversize = policy.size_bytes is not None and total > policy.size_bytes
        if not (expired or oversize):
            break
        total -= descriptor.size
        released += 1
    return released


async def load_policy(store: MetadataStore, namespace: str) -> RetentionPolicy:
    """The namespace's policy (keep everything if none is set)."""
    key = keys.retention_policy(namespace)
    kv = await store.get(key)
    return RetentionPolicy() if kv is None else RetentionPolicy.from_dict(kv.value, key)


class RetentionPolicies:
    """The namespaces' retention policies, each read at most once per `ttl` seconds: the
    topics of a broker share it, so their periodic passes do not read the same key each."""

    def __init__(self, store: MetadataStore, clock: Clock, ttl: float) -> None:
        self._store = store
        self._clock = clock
        self._ttl = ttl
        self._cache: dict[str, tuple[float, RetentionPolicy]] = {}

    async def get(self, namespace: str) -> RetentionPolicy:
        """The namespace's policy (`load_policy`), from the cache while it is fresh."""
        now = self._clock.now()
        cached = self._cache.get(namespace)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        policy = await load_policy(self._store, namespace)
        self._cache[namespace] = (now, policy)
        return policy


async def lowest_cursor(store: MetadataStore, topic: TopicName) -> int | None:
    """The lowest subscription cursor of `topic` in the metadata store (None: none).

    A cursor that cannot be read counts as -1: it holds everything back rather than let
    retention delete what that subscription may need.
    """
    listing = await store.get_prefix(keys.subscriptions_prefix(topic))
    lowest: int | None = None
    for item in listing.items:
        if not item.key.endswith("/cursor"):
            continue
        try:
            cursor = parse_cursor(item.value, item.key)
        except CursorError:
            cursor = -1
        lowest = cursor if lowest is None else min(lowest, cursor)
    if listing.undecodable:
        lowest = -1
    return lowest
