"""Prometheus service discovery from the metadata store's broker registrations.

Every broker registers its ``metrics_url`` (``http://host:port/metrics``, empty when its
metrics are off); `prometheus_targets` turns the registrations of a `ClusterView` into
Prometheus's file_sd / http_sd JSON: one target group per broker, labelled ``broker``
with its id (not ``broker_id``, which the per-broker series carry themselves).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from ballast.leader.view import ClusterView


def prometheus_targets(view: ClusterView) -> list[dict[str, Any]]:
    """``[{"targets": ["host:port"], "labels": {...}}]`` for every broker with metrics."""
    groups = []
    for broker in view.brokers():
        url = view.registrations[broker].metrics_url
        parts = urlsplit(url) if url else None
        if parts is None or not parts.hostname or not parts.port:
            continue  # metrics disabled, or a port 0 that was never resolved
        labels = {"broker": broker, "__metrics_path__": parts.path or "/metrics"}
        if parts.scheme and parts.scheme != "http":
            labels["__scheme__"] = parts.scheme
        groups.append({"targets": [parts.netloc], "labels": labels})
    return groups
