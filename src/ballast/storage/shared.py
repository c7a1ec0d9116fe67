"""Every broker of a cluster must read the same object store: checked when a broker starts.

Reliable topics move between brokers, and the new owner reads what the old one committed
to object storage. Two brokers whose object stores differ (the per-directory default on
two hosts, a typo in a bucket name) would each commit where the other cannot read, and a
move would lose every acknowledged message. So the first broker writes a probe object
into its store and records it, with the store's URL, at ``keys.OBJECT_STORE``; every
later broker reads that probe from its own store and refuses to start if it cannot, with
an error naming both locations and the setting to change.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ballast.clock import Clock
from ballast.metadata import keys
from ballast.metadata.store import MetadataStore
from ballast.storage.objects import ObjectNotFoundError, ObjectStore, ObjectStoreError

__all__ = ["ObjectStoreMismatchError", "verify_shared_object_store"]

log = logging.getLogger(__name__)

PROBE_PREFIX = "_ballast/probe-"
_ATTEMPTS = 5  # an unreachable store is retried briefly before the broker gives up


class ObjectStoreMismatchError(RuntimeError):
    """This broker's object store is not the one the cluster uses (or is unreachable)."""


async def verify_shared_object_store(
    metadata: MetadataStore, objects: ObjectStore, broker_id: str, clock: Clock
) -> None:
    """Check that `objects` is the cluster's object store; record it if none is yet.

    Raises `ObjectStoreMismatchError` naming this broker's store, the cluster's, and the
    `storage.object_store` setting.
    """
    recorded = await metadata.get(keys.OBJECT_STORE)
    if recorded is None:
        token = uuid.uuid4().hex
        probe = f"{PROBE_PREFIX}{token}"
        await _retrying(lambda: objects.put(probe, token.encode()), objects, "write a probe to")
        value: dict[str, Any] = {
            "url": location(objects.url),
            "probe": probe,
            "token": token,
            "broker_id": broker_id,
            "timestamp": clock.now(),
        }
        if await metadata.create_if_absent(keys.OBJECT_STORE, value):
            log.info("%s: the cluster's object store is %s", broker_id, value["url"])
            return
        recorded = await metadata.get(keys.OBJECT_STORE)  # another broker was first
        if recorded is None:
            raise ObjectStoreMismatchError(f"{keys.OBJECT_STORE} vanished while starting; retry")
    record = recorded.value
    if not isinstance(record, Mapping) or not all(
        isinstance(record.get(k), str) for k in ("url", "probe", "token")
    ):
        raise ObjectStoreMismatchError(
            f"{keys.OBJECT_STORE}: malformed record {record!r}; delete that key and restart"
        )
    try:
        found = await _retrying(
            lambda: objects.get(record["probe"]), objects, "read the probe from"
        )
    except ObjectNotFoundError:
        found = None
    if found != record["token"].encode():
        raise ObjectStoreMismatchError(_mismatch(broker_id, location(objects.url), record))


def location(url: str) -> str:
    """`url` as another host's operator can tell it apart: a local path made absolute and
    named with its host (two hosts' ``./ballast-data/objects`` are different stores)."""
    if "://" in url and not url.startswith("file://"):
        return url
    path = Path(url.removeprefix("file://")).resolve()
    return f"{path} on host {socket.gethostname()}"


def _mismatch(broker_id: str, url: str, value: Mapping[str, Any]) -> str:
    return (
        f"broker {broker_id}: its object store {url} is not the cluster's object store "
        f"{value['url']} (first used by broker {value.get('broker_id', '?')}): the probe "
        f"object {value['probe']} is not there. Reliable topics move between brokers, so "
        "every broker must use the same object store: set storage.object_store in this "
        "broker's configuration to the shared store (a directory every host mounts, or an "
        "s3:// URL); the default, {data_dir}/objects, is local to one "
        f"machine. If the cluster's store really moved, delete {keys.OBJECT_STORE} first "
        f"(etcdctl del {keys.OBJECT_STORE})."
    )


async def _retrying(op: Any, objects: ObjectStore, what: str) -> Any:
    delay = 0.2
    for attempt in range(_ATTEMPTS):
        try:
            return await op()
        except ObjectNotFoundError:
            raise
        except ObjectStoreError as exc:
            if attempt + 1 == _ATTEMPTS:
                raise ObjectStoreMismatchError(
                    f"cannot {what} the object store {objects.url}: {exc}"
                ) from exc
            await asyncio.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")
