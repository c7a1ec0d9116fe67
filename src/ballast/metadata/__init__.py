"""Cluster metadata: the `MetadataStore` contract, its implementations and the key layout."""

from ballast.metadata.etcd import EtcdStore
from ballast.metadata.factory import open_store
from ballast.metadata.memory import MemoryStore
from ballast.metadata.store import (
    CompactedError,
    Compare,
    Delete,
    KeyValue,
    Lease,
    LeaseNotFoundError,
    Listing,
    MetadataError,
    MetadataStore,
    MetadataUnavailableError,
    OutcomeUnknownError,
    Put,
    TxnResult,
    ValueDecodeError,
    ValueEncodeError,
    Watch,
    WatchEvent,
)

__all__ = [
    "CompactedError",
    "Compare",
    "Delete",
    "EtcdStore",
    "KeyValue",
    "Lease",
    "LeaseNotFoundError",
    "Listing",
    "MemoryStore",
    "MetadataError",
    "MetadataStore",
    "MetadataUnavailableError",
    "OutcomeUnknownError",
    "Put",
    "TxnResult",
    "ValueDecodeError",
    "ValueEncodeError",
    "Watch",
    "WatchEvent",
    "open_store",
]
