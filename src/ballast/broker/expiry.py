"""Inactive subscriptions expire (``data_plane.subscription_expiry_seconds``, 0: never).

Like Pulsar's `subscriptionExpirationTimeMinutes`: a subscription with no consumer for
that long is removed with its reader, its buffers and its cursor, so names nobody uses
do not hold memory and metadata for ever. The clock starts when the broker first sees
the subscription without consumers (a move starts it again on the new owner).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["expired"]

SubKey = tuple[str, str]  # (topic, subscription)


def expired(
    idle_since: Mapping[SubKey, float],
    idle_now: Iterable[SubKey],
    now: float,
    after: float,
) -> tuple[dict[SubKey, float], list[SubKey]]:
    """(who is idle since when, who expires now) from the subscriptions idle right now."""
    since: dict[SubKey, float] = {}
    due: list[SubKey] = []
    for key in idle_now:
        start = idle_since.get(key, now)
        if now - start >= after:
            due.append(key)
        else:
            since[key] = start
    return since, sorted(due)
