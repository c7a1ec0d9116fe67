"""Reliable-topic storage: WAL, object storage, uploader, seal, tiered reads and cursors.

The public API is re-exported here; see `ReliableTopic` for the facade a broker uses.
"""

from ballast.storage.catalog import (
    ObjectCatalog,
    ObjectDescriptor,
    StoredSize,
    load_catalog,
    stored_size,
)
from ballast.storage.codec import (
    Corruption,
    DecodeResult,
    Message,
    Record,
    RecordDecoder,
    decode_records,
    encode_record,
)
from ballast.storage.config import AckMode, FsyncPolicy, StorageConfig
from ballast.storage.cursor import AckRanges, CursorPosition, SubscriptionCursors
from ballast.storage.objects import (
    CorruptObjectError,
    FsspecObjectStore,
    ObjectBuilder,
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    read_object,
)
from ballast.storage.pacing import WritePacer
from ballast.storage.reader import Tier, TieredRecord, read_tiered
from ballast.storage.reservation import Handoff, ReservationError, TopicClaim
from ballast.storage.seal import Gap, SealedState, StartDecision, StartSource, choose_start
from ballast.storage.shared import ObjectStoreMismatchError, verify_shared_object_store
from ballast.storage.stats import StorageStats
from ballast.storage.stream import CommitStream
from ballast.storage.topic import (
    InitialPosition,
    OpenResult,
    ReliableTopic,
    SealError,
    Subscription,
    TopicFencedError,
    TopicStateError,
    TopicStatus,
)
from ballast.storage.uploader import DurabilityTimeoutError, UploadConflictError, Uploader
from ballast.storage.wal import (
    OffsetUnavailableError,
    WalClosedError,
    WalError,
    WalRecovery,
    WriteAheadLog,
)

__all__ = [
    "AckMode",
    "AckRanges",
    "CommitStream",
    "CorruptObjectError",
    "Corruption",
    "CursorPosition",
    "DecodeResult",
    "DurabilityTimeoutError",
    "FsspecObjectStore",
    "FsyncPolicy",
    "Gap",
    "Handoff",
    "InitialPosition",
    "Message",
    "ObjectBuilder",
    "ObjectCatalog",
    "ObjectDescriptor",
    "ObjectNotFoundError",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreMismatchError",
    "OffsetUnavailableError",
    "OpenResult",
    "Record",
    "RecordDecoder",
    "ReliableTopic",
    "ReservationError",
    "SealError",
    "SealedState",
    "StartDecision",
    "StartSource",
    "StorageConfig",
    "StorageStats",
    "StoredSize",
    "Subscription",
    "SubscriptionCursors",
    "Tier",
    "TieredRecord",
    "TopicClaim",
    "TopicFencedError",
    "TopicStateError",
    "TopicStatus",
    "UploadConflictError",
    "Uploader",
    "WalClosedError",
    "WalError",
    "WalRecovery",
    "WriteAheadLog",
    "WritePacer",
    "choose_start",
    "decode_records",
    "encode_record",
    "load_catalog",
    "read_object",
    "read_tiered",
    "stored_size",
    "verify_shared_object_store",
]
