"""`StoreCore`: etcd's semantics, synchronous and in memory.

The one implementation of what etcd keeps: a global revision counter, per-key create/mod
revision and version, an event log for replaying from a past revision (with compaction),
leases that expire on an injected clock, and atomic transactions. `MemoryStore` is its
asyncio shell (watches, lease keep-alives, the expiry timer); the simulator drives it
directly in virtual time. Both are held to the store contract suite.

Nothing here awaits or starts a task: each operation reads and writes state in one go, so
the shell's operations are atomic with respect to other asyncio tasks without a lock.
Expired leases are revoked at the start of every operation (`expire_due`); a shell that
must notice expiry while idle calls it at `next_deadline`.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ballast.metadata import _codec
from ballast.metadata.store import (
    CompactedError,
    Compare,
    Delete,
    KeyValue,
    LeaseNotFoundError,
    Listing,
    MetadataError,
    Put,
    TxnResult,
    ValueDecodeError,
    WatchEvent,
)

log = logging.getLogger(__name__)

DEFAULT_HISTORY_LIMIT = 100_000


@dataclass
class _Entry:
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int | None


@dataclass
class _LeaseState:
    id: int
    ttl: float
    deadline: float
    keys: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class LogEvent:
    """One change as logged: the stored bytes, decoded only for whoever watches the key."""

    kind: Literal["put", "delete"]
    key: str
    value: bytes | None
    revision: int

    def watch_event(self) -> WatchEvent:
        """The change as a watch sees it (an ``error`` event if the value is not JSON)."""
        if self.kind == "delete" or self.value is None:
            return WatchEvent("delete", self.key, None, self.revision)
        try:
            value = _codec.decode(self.value)
        except ValueError as exc:
            return WatchEvent(
                "error", self.key, None, self.revision, f"value at {self.key!r} is not JSON: {exc}"
            )
        return WatchEvent("put", self.key, value, self.revision)


# Called with the events of each committed change (one revision), in op order.
Listener = Callable[[Sequence[LogEvent]], None]


class StoreCore:
    """Keys, revisions, the event log and leases; `now` is the clock leases expire on.

    `history_limit` bounds the event log kept for replaying past revisions: when it is
    exceeded the oldest half is compacted away, as etcd's auto-compaction would.
    """

    def __init__(
        self, now: Callable[[], float], *, history_limit: int = DEFAULT_HISTORY_LIMIT
    ) -> None:
        if history_limit < 1:
            raise ValueError(f"history_limit must be >= 1, got {history_limit}")
        self._now = now
        self._history_limit = history_limit
        self._revision = 1  # etcd's first revision: an empty store reads at revision 1
        self._compact_revision = 0
        self._kvs: dict[str, _Entry] = {}
        self._sorted_keys: list[str] = []
        self._log: list[LogEvent] = []
        self._listeners: list[Listener] = []
        self._leases: dict[int, _LeaseState] = {}
        self._lease_ids = itertools.count(1)

    def __repr__(self) -> str:
        return f"StoreCore(revision={self._revision}, keys={len(self._kvs)})"

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` with every change committed from now on; returns the undo."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    # -- reads -------------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """The current store revision."""
        return self._revision

    def get(self, key: str) -> KeyValue | None:
        """The key, or None if absent. Raises `ValueDecodeError` if its value is not JSON."""
        _codec.check_key(key)
        self.expire_due()
        entry = self._kvs.get(key)
        return None if entry is None else self._key_value(key, entry)

    def get_many(self, keys: Sequence[str]) -> list[KeyValue | None]:
        """Each key or None, at one revision (see `MetadataStore.get_many`)."""
        _codec.check_keys(keys)
        return [self.get(key) for key in keys]

    def get_prefix(self, prefix: str) -> Listing:
        """Every key starting with `prefix`, sorted by key, at the current revision."""
        _codec.check_prefix(prefix)
        self.expire_due()
        items: list[KeyValue] = []
        undecodable: list[ValueDecodeError] = []
        for key in self._keys_with_prefix(prefix):
            try:
                items.append(self._key_value(key, self._kvs[key]))
            except ValueDecodeError as exc:
                undecodable.append(exc)
        return Listing(items, self._revision, undecodable)

    def _key_value(self, key: str, entry: _Entry) -> KeyValue:
        try:
            value = _codec.decode(entry.value)
        except ValueError as exc:
            raise ValueDecodeError(key, str(exc)) from exc
        return KeyValue(
            key, value, entry.create_revision, entry.mod_revision, entry.version, entry.lease
        )

    def _keys_with_prefix(self, prefix: str) -> list[str]:
        start = bisect.bisect_left(self._sorted_keys, prefix)
        out: list[str] = []
        for key in itertools.islice(self._sorted_keys, start, None):
            if not key.startswith(prefix):
                break
            out.append(key)
        return out

    # -- writes ------------------------------------------------------------------------------

    def put(self, key: str, value: Any, lease: int | None = None) -> int:
        """Write `value` (JSON) at `key`; returns the new revision."""
        return self.put_raw(key, _codec.encode(key, value), lease)

    def put_raw(self, key: str, data: bytes, lease: int | None = None) -> int:
        """Write raw bytes (possibly not JSON). For tools and tests of bad input."""
        _codec.check_key(key)
        self.expire_due()
        self._check_lease(lease)
        events: list[LogEvent] = []
        self._apply_put(key, data, lease, self._revision + 1, events)
        return self._commit(events)

    def delete(self, key: str) -> bool:
        """Delete `key`; True if it existed."""
        _codec.check_key(key)
        self.expire_due()
        events: list[LogEvent] = []
        self._apply_delete(key, self._revision + 1, events)
        self._commit(events)
        return bool(events)

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with `prefix` at one revision; returns the count."""
        _codec.check_prefix(prefix)
        self.expire_due()
        events: list[LogEvent] = []
        revision = self._revision + 1
        for key in self._keys_with_prefix(prefix):
            self._apply_delete(key, revision, events)
        self._commit(events)
        return len(events)

    def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult:
        """Atomically apply `success` if every compare holds, else `failure`."""
        for c in compare:
            _codec.check_compare(c)
        _codec.check_ops(success)
        _codec.check_ops(failure)
        self.expire_due()
        succeeded = all(self._holds(c) for c in compare)
        ops = success if succeeded else failure
        # Encode and check leases before touching state, so a bad op changes nothing.
        encoded = [
            (op, _codec.encode(op.key, op.value) if isinstance(op, Put) else b"") for op in ops
        ]
        for op, _ in encoded:
            if isinstance(op, Put):
                self._check_lease(op.lease)
        events: list[LogEvent] = []
        revision = self._revision + 1
        for op, data in encoded:
            if isinstance(op, Put):
                self._apply_put(op.key, data, op.lease, revision, events)
            elif op.prefix:
                for key in self._keys_with_prefix(op.key):
                    self._apply_delete(key, revision, events)
            else:
                self._apply_delete(op.key, revision, events)
        return TxnResult(succeeded, self._commit(events))

    def _holds(self, compare: Compare) -> bool:
        entry = self._kvs.get(compare.key)
        if compare.target == "value":
            if entry is None:
                return False  # as in etcd: a value compare on a missing key is false
            operand = _codec.encode(compare.key, compare.operand)
            return _codec.compare_values(entry.value, compare.op, operand)
        actual = 0
        if entry is not None:
            actual = {
                "version": entry.version,
                "create_revision": entry.create_revision,
                "mod_revision": entry.mod_revision,
            }[compare.target]
        return _codec.compare_values(actual, compare.op, compare.operand)

    def _apply_put(
        self, key: str, data: bytes, lease: int | None, revision: int, events: list[LogEvent]
    ) -> None:
        old = self._kvs.get(key)
        if old is None:
            bisect.insort(self._sorted_keys, key)
            entry = _Entry(data, revision, revision, 1, lease)
        else:
            self._unbind(key, old.lease)
            entry = _Entry(data, old.create_revision, revision, old.version + 1, lease)
        self._kvs[key] = entry
        if lease is not None:
            self._leases[lease].keys.add(key)
        events.append(LogEvent("put", key, data, revision))

    def _apply_delete(self, key: str, revision: int, events: list[LogEvent]) -> None:
        old = self._kvs.pop(key, None)
        if old is None:
            return
        del self._sorted_keys[bisect.bisect_left(self._sorted_keys, key)]
        self._unbind(key, old.lease)
        events.append(LogEvent("delete", key, None, revision))

    def _unbind(self, key: str, lease: int | None) -> None:
        if lease is not None and lease in self._leases:
            self._leases[lease].keys.discard(key)

    def _commit(self, events: list[LogEvent]) -> int:
        """Advance the revision if anything changed, log the events and tell the listeners."""
        if not events:
            return self._revision
        self._revision = events[0].revision
        self._log.extend(events)
        for listener in list(self._listeners):
            listener(events)
        if len(self._log) > self._history_limit:
            # Keep the newer half; cut on a revision boundary so no revision is split.
            self._compact_to(self._log[len(self._log) // 2].revision)
        return self._revision

    # -- history -----------------------------------------------------------------------------

    def compact(self, revision: int) -> None:
        """Forget history before `revision`; replaying from an earlier revision then fails."""
        self.expire_due()
        if revision > self._revision:
            raise MetadataError(
                f"cannot compact to revision {revision}: the store is at {self._revision}"
            )
        if revision <= self._compact_revision:
            raise CompactedError(revision, self._compact_revision)
        self._compact_to(revision)

    def _compact_to(self, revision: int) -> None:
        cut = bisect.bisect_left(self._log, revision, key=lambda e: e.revision)
        del self._log[:cut]
        self._compact_revision = revision

    def replay(self, prefix: str, start: int) -> list[LogEvent]:
        """The logged changes under `prefix` from revision `start` on; raises
        `CompactedError` if `start` is before the compaction point."""
        _codec.check_prefix(prefix)
        if start < self._compact_revision:
            raise CompactedError(start, self._compact_revision)
        first = bisect.bisect_left(self._log, start, key=lambda e: e.revision)
        return [e for e in itertools.islice(self._log, first, None) if e.key.startswith(prefix)]

    # -- leases ------------------------------------------------------------------------------

    def grant_lease(self, ttl: float) -> int:
        """Grant a lease of `ttl` seconds on the core's clock; returns its id."""
        if not ttl > 0:
            raise MetadataError(f"lease ttl must be > 0 seconds, got {ttl!r}")
        self.expire_due()
        lease_id = next(self._lease_ids)
        self._leases[lease_id] = _LeaseState(lease_id, ttl, self._now() + ttl)
        return lease_id

    def refresh_lease(self, lease_id: int) -> None:
        """Reset the lease's deadline to now + ttl; raises `LeaseNotFoundError` if gone."""
        self.expire_due()
        state = self._leases.get(lease_id)
        if state is None:
            raise LeaseNotFoundError(lease_id)
        state.deadline = self._now() + state.ttl

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease and delete its keys at one revision (unknown ids are ignored)."""
        self.expire_due()
        self._revoke(lease_id)

    def lease_time_to_live(self, lease_id: int) -> float | None:
        """Seconds left before the lease expires, or None if it does not exist."""
        self.expire_due()
        state = self._leases.get(lease_id)
        return None if state is None else max(0.0, state.deadline - self._now())

    def next_deadline(self) -> float | None:
        """When the next lease expires (None: no lease)."""
        return min((s.deadline for s in self._leases.values()), default=None)

    def expire_due(self) -> None:
        """Revoke every lease whose deadline has passed."""
        if not self._leases:
            return
        now = self._now()
        for lease_id in [i for i, s in self._leases.items() if s.deadline <= now]:
            log.info("lease %d expired", lease_id)
            self._revoke(lease_id)

    def _check_lease(self, lease: int | None) -> None:
        if lease is not None and lease not in self._leases:
            raise LeaseNotFoundError(lease)

    def _revoke(self, lease_id: int) -> None:
        state = self._leases.pop(lease_id, None)
        if state is None:
            return
        events: list[LogEvent] = []
        revision = self._revision + 1
        for key in sorted(state.keys):
            self._apply_delete(key, revision, events)
        self._commit(events)


def watch_log(core: StoreCore) -> list[WatchEvent]:
    """A list that receives every change committed to `core` from now on, as watch events:
    what a synchronous driver (the simulator, the scripted tests) reads in place of a
    watch, by position."""
    events: list[WatchEvent] = []
    core.listen(lambda changes: events.extend(e.watch_event() for e in changes))
    return events
