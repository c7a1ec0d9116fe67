"""`CommitStream`: one broker's object writes and descriptor commits, for all its topics.

Each reliable topic's uploader packs what its WAL committed into an object and commits the
object's descriptor under its claim (see `uploader`). Done per topic, every busy topic pays
an object write and a metadata transaction of its own for each batch: with many topics,
the broker's writes and transactions grow with the number of topics, not with the bytes.
The stream gathers them instead, as a group commit across topics:

- **objects**: the parts that topics hand in while the previous object is being written
  go into the next object together, each part laid out as a whole object at its own byte
  range (`ObjectDescriptor.base`), so a reader fetches one topic's part by range. One part
  alone is written as the topic's own object, exactly as before. Writes are paced by the
  broker's `WritePacer`, one at a time; while topics send together each object (and each
  transaction) waits `stream_linger_seconds` for the others' parts.
- **commits**: the descriptor commits that topics hand in meanwhile go into one metadata
  transaction (`commit_together`: each topic's fence compared, split under etcd's limits);
  a topic fenced by a new owner fails alone.

An object shared by several topics is deleted by its writer once every part has been
merged or released by its topic (`release`). Parts merged or released after a move or a
restart of the writer are found by the writer's `sweep` (each shared object ends with a
manifest of its parts): an object no topic's catalog names is deleted once it is older
than `shared_object_grace_seconds`. An object is never deleted while referenced.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ballast.aio import cancel_and_wait
from ballast.clock import Clock
from ballast.metadata.store import MetadataStore, TxnOp
from ballast.model import TopicName
from ballast.storage.catalog import ObjectDescriptor, load_catalog
from ballast.storage.config import StorageConfig
from ballast.storage.objects import ObjectStore, ObjectStoreError, StoredObject
from ballast.storage.pacing import WritePacer
from ballast.storage.reservation import TopicClaim, claim_together, commit_together
from ballast.storage.seal import SealedState
from ballast.storage.stats import StorageStats
from ballast.storage.turns import Turns

__all__ = [
    "CommitStream",
    "ManifestError",
    "encode_manifest",
    "object_name",
    "read_manifest",
    "shared_object_name",
]

log = logging.getLogger(__name__)

# Objects being written at once. One: whatever topics hand in while it is written goes
# into the next one (group commit). Four at once, measured, made the objects smaller (each
# write took the parts of its moment alone), not the acknowledgements faster.
_WRITES_IN_FLIGHT = 1
SHARED_PREFIX = "_streams"  # no namespace starts with "_": never a topic's own directory


def object_name(topic: TopicName, start: int, end: int) -> str:
    """A fresh object name for one topic's range; the random part keeps retries apart."""
    return f"{topic.namespace}/{topic.name}/{start:020d}-{end:020d}-{uuid.uuid4().hex[:12]}.bobj"


def shared_object_name(broker_id: str) -> str:
    """A fresh name for an object holding parts of several topics."""
    return f"{SHARED_PREFIX}/{broker_id}/{uuid.uuid4().hex}.bobj"


# An object shared by several topics ends with a manifest of its parts, so that a sweep can
# tell whether any topic still refers to it: JSON, its length (4 bytes), this magic.
_MANIFEST_MAGIC = b"BLSTPRTS"
_MANIFEST_TAIL = struct.Struct(">I8s")


class ManifestError(ValueError):
    """A shared object's manifest is missing or malformed (the message names the object)."""


def encode_manifest(
    broker_id: str, described: Sequence[ObjectDescriptor], parts: Sequence[_Part]
) -> bytes:
    """The trailer of a shared object: which topic's offsets each part holds, and where."""
    body = json.dumps(
        {
            "broker": broker_id,
            "parts": [
                [str(part.topic), d.start, d.end, d.base, d.size]
                for part, d in zip(parts, described, strict=True)
            ],
        },
        separators=(",", ":"),
    ).encode()
    return body + _MANIFEST_TAIL.pack(len(body), _MANIFEST_MAGIC)


async def read_manifest(store: ObjectStore, stored: StoredObject) -> list[tuple[TopicName, int]]:
    """The (topic, start) of every part of a shared object, from its trailer."""
    name, size = stored.name, stored.size
    if size < _MANIFEST_TAIL.size:
        raise ManifestError(f"{name}: {size} bytes is too small for a shared object")
    length, magic = _MANIFEST_TAIL.unpack(await store.get(name, size - _MANIFEST_TAIL.size, size))
    if magic != _MANIFEST_MAGIC or length > size - _MANIFEST_TAIL.size:
        raise ManifestError(f"{name}: no manifest of parts at its end")
    end = size - _MANIFEST_TAIL.size
    try:
        parts = json.loads(await store.get(name, end - length, end))["parts"]
        return [(TopicName.parse(topic), int(start)) for topic, start, *_ in parts]
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(f"{name}: malformed manifest of parts: {exc}") from None


@dataclass
class _Part:
    topic: TopicName
    start: int
    end: int
    data: bytes
    done: asyncio.Future[ObjectDescriptor]


@dataclass
class _Commit:
    claim: TopicClaim
    ops: Sequence[TxnOp]
    done: asyncio.Future[None]


def _settle(
    waiters: Sequence[asyncio.Future[None]], results: Sequence[BaseException | None]
) -> None:
    """Each waiter's outcome: None (done) or the exception it failed with."""
    for done, result in zip(waiters, results, strict=True):
        if done.done():
            continue  # its requester gave up
        if result is None:
            done.set_result(None)
        else:
            done.set_exception(result)


@dataclass(frozen=True)
class _Claim:
    claim: TopicClaim
    expected_revision: int
    state: SealedState
    done: asyncio.Future[None]


class CommitStream:
    """The broker's group commit of objects and descriptors across topics.

    Its loops start with the first request and stop with `close()` (waiters still queued
    get `ObjectStoreError`: nothing of theirs was committed).
    """

    def __init__(
        self,
        objects: ObjectStore,
        metadata: MetadataStore,
        *,
        broker_id: str,
        clock: Clock,
        config: StorageConfig | None = None,
        stats: StorageStats | None = None,
        pacer: WritePacer | None = None,
    ) -> None:
        self._objects = objects
        self._metadata = metadata
        self._broker_id = broker_id
        self._clock = clock
        self._config = config or StorageConfig()
        self._stats = stats or StorageStats()
        self._pacer = pacer or WritePacer(self._config.max_object_writes_per_second)
        self._parts: list[_Part] = []
        self._commits: list[_Commit] = []
        self._claims: list[_Claim] = []
        self._wake_writer = asyncio.Event()
        self._wake_committer = asyncio.Event()
        self._wake_claimer = asyncio.Event()
        self._in_flight = asyncio.Semaphore(_WRITES_IN_FLIGHT)
        self.merges = Turns()  # the topics' merges, one reading at a time
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._closed = False
        self._shared_last = False  # the last object held several topics' parts
        self._together = False  # the last transaction held several topics' commits
        # Shared objects this broker wrote -> (topic, start) of the parts still referred to.
        self._refs: dict[str, set[tuple[TopicName, int]]] = {}

    # -- requests --------------------------------------------------------------------------

    async def write(self, topic: TopicName, start: int, end: int, data: bytes) -> ObjectDescriptor:
        """Write `data` (one topic's object for offsets start..end) in the next object;
        its descriptor once written. Raises `ObjectStoreError` (the caller retries)."""
        self._running()
        done: asyncio.Future[ObjectDescriptor] = asyncio.get_running_loop().create_future()
        self._parts.append(_Part(topic, start, end, data, done))
        self._wake_writer.set()
        return await done

    async def commit(self, claim: TopicClaim, ops: Sequence[TxnOp]) -> None:
        """`claim.commit(ops)` in the next shared transaction."""
        self._running()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._commits.append(_Commit(claim, ops, done))
        self._wake_committer.set()
        await done

    async def claim(self, claim: TopicClaim, expected_revision: int, state: SealedState) -> None:
        """`claim.claim(expected_revision, state)` in the next shared transaction: the
        topics a broker opens together (a failover, a drain) claim together."""
        self._running()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._claims.append(_Claim(claim, expected_revision, state, done))
        self._wake_claimer.set()
        await done

    async def release(self, topic: TopicName, descriptor: ObjectDescriptor) -> None:
        """`topic` no longer refers to its part `descriptor` of a shared object (merged
        or released, past the readers' grace): the object goes once no part is left."""
        refs = self._refs.get(descriptor.object_id)
        if refs is None:
            return  # written before a restart or by another broker: kept (see module doc)
        refs.discard((topic, descriptor.start))
        if refs:
            return
        del self._refs[descriptor.object_id]
        try:
            await self._objects.delete(descriptor.object_id)
        except ObjectStoreError as exc:
            log.warning("could not delete shared object %s: %s", descriptor.object_id, exc)

    async def sweep(self, now: float | None = None) -> int:
        """Delete the shared objects this broker wrote that no topic refers to any more
        and that are older than `shared_object_grace_seconds` (by the store's clock;
        `now`: the time to compare with). They are left behind when a part was merged or
        released by another owner after a move, or by this broker before a restart; no
        process can commit one of them any more (a previous incarnation is gone or fenced
        by the claims that followed). Returns how many were deleted."""
        now = time.time() if now is None else now
        grace = self._config.shared_object_grace_seconds
        deleted = 0
        catalogs: dict[TopicName, set[str]] = {}
        for stored in await self._objects.list(f"{SHARED_PREFIX}/{self._broker_id}/"):
            if stored.name in self._refs or not stored.modified or now - stored.modified < grace:
                continue
            try:
                parts = await read_manifest(self._objects, stored)
            except (ObjectStoreError, ManifestError) as exc:
                log.warning("sweep: %s is left alone: %s", stored.name, exc)
                continue
            referenced = False
            for topic in {topic for topic, _ in parts}:
                if topic not in catalogs:
                    catalog = await load_catalog(
                        self._metadata, topic, self._stats, objects=self._objects
                    )
                    catalogs[topic] = {d.object_id for d in catalog.objects}
                if stored.name in catalogs[topic]:
                    referenced = True
                    break
            if referenced:
                continue
            await self._objects.delete(stored.name)
            deleted += 1
            log.info("sweep: deleted %s (no topic refers to it)", stored.name)
        self._stats.shared_objects_swept += deleted
        return deleted

    async def _sweeper(self) -> None:
        """`sweep` every `shared_object_grace_seconds / 4`, for the broker's whole life."""
        while True:
            await self._clock.sleep(self._config.shared_object_grace_seconds / 4)
            try:
                await self.sweep()
            except Exception as exc:  # the store is down: the next round tries again
                log.warning("sweep of %s's shared objects failed: %s", self._broker_id, exc)

    # -- lifecycle -------------------------------------------------------------------------

    def _running(self) -> None:
        if self._closed:
            raise ObjectStoreError("the broker's commit stream is closed")
        if not self._loops:
            loop = asyncio.get_running_loop()
            self._loops = [
                loop.create_task(self._writer(), name=f"stream/{self._broker_id}/writer"),
                loop.create_task(self._committer(), name=f"stream/{self._broker_id}/committer"),
                loop.create_task(self._claimer(), name=f"stream/{self._broker_id}/claimer"),
                loop.create_task(self._sweeper(), name=f"stream/{self._broker_id}/sweeper"),
            ]

    async def close(self) -> None:
        """Stop the loops; requests still waiting fail (nothing of theirs committed)."""
        self._closed = True
        for task in [*self._loops, *self._tasks]:
            await cancel_and_wait(task)
        failure = ObjectStoreError("the broker's commit stream closed")
        waiting: list[asyncio.Future[Any]] = [
            *(part.done for part in self._parts),
            *(commit.done for commit in self._commits),
            *(claim.done for claim in self._claims),
        ]
        for done in waiting:
            if not done.done():
                done.set_exception(failure)
        self._parts.clear()
        self._commits.clear()
        self._claims.clear()

    # -- loops -----------------------------------------------------------------------------

    async def _writer(self) -> None:
        while True:
            await self._wake_writer.wait()
            self._wake_writer.clear()
            while self._parts:
                await self._in_flight.acquire()
                if await self._pacer.turn():
                    self._stats.object_write_waits += 1
                elif self._shared_last and self._config.stream_linger_seconds > 0:
                    # Topics were sending together: let the others' parts of this moment
                    # join (a lone topic never waits).
                    await asyncio.sleep(self._config.stream_linger_seconds)
                # Whatever arrived while waiting for a turn goes in this object too.
                parts = self._take_parts()
                self._shared_last = len(parts) > 1
                task = asyncio.get_running_loop().create_task(self._write(parts))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def _take_parts(self) -> list[_Part]:
        """The waiting parts, up to `max_object_bytes` (one part at least)."""
        taken, size = 0, 0
        for part in self._parts:
            if taken and size + len(part.data) > self._config.max_object_bytes:
                break
            taken += 1
            size += len(part.data)
        parts, self._parts = self._parts[:taken], self._parts[taken:]
        return parts

    async def _write(self, parts: list[_Part]) -> None:
        name = ""
        try:
            now = self._clock.now()
            if len(parts) == 1:
                part = parts[0]
                name = object_name(part.topic, part.start, part.end)
                await self._objects.put(name, part.data)
                described = [ObjectDescriptor(part.start, part.end, name, len(part.data), now)]
            else:
                name = shared_object_name(self._broker_id)
                described, base = [], 0
                for part in parts:
                    described.append(
                        ObjectDescriptor(part.start, part.end, name, len(part.data), now, base)
                    )
                    base += len(part.data)
                # Known before it exists: a sweep never takes an object being written.
                self._refs[name] = {(part.topic, part.start) for part in parts}
                manifest = encode_manifest(self._broker_id, described, parts)
                await self._objects.put(name, b"".join([*(p.data for p in parts), manifest]))
            self._stats.stream_objects += 1
            self._stats.stream_parts += len(parts)
            for part, descriptor in zip(parts, described, strict=True):
                if not part.done.done():
                    part.done.set_result(descriptor)
        except Exception as exc:  # every part fails; each uploader retries its own
            if len(parts) > 1:
                self._refs.pop(name, None)  # an orphan at most: the sweep takes it
            for part in parts:
                if not part.done.done():
                    part.done.set_exception(exc)
        finally:
            self._in_flight.release()

    async def _claimer(self) -> None:
        while True:
            await self._wake_claimer.wait()
            self._wake_claimer.clear()
            while self._claims:
                # An opening given up meanwhile (its topic unloaded) claims nothing.
                claims = [c for c in self._claims if not c.done.done()]
                self._claims = []
                if not claims:
                    continue
                try:
                    results = await claim_together(
                        self._metadata, [(c.claim, c.expected_revision, c.state) for c in claims]
                    )
                except Exception as exc:  # a bug here must not stop every topic's opening
                    log.exception("the commit stream's claim failed: %s", exc)
                    results = [exc] * len(claims)
                _settle([c.done for c in claims], results)

    async def _committer(self) -> None:
        while True:
            await self._wake_committer.wait()
            self._wake_committer.clear()
            while self._commits:
                if (
                    len(self._commits) == 1
                    and self._together
                    and self._config.stream_linger_seconds
                ):
                    await asyncio.sleep(self._config.stream_linger_seconds)  # as in `_writer`
                commits, self._commits = self._commits, []
                self._together = len(commits) > 1
                try:
                    results = await commit_together(
                        self._metadata, [(c.claim, c.ops) for c in commits], self._stats
                    )
                except Exception as exc:  # a bug here must not stop every topic's commits
                    log.exception("the commit stream's transaction failed: %s", exc)
                    results = [exc] * len(commits)
                _settle([c.done for c in commits], results)
