"""A synchronous in-memory key-value store with etcd's revision and compare semantics.

The simulator and the leader's scripted tests drive `LeaderMachine` against it: every
change gets a new revision (a transaction's changes share one), a missing key has version,
create revision and mod revision 0, and `drive` performs a `Ready`'s writes here exactly as
the live shell performs them on etcd, feeding each outcome back to the machine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ballast.leader import Event, LeaderMachine, Ready, Refreshed, WriteDone
from ballast.metadata import Compare, Delete, KeyValue, Listing, Put, TxnResult, WatchEvent


class SimStore:
    """Keys, revisions and the log of every change (as watch events)."""

    def __init__(self) -> None:
        self.data: dict[str, KeyValue] = {}
        self.revision = 0
        self.events: list[WatchEvent] = []

    def get(self, key: str) -> KeyValue | None:
        return self.data.get(key)

    def listing(self, prefix: str) -> Listing:
        items = [kv for key, kv in sorted(self.data.items()) if key.startswith(prefix)]
        return Listing(items, self.revision)

    def put(self, key: str, value: Any) -> int:
        self.revision += 1
        self._put(key, value)
        return self.revision

    def delete(self, key: str) -> int:
        self.revision += 1
        self._delete(key)
        return self.revision

    def delete_prefix(self, prefix: str) -> int:
        self.revision += 1
        for key in [k for k in self.data if k.startswith(prefix)]:
            self._delete(key)
        return self.revision

    def txn(self, compares: Sequence[Compare], ops: Sequence[Put | Delete]) -> TxnResult:
        if not all(self._holds(c) for c in compares):
            return TxnResult(False, self.revision)
        self.revision += 1
        for op in ops:
            if isinstance(op, Put):
                self._put(op.key, op.value)
            elif op.prefix:
                for key in [k for k in self.data if k.startswith(op.key)]:
                    self._delete(key)
            else:
                self._delete(op.key)
        return TxnResult(True, self.revision)

    def _put(self, key: str, value: Any) -> None:
        old = self.data.get(key)
        self.data[key] = KeyValue(
            key,
            value,
            old.create_revision if old else self.revision,
            self.revision,
            old.version + 1 if old else 1,
        )
        self.events.append(WatchEvent("put", key, value, self.revision))

    def _delete(self, key: str) -> None:
        if self.data.pop(key, None) is not None:
            self.events.append(WatchEvent("delete", key, None, self.revision))

    def _holds(self, c: Compare) -> bool:
        kv = self.data.get(c.key)
        if c.target == "value":
            if kv is None:
                return False
            left: Any = json.dumps(kv.value, sort_keys=True)
            right: Any = json.dumps(c.operand, sort_keys=True)
        else:
            left = 0 if kv is None else getattr(kv, c.target)
            right = c.operand
        if c.op == "==":
            return bool(left == right)
        if c.op == "!=":
            return bool(left != right)
        if c.op == ">":
            return bool(left > right)
        return bool(left < right)


def drive(
    machine: LeaderMachine,
    store: SimStore,
    ready: Ready,
    now: float,
    *,
    fence: Iterable[Compare] = (),
    on_ready: Callable[[Ready], None] | None = None,
    inputs: list[Event] | None = None,
) -> list[Ready]:
    """Perform `ready`'s writes on `store` and feed their outcomes back until the machine
    asks for nothing more; return every `Ready` (the first one included), in order. Each
    outcome fed to the machine is appended to `inputs` (a record for replays)."""
    fence = tuple(fence)
    done: list[Ready] = []
    queue = [ready]
    while queue:
        current = queue.pop(0)
        done.append(current)
        if on_ready is not None:
            on_ready(current)
        for write in current.writes:
            result = store.txn([*fence, *write.compares], write.ops)
            if result.succeeded:
                outcome = WriteDone(write.id, True, result.revision, now)
            else:
                fresh = []
                for key in write.touched_keys():
                    kv = store.get(key)
                    if kv is None:
                        fresh.append(Refreshed(key, present=False))
                    else:
                        fresh.append(Refreshed(key, kv.value, kv.mod_revision))
                outcome = WriteDone(write.id, False, 0, now, tuple(fresh))
            if inputs is not None:
                inputs.append(outcome)
            queue.append(machine.step(outcome))
    return done
