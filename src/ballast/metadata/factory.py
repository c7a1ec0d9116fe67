"""`open_store`: pick the metadata store from configuration (embedded or etcd)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ballast.clock import Clock
from ballast.config import ConnectionSettings
from ballast.metadata.etcd import EtcdStore
from ballast.metadata.memory import MemoryStore
from ballast.metadata.store import MetadataStore

MEMORY_URLS = ("memory", "memory://")


def open_store(
    url_or_none: str | None = None,
    clock: Clock | None = None,
    *,
    ca_cert: str | Path | None = None,
    cert_key: str | Path | None = None,
    cert_cert: str | Path | None = None,
    username: str | None = None,
    password: str | None = None,
    timeout: float = 10.0,
    connections: ConnectionSettings | None = None,
    **etcd_options: Any,
) -> MetadataStore:
    """The store a configuration names.

    - None, ``"memory"`` or ``"memory://"``: an embedded `MemoryStore` on `clock`.
    - ``"http://h:2379,http://h2:2379"`` (or https): an `EtcdStore` on those endpoints, with
      the TLS / auth / timeout options passed through; options not given come from
      ``BALLAST_ETCD_CA``, ``BALLAST_ETCD_CERT``, ``BALLAST_ETCD_KEY``,
      ``BALLAST_ETCD_USER`` and ``BALLAST_ETCD_PASSWORD`` when set. etcd leases expire in
      real time, so `clock` does not apply to it. `connections` (the configuration's
      section) gives the keepalive that drops a silent etcd connection.
    """
    if url_or_none is None or url_or_none.strip().lower() in MEMORY_URLS:
        return MemoryStore(clock)
    url = url_or_none.strip()
    # Every command (broker, gateway, admin, demo) reaches a secured etcd the same way.
    env = os.environ
    ca_cert = ca_cert if ca_cert is not None else env.get("BALLAST_ETCD_CA") or None
    cert_cert = cert_cert if cert_cert is not None else env.get("BALLAST_ETCD_CERT") or None
    cert_key = cert_key if cert_key is not None else env.get("BALLAST_ETCD_KEY") or None
    username = username if username is not None else env.get("BALLAST_ETCD_USER") or None
    password = password if password is not None else env.get("BALLAST_ETCD_PASSWORD") or None
    if not url.startswith(("http://", "https://")):
        raise ValueError(
            f"metadata store {url_or_none!r}: expected 'memory' or etcd endpoints like "
            "'http://127.0.0.1:2379,http://10.0.0.2:2379'"
        )
    if connections is not None:
        etcd_options.setdefault("keepalive", connections.keepalive_seconds)
        etcd_options.setdefault("keepalive_timeout", connections.keepalive_timeout_seconds)
    return EtcdStore(
        url,
        ca_cert=ca_cert,
        cert_key=cert_key,
        cert_cert=cert_cert,
        username=username,
        password=password,
        timeout=timeout,
        **etcd_options,
    )
