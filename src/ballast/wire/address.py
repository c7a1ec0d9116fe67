"""Addresses a port is given and what it accepts: shared by the broker's and the gateway's
client ports."""

from __future__ import annotations

import ipaddress

__all__ = ["MAX_RECEIVE_BYTES", "is_loopback", "split_url"]

# What the gateway accepts and forwards (a broker refuses above its
# `data_plane.max_request_bytes`).
MAX_RECEIVE_BYTES = 64 * 1024 * 1024


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def split_url(url: str) -> tuple[str, int]:
    """(host, port) of ``host:port`` or ``http://host:port``; ValueError names the problem."""
    rest = url.split("://", 1)[1] if "://" in url else url
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"broker_url {url!r}: expected host:port (port 0 picks a free one)")
    return host, int(port)
