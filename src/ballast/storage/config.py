"""Tuning of the reliable-topic storage engine: one frozen value, validated on creation."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["AckMode", "FsyncPolicy", "StorageConfig"]

MiB = 1024 * 1024


class FsyncPolicy(StrEnum):
    """When the WAL forces its writes to stable storage.

    - ``batch``: every group-commit batch is fsynced before its appends are acknowledged
      (survives power loss).
    - ``interval``: batches are written to the OS before acknowledgement (survive a
      process crash) and fsynced every `fsync_interval_seconds`.
    - ``never``: written to the OS before acknowledgement, fsynced only on seal/close.
    """

    BATCH = "batch"
    INTERVAL = "interval"
    NEVER = "never"


class AckMode(StrEnum):
    """When a reliable topic acknowledges a send.

    - ``durable``: once the record is in the object store and committed under the topic's
      claim. Nothing acknowledged is lost with a broker, its disk or its host.
    - ``local``: once the record is in the local WAL (per `FsyncPolicy`); the upload follows
      at once, in the background. Faster, but what is acknowledged and not yet committed
      lives on one disk: it is lost if that host or disk is lost, or if this broker is
      fenced (a stalled owner replaced) before it commits. One writer still holds: a fenced
      owner's records are never committed, so no reader ever sees two histories.
    """

    DURABLE = "durable"
    LOCAL = "local"


@dataclass(frozen=True)
class StorageConfig:
    """Every knob of the WAL, the uploader and the subscription cursors."""

    fsync_policy: FsyncPolicy = FsyncPolicy.BATCH
    ack: AckMode = AckMode.DURABLE
    fsync_interval_seconds: float = 1.0
    segment_bytes: int = 64 * MiB
    cache_messages: int = 8192
    # The read cache is bounded in bytes too (payload + key): big messages fill it first.
    cache_bytes: int = 32 * MiB
    retention_seconds: float = 600.0
    index_interval_bytes: int = 64 * 1024
    read_batch_bytes: int = 1 * MiB
    # A send is acknowledged once committed to object storage (see `uploader`): every
    # WAL commit is uploaded at once, and the small objects this makes are merged into one
    # every `upload_interval_seconds` or once `merge_objects` of them wait.
    upload_interval_seconds: float = 30.0
    upload_threshold_bytes: int = 8 * MiB  # without a claim only: the background mover
    max_object_bytes: int = 16 * MiB
    merge_objects: int = 100  # one transaction (etcd allows 128 operations)
    # The uploader waits this long after writing an object before the next one, so that
    # a busy topic commits fuller batches (at most this much added latency; a topic with
    # one sender at a time never waits).
    commit_linger_seconds: float = 0.003
    # While topics send together, the commit stream's next object and next transaction
    # wait this long for the other topics' parts and commits. Shorter than a topic's own
    # linger: each send passes two of these waits, and 3 ms cost 32 single-sender topics
    # 13-24 % of their msg/s against 1 ms, measured side by side (`CommitStream`).
    stream_linger_seconds: float = 0.001
    # Object writes per second of a whole broker (every topic's uploader shares one
    # `WritePacer`): beyond it objects get fuller, not more numerous.
    max_object_writes_per_second: float = 500.0
    merge_grace_seconds: float = 30.0  # merged objects are deleted this long after
    # A shared object (several topics' parts) that no topic refers to any more and that a
    # restart or a move kept its writer from deleting at once goes after this long.
    shared_object_grace_seconds: float = 3600.0
    # Descriptor keys a topic may have in the metadata store before the older ones move
    # into its index object (a quarter of this many stay keys).
    catalog_keys: int = 64
    ack_timeout_seconds: float = 30.0  # an append not committed by then fails (not acked)
    upload_retry_initial_seconds: float = 0.05
    upload_retry_max_seconds: float = 5.0
    cursor_flush_seconds: float = 5.0
    cursor_flush_acks: int = 1000
    # Ranges of offsets acked above a cursor written with it, the lowest first (4 096
    # ranges are at most ~180 KiB, far below etcd's 1.5 MiB request limit); acks beyond
    # them are delivered again after a move, never skipped.
    cursor_ack_ranges: int = 4096
    # Offsets the owner may assign beyond the last one without another metadata write. The
    # reservation is extended (one fenced write) when less than half a step is left, so
    # appends do not wait for it; a crashed owner's successor continues past it.
    offset_reservation_step: int = 10_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "fsync_policy", FsyncPolicy(self.fsync_policy))
        object.__setattr__(self, "ack", AckMode(self.ack))
        positive = {
            "fsync_interval_seconds": self.fsync_interval_seconds,
            "segment_bytes": self.segment_bytes,
            "cache_messages": self.cache_messages,
            "cache_bytes": self.cache_bytes,
            "index_interval_bytes": self.index_interval_bytes,
            "read_batch_bytes": self.read_batch_bytes,
            "upload_interval_seconds": self.upload_interval_seconds,
            "upload_threshold_bytes": self.upload_threshold_bytes,
            "max_object_bytes": self.max_object_bytes,
            "merge_objects": self.merge_objects,
            "max_object_writes_per_second": self.max_object_writes_per_second,
            "merge_grace_seconds": self.merge_grace_seconds,
            "shared_object_grace_seconds": self.shared_object_grace_seconds,
            "catalog_keys": self.catalog_keys,
            "ack_timeout_seconds": self.ack_timeout_seconds,
            "upload_retry_initial_seconds": self.upload_retry_initial_seconds,
            "upload_retry_max_seconds": self.upload_retry_max_seconds,
            "cursor_flush_seconds": self.cursor_flush_seconds,
            "cursor_flush_acks": self.cursor_flush_acks,
            "cursor_ack_ranges": self.cursor_ack_ranges,
            "offset_reservation_step": self.offset_reservation_step,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"storage config {name}: must be > 0, got {value!r}")
        if isinstance(self.offset_reservation_step, bool) or not isinstance(
            self.offset_reservation_step, int
        ):
            raise ValueError(
                "storage config offset_reservation_step: must be an integer, "
                f"got {self.offset_reservation_step!r}"
            )
        if self.retention_seconds < 0:
            raise ValueError(
                f"storage config retention_seconds: must be >= 0, got {self.retention_seconds!r}"
            )
        if self.upload_retry_max_seconds < self.upload_retry_initial_seconds:
            raise ValueError(
                "storage config upload_retry_max_seconds: must be >= "
                f"upload_retry_initial_seconds ({self.upload_retry_initial_seconds})"
            )
