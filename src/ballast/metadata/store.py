"""The metadata-store contract: value types, errors, leases and the `MetadataStore` protocol.

Both implementations (`EtcdStore` over etcd, `MemoryStore` in-process) follow the same
semantics, checked by one shared contract test suite:

- Values are JSON documents; the store encodes on write and decodes on read.
- Every write bumps one global revision. A key carries `create_revision`, `mod_revision`
  and `version` (number of writes since it was created), as in etcd.
- `watch_prefix(prefix, start_revision)` replays every change with a revision
  `>= start_revision` and then streams live changes, each exactly once, in revision order.
- Leases expire when not refreshed within their TTL; keys attached to an expired lease are
  deleted (and watchers see the deletes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol, Self, runtime_checkable

from ballast.aio import cancel_and_wait
from ballast.clock import Clock, SystemClock

log = logging.getLogger(__name__)

CompareTarget = Literal["value", "version", "create_revision", "mod_revision"]
CompareOp = Literal["==", "!=", "<", ">"]
WatchEventKind = Literal["put", "delete", "error", "compacted"]


@dataclass(frozen=True)
class KeyValue:
    """One key as read from the store; `value` is the decoded JSON document."""

    key: str
    value: Any
    create_revision: int
    mod_revision: int
    version: int
    lease: int | None = None


@dataclass(frozen=True)
class WatchEvent:
    """One change seen by a watch.

    - ``put`` / ``delete``: a key under the prefix changed at `revision`.
    - ``error``: a value under the prefix is not valid JSON; `key` names it, `error` says
      why. The watch keeps going.
    - ``compacted``: the requested start revision is no longer in the store's history; the
      owner must re-list (`get_prefix`) and watch again from the listing's revision + 1.
      The iterator ends after this event.
    """

    kind: WatchEventKind
    key: str
    value: Any | None
    revision: int
    error: str | None = None


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction: ``<target of key> <op> <operand>``.

    As in etcd, a missing key has version, create_revision and mod_revision 0, and a
    ``value`` comparison against a missing key is false.
    """

    key: str
    target: CompareTarget
    op: CompareOp
    operand: Any

    @classmethod
    def value_equals(cls, key: str, value: Any) -> Compare:
        """The key exists and holds exactly `value` (compared as encoded JSON)."""
        return cls(key, "value", "==", value)

    @classmethod
    def absent(cls, key: str) -> Compare:
        """The key does not exist (its version is 0)."""
        return cls(key, "version", "==", 0)

    @classmethod
    def present(cls, key: str) -> Compare:
        """The key exists (its version is above 0)."""
        return cls(key, "version", ">", 0)

    @classmethod
    def mod_revision_equals(cls, key: str, revision: int) -> Compare:
        """The key was last modified at `revision` (0 means: the key does not exist)."""
        return cls(key, "mod_revision", "==", revision)


@dataclass(frozen=True)
class Put:
    """Transaction operation: write `value` (JSON) at `key`, optionally bound to a lease."""

    key: str
    value: Any
    lease: int | None = None


@dataclass(frozen=True)
class Delete:
    """Transaction operation: delete `key`, or every key starting with it if `prefix`."""

    key: str
    prefix: bool = False


@dataclass(frozen=True)
class TxnResult:
    """Whether the compares held (success branch ran) and the store revision afterwards."""

    succeeded: bool
    revision: int


@dataclass(frozen=True)
class Listing:
    """A consistent read of a prefix; watch from `revision + 1` to miss nothing after it.

    Keys whose values are not JSON are left out of `items` and reported in `undecodable`
    (one `ValueDecodeError` each, naming the key), so one bad record never hides the rest.
    """

    items: list[KeyValue]
    revision: int
    undecodable: list[ValueDecodeError] = field(default_factory=list)


# etcd's default --max-txn-ops: operations in one transaction (reads included); every
# writer of several keys at once keeps under it.
MAX_TXN_OPS = 128


class MetadataError(Exception):
    """Any failure of the metadata store."""


class CompactedError(MetadataError):
    """The requested revision has been compacted away; re-list and start again."""

    def __init__(self, requested: int, compact_revision: int) -> None:
        super().__init__(
            f"revision {requested} has been compacted (oldest available is "
            f"{compact_revision + 1}); re-list the prefix and watch from the listing's "
            "revision + 1"
        )
        self.requested = requested
        self.compact_revision = compact_revision


class ValueDecodeError(MetadataError):
    """A stored value is not valid JSON. Names the key so an operator can fix or delete it."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(
            f"value at {key!r} is not valid JSON ({reason}); rewrite or delete that key"
        )
        self.key = key
        self.reason = reason


class ValueEncodeError(MetadataError):
    """A value given to the store cannot be encoded as JSON."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"value for {key!r} cannot be stored as JSON ({reason})")
        self.key = key
        self.reason = reason


class LeaseNotFoundError(MetadataError):
    """The lease does not exist (never granted, revoked, or already expired)."""

    def __init__(self, lease_id: int) -> None:
        super().__init__(f"lease {lease_id} does not exist (expired or revoked); grant a new lease")
        self.lease_id = lease_id


class MetadataUnavailableError(MetadataError):
    """No store endpoint answered in time; the request was not applied. Retry later."""


class OutcomeUnknownError(MetadataUnavailableError):
    """The connection failed after a conditional write was sent: it may or may not have been
    applied. Re-read the keys involved and decide again (never blindly retry a fenced write).
    """


class Lease:
    """A granted lease: keys bound to it vanish when it is revoked or not refreshed in time.

    `start_keep_alive()` refreshes the lease every ``ttl / 3`` seconds in a background task
    (sleeping through the store's clock) until `stop_keep_alive()` or `revoke()`. If a refresh
    finds the lease gone, the task ends and `lost` is set, so an owner (e.g. leader election)
    can await it and step down.
    """

    def __init__(
        self,
        lease_id: int,
        ttl: float,
        *,
        refresh: Callable[[int], Awaitable[None]],
        revoke: Callable[[int], Awaitable[None]],
        clock: Clock | None = None,
    ) -> None:
        self.id = lease_id
        self.ttl = ttl
        self._refresh = refresh
        self._revoke = revoke
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._task: asyncio.Task[None] | None = None
        self.lost = asyncio.Event()
        self.error: BaseException | None = None

    def __repr__(self) -> str:
        return f"Lease(id={self.id}, ttl={self.ttl})"

    async def refresh(self) -> None:
        """Refresh the lease once; raises `LeaseNotFoundError` if it has already expired."""
        await self._refresh(self.id)

    async def keep_alive_forever(self, *, lost_after: float | None = None) -> None:
        """Refresh every ``ttl / 3`` until cancelled; raise `LeaseNotFoundError` once lost.

        The one keep-alive of the code base (brokers, leader election and `start_keep_alive`
        use it). Lost means the store says the lease no longer exists; transient failures
        (e.g. an etcd member restarting) are retried at the next tick. With `lost_after`,
        it also means `lost_after` seconds without a successful refresh (each refresh is
        then bounded in real time, so a hung call cannot outlive the lease unnoticed): the
        store may already have expired the lease, and an owner must assume the worst.
        """
        interval = max(self.ttl / 3.0, 0.01)
        last_ok = self._clock.now()
        while True:
            try:
                if lost_after is None:
                    await self._refresh(self.id)
                else:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                    # cancellation that arrives as the call completes.
                    async with asyncio.timeout(max(interval, 0.5)):
                        await self._refresh(self.id)
                last_ok = self._clock.now()
            except LeaseNotFoundError as exc:
                self.error = exc
                self.lost.set()
                raise
            except (MetadataError, TimeoutError) as exc:
                if lost_after is not None and self._clock.now() - last_ok >= lost_after:
                    lost = LeaseNotFoundError(self.id)
                    self.error = lost
                    self.lost.set()
                    log.warning("lease %d not refreshed for %.1fs: lost", self.id, lost_after)
                    raise lost from exc
                # Not fatal: the lease may still be alive; the next tick retries.
                log.warning("lease %d keep-alive failed, retrying: %s", self.id, exc)
            await self._clock.sleep(interval)

    def start_keep_alive(self) -> None:
        """Start refreshing in a background task (idempotent)."""
        if self._task is not None and not self._task.done():
            return
        self._task = asyncio.create_task(
            self._keep_alive_task(), name=f"metadata/lease-{self.id}-keepalive"
        )

    async def _keep_alive_task(self) -> None:
        try:
            await self.keep_alive_forever()
        except LeaseNotFoundError:
            log.warning("lease %d expired; keep-alive stopped", self.id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # surfaced via `lost`/`error`, the owner decides
            log.exception("lease %d keep-alive crashed", self.id)
            self.error = exc
            self.lost.set()

    @property
    def keeping_alive(self) -> bool:
        """True while the background keep-alive task is running."""
        return self._task is not None and not self._task.done()

    async def stop_keep_alive(self) -> None:
        """Stop the background keep-alive and wait for it to finish; the lease stays granted."""
        task, self._task = self._task, None
        if task is None:
            return
        await cancel_and_wait(task)

    async def revoke(self) -> None:
        """Stop keeping alive and revoke the lease; its keys are deleted at once."""
        await self.stop_keep_alive()
        await self._revoke(self.id)

    async def __aenter__(self) -> Self:
        self.start_keep_alive()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with contextlib.suppress(LeaseNotFoundError):
            await self.revoke()


TxnOp = Put | Delete


def swap(key: str, expected_mod_revision: int, value: Any) -> tuple[list[Compare], list[TxnOp]]:
    """A compare-and-swap as a transaction's parts (to write it with other things)."""
    return [Compare.mod_revision_equals(key, expected_mod_revision)], [Put(key, value)]


class _End:
    """Queue sentinel: the watch has ended (closed, compacted, or the store closed)."""


_END = _End()


class Watch(AsyncIterator[WatchEvent]):
    """An open watch on a prefix: iterate it for `WatchEvent`s, close it when done.

    A watch is also an async context manager (closing on exit), so owners write::

        async with store.watch_prefix(keys.UNASSIGNED_PREFIX, listing.revision + 1) as w:
            async for event in w:
                ...

    Stores that need a network stream start it on first use (`ready()` or the first
    iteration) in a background task that also reconnects; events are buffered in a queue
    of `maxsize` (0: unbounded) so a slow reader applies back-pressure to the stream.
    """

    def __init__(
        self,
        prefix: str,
        *,
        producer: Callable[[Watch], Awaitable[None]] | None = None,
        on_close: Callable[[Watch], None] | None = None,
        maxsize: int = 0,
    ) -> None:
        self.prefix = prefix
        self._producer = producer
        self._on_close = on_close
        self._queue: asyncio.Queue[WatchEvent | _End] = asyncio.Queue(maxsize)
        self._established = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ended = False
        self._closed = False
        self._error: BaseException | None = None
        if producer is None:
            self._established.set()

    def __repr__(self) -> str:
        return f"Watch(prefix={self.prefix!r}, ended={self._ended})"

    # -- producer side (used by the stores) --------------------------------------------

    def deliver_nowait(self, event: WatchEvent) -> None:
        """Queue an event without waiting (unbounded queues only)."""
        if not self._ended:
            self._queue.put_nowait(event)

    async def deliver(self, event: WatchEvent) -> None:
        """Queue an event, waiting while the queue is full (back-pressure)."""
        if not self._ended:
            await self._queue.put(event)

    def mark_established(self) -> None:
        """The watch is registered with the store; changes from now on will be seen."""
        self._established.set()

    def finish(self, error: BaseException | None = None) -> None:
        """End the stream: the reader gets the queued events, then `error` or the end."""
        if self._ended:
            return
        self._ended = True
        self._error = error
        self._established.set()
        # A full queue cannot take the sentinel; the reader then sees `_ended` once it has
        # drained the queue, before it would block.
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(_END)

    @property
    def ended(self) -> bool:
        """True once no further events will be queued."""
        return self._ended

    # -- consumer side ---------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._producer is not None and self._task is None and not self._ended:
            self._task = asyncio.create_task(
                self._run_producer(self._producer), name=f"metadata/watch:{self.prefix}"
            )

    async def _run_producer(self, producer: Callable[[Watch], Awaitable[None]]) -> None:
        try:
            await producer(self)
        except asyncio.CancelledError:
            self.finish()
            raise
        except Exception as exc:  # surfaced to the reader, never silently gone
            log.exception("watch on %r crashed", self.prefix)
            self.finish(exc)
        else:
            self.finish()

    async def ready(self) -> None:
        """Wait until the watch is established with the store (or has already ended)."""
        self._ensure_started()
        await self._established.wait()

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> WatchEvent:
        self._ensure_started()
        if self._ended and self._queue.empty():
            return self._stop()
        item = await self._queue.get()
        if isinstance(item, _End):
            return self._stop()
        return item

    def _stop(self) -> WatchEvent:
        error, self._error = self._error, None
        if error is not None:
            raise error
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stop watching; the iterator ends. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.finish()
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        if self._on_close is not None:
            self._on_close(self)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class _StoreCore(Protocol):
    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult: ...

    async def close(self) -> None: ...


class TxnHelpers:
    """What both stores share, written once: the async context manager (closing the store
    on exit) and create-if-absent / compare-and-swap / compare-and-delete over `txn`."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self: _StoreCore,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def create_if_absent(
        self: _StoreCore, key: str, value: Any, lease: int | None = None
    ) -> bool:
        """Write `key` only if it does not exist; True if written."""
        result = await self.txn([Compare.absent(key)], [Put(key, value, lease)])
        return result.succeeded

    async def compare_and_swap(
        self: _StoreCore, key: str, expected_mod_revision: int, value: Any
    ) -> bool:
        """Write `key` only if its mod_revision is `expected_mod_revision`."""
        result = await self.txn(*swap(key, expected_mod_revision, value))
        return result.succeeded

    async def compare_and_delete(self: _StoreCore, key: str, expected_mod_revision: int) -> bool:
        """Delete `key` only if its mod_revision is `expected_mod_revision`."""
        if expected_mod_revision <= 0:
            return False  # an absent key cannot be deleted
        result = await self.txn(
            [Compare.mod_revision_equals(key, expected_mod_revision)], [Delete(key)]
        )
        return result.succeeded


@runtime_checkable
class MetadataStore(Protocol):
    """The asynchronous key-value contract every metadata store implements."""

    async def get(self, key: str) -> KeyValue | None:
        """The key, or None if absent. Raises `ValueDecodeError` if its value is not JSON."""
        ...

    async def get_many(self, keys: Sequence[str]) -> list[KeyValue | None]:
        """Each of `keys` (None where absent), read at one revision in one round trip: a
        lookup that needs three keys pays one. At most 128 keys (etcd's operations per
        transaction). Raises `ValueDecodeError` if a value is not JSON."""
        ...

    async def get_prefix(self, prefix: str) -> Listing:
        """Every key starting with `prefix`, sorted by key, read at one revision.

        Values that are not JSON do not fail the listing: they are reported in
        `Listing.undecodable`.
        """
        ...

    async def get_and_list(self, key: str, prefix: str) -> tuple[KeyValue | None, Listing]:
        """`get(key)` and `get_prefix(prefix)` at one revision, in one round trip (a
        topic's opening reads its metadata and its storage keys: a broker inheriting
        10 000 topics pays one call each, not two)."""
        ...

    async def put(self, key: str, value: Any, lease: int | None = None) -> int:
        """Write `value` (JSON) at `key`; returns the new store revision."""
        ...

    async def delete(self, key: str) -> bool:
        """Delete `key`; True if it existed."""
        ...

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with `prefix`; returns how many were deleted."""
        ...

    def watch_prefix(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncIterator[WatchEvent]:
        """Stream changes under `prefix`, from `start_revision` (None: from now on)."""
        ...

    async def grant_lease(self, ttl: float) -> Lease:
        """Grant a lease of `ttl` seconds (not yet kept alive)."""
        ...

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease and delete its keys. Revoking an unknown lease is not an error."""
        ...

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult:
        """Atomically: if all `compare` hold apply `success`, else apply `failure`."""
        ...

    async def create_if_absent(self, key: str, value: Any, lease: int | None = None) -> bool:
        """Write `key` only if it does not exist; True if written."""
        ...

    async def compare_and_swap(self, key: str, expected_mod_revision: int, value: Any) -> bool:
        """Write `key` only if its mod_revision is `expected_mod_revision`; True if written."""
        ...

    async def compare_and_delete(self, key: str, expected_mod_revision: int) -> bool:
        """Delete `key` only if its mod_revision is `expected_mod_revision`; True if deleted."""
        ...

    async def close(self) -> None:
        """Stop background tasks and release connections; pending watches end."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
