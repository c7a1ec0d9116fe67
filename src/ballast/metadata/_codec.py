"""JSON encoding and transaction checks shared by both stores, so they agree byte for byte."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ballast.metadata.store import (
    MAX_TXN_OPS,
    Compare,
    Delete,
    MetadataError,
    Put,
    ValueEncodeError,
)

_COMPARE_TARGETS = ("value", "version", "create_revision", "mod_revision")
_COMPARE_OPS = ("==", "!=", "<", ">")


def encode(key: str, value: Any) -> bytes:
    """Encode `value` as compact JSON with sorted keys.

    Sorted keys make the encoding deterministic, which `Compare.value_equals` relies on:
    two equal documents always compare equal as stored bytes.
    """
    try:
        text = json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueEncodeError(key, str(exc)) from exc
    return text.encode("utf-8")


def decode(data: bytes) -> Any:
    """Decode stored bytes; raises `ValueError` (incl. `UnicodeDecodeError`) when not JSON."""
    return json.loads(data.decode("utf-8"))


def check_key(key: str) -> bytes:
    """Validate a key (non-empty str) and return its UTF-8 bytes."""
    if not isinstance(key, str) or not key:
        raise MetadataError(f"invalid key {key!r}: expected a non-empty string")
    return key.encode("utf-8")


def check_keys(keys: Sequence[str]) -> list[bytes]:
    """Validate the keys of one read (each as `check_key`; at most `MAX_TXN_OPS`)."""
    if len(keys) > MAX_TXN_OPS:
        raise MetadataError(
            f"{len(keys)} keys in one read: at most {MAX_TXN_OPS} (etcd's operations per "
            "transaction)"
        )
    return [check_key(key) for key in keys]


def check_prefix(prefix: str) -> bytes:
    """Validate a prefix (non-empty str: an empty prefix would address the whole store)."""
    if not isinstance(prefix, str) or not prefix:
        raise MetadataError(f"invalid prefix {prefix!r}: expected a non-empty string")
    return prefix.encode("utf-8")


def check_compare(compare: Compare) -> None:
    """Reject a malformed compare before it reaches a store."""
    check_key(compare.key)
    if compare.target not in _COMPARE_TARGETS:
        raise MetadataError(
            f"compare on {compare.key!r}: unknown target {compare.target!r} "
            f"(expected one of {', '.join(_COMPARE_TARGETS)})"
        )
    if compare.op not in _COMPARE_OPS:
        raise MetadataError(
            f"compare on {compare.key!r}: unknown operator {compare.op!r} "
            f"(expected one of {' '.join(_COMPARE_OPS)})"
        )
    if compare.target != "value" and (
        not isinstance(compare.operand, int) or isinstance(compare.operand, bool)
    ):
        raise MetadataError(
            f"compare on {compare.key!r}: {compare.target} operand must be an int, "
            f"got {compare.operand!r}"
        )


def check_ops(ops: Sequence[Put | Delete]) -> None:
    """Reject a transaction branch that etcd would refuse, so both stores behave alike.

    etcd rejects a branch that puts the same key twice, or puts a key that one of its
    deletes also covers ("duplicate key given in txn request").
    """
    put_keys: set[str] = set()
    deletes: list[Delete] = []
    for op in ops:
        if isinstance(op, Put):
            check_key(op.key)
            if op.key in put_keys:
                raise MetadataError(f"transaction puts {op.key!r} twice; merge the two puts")
            put_keys.add(op.key)
        elif isinstance(op, Delete):
            check_key(op.key)
            deletes.append(op)
        else:
            raise MetadataError(f"unknown transaction operation {op!r}: expected Put or Delete")
    for d in deletes:
        for key in put_keys:
            if key == d.key or (d.prefix and key.startswith(d.key)):
                raise MetadataError(
                    f"transaction both deletes and puts {key!r}; split it into two steps"
                )


def compare_values(actual: Any, op: str, operand: Any) -> bool:
    """Apply a compare operator to two values of the same kind (ints or bytes)."""
    if op == "==":
        return bool(actual == operand)
    if op == "!=":
        return bool(actual != operand)
    if op == "<":
        return bool(actual < operand)
    return bool(actual > operand)
