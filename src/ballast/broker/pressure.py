"""What a topic's limits cost it, as `ballast admin topics describe` shows it.

The owner publishes, every sweep and only when they changed, the figures of each topic
that felt its limits: bytes held against `topic_budget_bytes`, sends refused for a full
budget, and per subscription the bytes read ahead and the messages dropped. They live at
``/pressure/{ns}/{topic}`` (outside ``/topics/``, so that the leader is not woken), stamped
with the broker and the time.
"""

from __future__ import annotations

from typing import Any

from ballast.broker.budgets import ByteBudgets
from ballast.broker.topics import ServedTopic

__all__ = ["topic_figures"]


def topic_figures(served: ServedTopic, budgets: ByteBudgets) -> dict[str, Any] | None:
    """The topic's figures, or None when it never felt a limit (nothing to publish)."""
    subscriptions = {
        name: {"buffered_bytes": d.buffered_bytes, "dropped": d.dropped}
        for name, d in sorted(served.subscriptions.items())
        if d.buffered_bytes or d.dropped
    }
    held = budgets.held.get(served.name, 0)
    refused = budgets.refused.get(served.name, 0)
    if not (subscriptions or held or refused):
        return None
    return {
        "held_bytes": held,
        "topic_budget_bytes": budgets.topic_limit,
        "refused_sends": refused,
        "subscriptions": subscriptions,
    }
