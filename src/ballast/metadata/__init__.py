"""Cluster metadata: the `MetadataStore` contract, its implementations and the key layout.

The stores are imported on first use (`EtcdStore` loads grpc and aetcd, `MemoryStore` the
asyncio shell): the pure layers (`leader/`, `balance/`, the simulator) use only the
contract's values, `keys` and the synchronous `core.StoreCore`, and importing them must
not load an etcd client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ballast.metadata.store import (
    MAX_TXN_OPS,
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

if TYPE_CHECKING:
    from ballast.metadata.etcd import EtcdStore
    from ballast.metadata.factory import open_store
    from ballast.metadata.memory import MemoryStore

_LAZY = {
    "EtcdStore": "ballast.metadata.etcd",
    "MemoryStore": "ballast.metadata.memory",
    "open_store": "ballast.metadata.factory",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


__all__ = [
    "MAX_TXN_OPS",
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
