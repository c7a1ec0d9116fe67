"""Salvage a crashed owner's WAL, so messages it acknowledged survive its death.

A reliable topic's owner acknowledges a send once it is in its local WAL; objects reach
the shared object store only every `upload_interval_seconds`. When the owner is killed,
the new owner continues after the crashed owner's offset reservation (no offset is ever
reused), but without more, the messages acknowledged since the last upload would be
skipped as a gap.

When the brokers share a disk (one machine, or a shared volume: WAL directories are
``{data_dir}/wal/{broker_id}/{namespace}/{topic}``), the new owner copies the crashed
owner's WAL of the topic into its own WAL directory before opening the topic. Opening
then recovers those segments exactly as if this broker had written them (torn tails cut,
checksums verified): the messages beyond the object catalog are kept, uploaded, and the
topic continues after the reservation. Without a shared disk nothing is copied and the
storage engine's rule applies (the unreadable part becomes a recorded gap).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

from ballast.metadata import MetadataError, MetadataStore, keys
from ballast.model import TopicName
from ballast.storage import SealedState
from ballast.storage.seal import StateError

__all__ = ["salvage_crashed_wal"]

log = logging.getLogger(__name__)


async def salvage_crashed_wal(
    store: MetadataStore, wal_root: Path, broker_id: str, topic: TopicName
) -> str | None:
    """Copy the crashed previous owner's WAL of `topic` here; its id if something was copied.

    Only an unsealed state written by another broker counts as a crash (a graceful move
    seals first, and then the object store holds everything).
    """
    try:
        kv = await store.get(keys.storage_state(topic))
    except MetadataError as exc:
        log.warning("%s: cannot read the state of %s to salvage a WAL: %s", broker_id, topic, exc)
        return None
    if kv is None:
        return None
    try:
        state = SealedState.from_dict(kv.value, keys.storage_state(topic))
    except StateError:
        return None
    if state.sealed or state.broker_id == broker_id:
        return None
    source = wal_root / state.broker_id / topic.namespace / topic.name
    target = wal_root / broker_id / topic.namespace / topic.name

    def copy() -> bool:
        if not source.is_dir() or not any(source.iterdir()):
            return False
        # Our own older segments of this topic are superseded: the crashed owner opened
        # the topic after us, so whatever we held is in objects or inside a recorded gap.
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, target)
        return True

    try:
        copied = await asyncio.to_thread(copy)
    except OSError as exc:
        log.warning("%s: cannot salvage the WAL of %s from %s: %s", broker_id, topic, source, exc)
        return None
    if copied:
        log.info("%s: salvaged the WAL of %s left by crashed %s", broker_id, topic, state.broker_id)
        return state.broker_id
    return None
