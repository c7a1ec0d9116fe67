"""`EtcdStore`: the production metadata store, over etcd's v3 gRPC API.

It speaks to etcd through the gRPC stubs and messages generated in aetcd 1.0.0
(`aetcd.rpc`), the one etcd client library of the process, on a `grpc.aio` channel that this
module manages itself, because aetcd's `Client` cannot do what a cluster needs: it has no
TLS, no endpoint list, no paginated range and no watch resumption.

Behaviour:

- **Endpoints.** A comma-separated list (``http://h1:2379,http://h2:2379``). One channel is
  open at a time; when its member refuses connections or does not connect within
  `connect_timeout`, the store moves on to the next endpoint.
- **Retries.** Reads, plain puts/deletes and lease calls are retried on another endpoint
  until `timeout` runs out. A transaction is retried only when it certainly never reached a
  member; if the connection broke while it was in flight, `OutcomeUnknownError` tells the
  caller to re-read and decide again (a fenced write must never be applied twice).
- **Watches** run in a background task each, with their own stream. When the stream breaks
  (member restart, failover) the task reconnects with exponential backoff and resumes at the
  last delivered revision + 1, so no event is lost or repeated; if that revision has been
  compacted meanwhile the watch yields a ``compacted`` event and ends.
- **Values** are JSON. A non-JSON value under a watched prefix yields an ``error`` event
  naming the key and the watch goes on; `get` on such a key raises `ValueDecodeError`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc
from aetcd import rpc
from aetcd.utils import prefix_range_end

from ballast.clock import SystemClock
from ballast.keepalive import grpc_keepalive_options, is_silent_connection
from ballast.metadata import _codec
from ballast.metadata.store import (
    CompactedError,
    Compare,
    Delete,
    KeyValue,
    Lease,
    LeaseNotFoundError,
    Listing,
    MetadataError,
    MetadataUnavailableError,
    OutcomeUnknownError,
    Put,
    TxnHelpers,
    TxnResult,
    ValueDecodeError,
    Watch,
    WatchEvent,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_ENDPOINT = "http://127.0.0.1:2379"
DEFAULT_PAGE_SIZE = 1000
WATCH_QUEUE_SIZE = 1024

_PUT_EVENT = 0  # mvccpb.Event.PUT
_DELETE_EVENT = 1  # mvccpb.Event.DELETE

_COMPARE_TARGET = {
    "value": rpc.Compare.VALUE,
    "version": rpc.Compare.VERSION,
    "create_revision": rpc.Compare.CREATE,
    "mod_revision": rpc.Compare.MOD,
}
_COMPARE_OP = {
    "==": rpc.Compare.EQUAL,
    "!=": rpc.Compare.NOT_EQUAL,
    "<": rpc.Compare.LESS,
    ">": rpc.Compare.GREATER,
}

# Transient failures: the member is down, restarting, or has no raft leader right now.
_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
# Error details that prove a request never reached a member (or was refused before being
# proposed to raft), so even a conditional write may be retried.
_NOT_SENT_MARKERS = (
    "failed to connect",
    "connection refused",
    "connections to all backends failing",
    "no address",
    "etcdserver: no leader",
    "etcdserver: not capable",
)

_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    # Reconnect quickly after a member restart; the store does its own backoff on top.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
)
# etcd refuses pings more often than every 5 s while a stream is open (its keepalive
# enforcement policy answers GOAWAY "too_many_pings"), so the ping interval stays above it.
ETCD_MIN_KEEPALIVE_SECONDS = 5.0
DEFAULT_KEEPALIVE_TIMEOUT_SECONDS = 3.0


def parse_endpoints(endpoints: str | Sequence[str]) -> tuple[list[str], bool]:
    """Split an endpoint list into gRPC targets (``host:port``) and whether TLS is asked for.

    Accepts ``http://h:p``, ``https://h:p`` and bare ``h:p``, comma-separated or as a list.
    """
    raw = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    targets: list[str] = []
    schemes: set[str] = set()
    for item in (e.strip() for e in raw):
        if not item:
            continue
        url = urlsplit(item if "://" in item else f"http://{item}")
        if url.scheme not in ("http", "https"):
            raise ValueError(
                f"etcd endpoint {item!r}: unsupported scheme {url.scheme!r} "
                "(use http://host:port or https://host:port)"
            )
        try:
            port = url.port
        except ValueError as exc:
            raise ValueError(f"etcd endpoint {item!r}: invalid port") from exc
        if not url.hostname or port is None or url.path not in ("", "/"):
            raise ValueError(f"etcd endpoint {item!r}: expected scheme://host:port")
        host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
        targets.append(f"{host}:{port}")
        schemes.add(url.scheme)
    if not targets:
        raise ValueError(f"no etcd endpoint in {endpoints!r}; expected e.g. {DEFAULT_ENDPOINT}")
    if len(schemes) > 1:
        raise ValueError(f"etcd endpoints {endpoints!r} mix http and https; use one scheme")
    return targets, schemes == {"https"}


def _read_pem(path: str | Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise MetadataError(f"cannot read etcd {what} {str(path)!r}: {exc}") from exc


def _details(exc: grpc.aio.AioRpcError) -> str:
    return str(exc.details() or exc.code().name)


@dataclass
class _Connection:
    """One open channel to one endpoint, with its stubs and auth metadata."""

    generation: int
    target: str
    channel: grpc.aio.Channel
    kv: Any
    lease: Any
    watch: Any
    auth: Any
    metadata: tuple[tuple[str, str], ...] | None = None
    # Calls in flight on this channel, woken when another task drops it (see `_dropping`).
    on_drop: set[Callable[[], None]] = field(default_factory=set)

    async def drop(self) -> None:
        for wake in list(self.on_drop):
            wake()
        await self.channel.close()


class _Dropped(Exception):
    """The connection a call was using was dropped by another task (failover or close)."""


@asynccontextmanager
async def _dropping(conn: _Connection) -> AsyncIterator[None]:
    """Run the body until `conn` is dropped, then raise `_Dropped`.

    Closing a channel under a call in flight can leave that call hanging for ever (a watch
    has no deadline), so a task that fails over first wakes every call on the old channel.
    """
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(None) as scope:

            def wake() -> None:
                scope.reschedule(loop.time())

            conn.on_drop.add(wake)
            try:
                yield
            finally:
                conn.on_drop.discard(wake)
    except TimeoutError:
        if scope.expired():
            raise _Dropped from None
        raise


class EtcdStore(TxnHelpers):
    """`MetadataStore` over an etcd cluster.

    - `endpoints`: ``"http://h1:2379,http://h2:2379"`` or a sequence of such URLs.
    - TLS: an ``https`` endpoint or `ca_cert` turns it on; `cert_key` / `cert_cert` give a
      client certificate (mutual TLS). All three are PEM file paths.
    - `username` / `password`: etcd authentication (both or neither).
    - `timeout`: seconds one operation may take, failovers and retries included.
    - `connect_timeout`: seconds to wait for one endpoint before trying the next.
    - `page_size`: keys fetched per range request by `get_prefix`.
    - `keepalive` / `keepalive_timeout`: a connection silent for `keepalive` seconds is
      pinged, and dropped (then re-dialed, on the next endpoint) if the ping is not answered
      within `keepalive_timeout`: a member whose connection froze is noticed within about
      the sum, even under an open watch. `keepalive` is raised to etcd's minimum of 5 s.
      `connection_timeouts` counts the connections dropped so.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str] = DEFAULT_ENDPOINT,
        *,
        ca_cert: str | Path | None = None,
        cert_key: str | Path | None = None,
        cert_cert: str | Path | None = None,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 10.0,
        connect_timeout: float = 2.0,
        page_size: int = DEFAULT_PAGE_SIZE,
        keepalive: float = ETCD_MIN_KEEPALIVE_SECONDS,
        keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT_SECONDS,
    ) -> None:
        self._targets, tls = parse_endpoints(endpoints)
        if keepalive <= 0 or keepalive_timeout <= 0:
            raise ValueError("keepalive and keepalive_timeout must be > 0 seconds")
        self._channel_options = _CHANNEL_OPTIONS + grpc_keepalive_options(
            max(keepalive, ETCD_MIN_KEEPALIVE_SECONDS), keepalive_timeout
        )
        self.connection_timeouts = 0  # connections dropped because their keepalive failed
        self._timed_out_generation = 0
        if (username is None) != (password is None):
            raise ValueError("etcd authentication needs both username and password")
        if (cert_key is None) != (cert_cert is None):
            raise ValueError("an etcd client certificate needs both cert_key and cert_cert")
        if timeout <= 0 or connect_timeout <= 0:
            raise ValueError("timeout and connect_timeout must be > 0 seconds")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self._credentials: grpc.ChannelCredentials | None = None
        if tls or ca_cert is not None or cert_key is not None:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_pem(ca_cert, "CA certificate"),
                private_key=_read_pem(cert_key, "client key"),
                certificate_chain=_read_pem(cert_cert, "client certificate"),
            )
        self._username = username
        self._password = password
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._page_size = page_size
        self._index = 0
        self._generation = 0
        self._conn: _Connection | None = None
        self._conn_lock = asyncio.Lock()
        self._watches: set[Watch] = set()
        self._leases: dict[int, Lease] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"EtcdStore(endpoints={','.join(self._targets)!r})"

    @property
    def endpoints(self) -> list[str]:
        """The gRPC targets (``host:port``) in failover order."""
        return list(self._targets)

    @property
    def current_endpoint(self) -> str:
        """The endpoint currently in use (or next to be tried)."""
        return self._targets[self._index]

    # -- lifecycle ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop lease keep-alives (the leases then expire), end watches, close the channel."""
        if self._closed:
            return
        self._closed = True
        for lease in list(self._leases.values()):
            await lease.stop_keep_alive()
        self._leases.clear()
        for watch in list(self._watches):
            await watch.aclose()
        self._watches.clear()
        async with self._conn_lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            await conn.drop()

    # -- connection management ---------------------------------------------------------------

    def _open_channel(self, target: str) -> grpc.aio.Channel:
        if self._credentials is not None:
            return rpc.secure_channel(target, self._credentials, options=self._channel_options)
        return rpc.insecure_channel(target, options=self._channel_options)

    async def _connection(self, deadline: float) -> _Connection:
        """A connection whose channel is READY, failing over between endpoints."""
        loop = asyncio.get_running_loop()
        backoff = 0.05
        tried_since_backoff = 0
        while True:
            if self._closed:
                raise MetadataError("metadata store is closed; open a new one")
            conn = await self._current_connection(deadline)
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if await self._wait_ready(conn.channel, min(self._connect_timeout, remaining)):
                if self._username is None or conn.metadata is not None:
                    return conn
                if await self._authenticate(conn, deadline):
                    return conn
            log.info("etcd endpoint %s is not reachable; trying the next one", conn.target)
            await self._rotate(conn.generation)
            tried_since_backoff += 1
            if tried_since_backoff >= len(self._targets):
                # Every endpoint failed once: back off before going round again.
                tried_since_backoff = 0
                await asyncio.sleep(min(backoff, max(0.0, deadline - loop.time())))
                backoff = min(backoff * 2, 1.0)
        raise MetadataUnavailableError(
            f"no etcd endpoint reachable within {self._timeout:.1f}s (tried "
            f"{', '.join(self._targets)}); check that etcd is running and reachable"
        )

    async def _current_connection(self, deadline: float) -> _Connection:
        async with self._conn_lock:
            if self._conn is None:
                self._conn = await self._connect(self._targets[self._index], deadline)
            return self._conn

    async def _connect(self, target: str, deadline: float) -> _Connection:
        self._generation += 1
        channel = self._open_channel(target)
        conn = _Connection(
            generation=self._generation,
            target=target,
            channel=channel,
            kv=rpc.KVStub(channel),
            lease=rpc.LeaseStub(channel),
            watch=rpc.WatchStub(channel),
            auth=rpc.AuthStub(channel),
        )
        return conn

    async def _authenticate(self, conn: _Connection, deadline: float) -> bool:
        """Get an auth token for `conn`; False on a transient failure (try elsewhere)."""
        remaining = max(0.01, deadline - asyncio.get_running_loop().time())
        try:
            resp = await conn.auth.Authenticate(
                rpc.AuthenticateRequest(name=self._username, password=self._password),
                timeout=remaining,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _TRANSIENT:
                return False
            raise MetadataError(
                f"etcd authentication as {self._username!r} failed at {conn.target}: "
                f"{_details(exc)}; check the username and password"
            ) from exc
        conn.metadata = (("token", resp.token),)
        return True

    @staticmethod
    async def _wait_ready(channel: grpc.aio.Channel, timeout: float) -> bool:
        """Wait up to `timeout` for READY; False at once if the endpoint refuses."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            state = channel.get_state(try_to_connect=True)
            if state == grpc.ChannelConnectivity.READY:
                return True
            if state in (
                grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                grpc.ChannelConnectivity.SHUTDOWN,
            ):
                return False
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):
                    await channel.wait_for_state_change(state)
            except TimeoutError:
                return False

    async def _rotate(self, generation: int) -> None:
        """Drop the connection of `generation` and move to the next endpoint.

        Several tasks may see the same dead connection; only the first one rotates.
        """
        async with self._conn_lock:
            conn = self._conn
            if conn is None or conn.generation != generation:
                return
            self._conn = None
            self._index = (self._index + 1) % len(self._targets)
        await conn.drop()

    async def _silent(self, conn: _Connection, what: str) -> None:
        """`conn`'s keepalive found it silent: count it once, and drop it so that the next
        call dials again (the next endpoint first) instead of waiting on a hung member."""
        if self._timed_out_generation == conn.generation:
            return
        self._timed_out_generation = conn.generation
        self.connection_timeouts += 1
        log.warning(
            "%s: the connection to etcd %s went silent (no answer to a keepalive ping); "
            "dialing again",
            what,
            conn.target,
        )
        await self._rotate(conn.generation)

    async def _reauthenticate(self, generation: int) -> None:
        """Forget the token of `generation`; the next `_connection` authenticates again."""
        async with self._conn_lock:
            conn = self._conn
            if conn is not None and conn.generation == generation:
                conn.metadata = None

    async def _call(
        self,
        what: str,
        invoke: Callable[[_Connection, float], Awaitable[T]],
        *,
        retry_after_send: bool,
    ) -> T:
        """Run one RPC with failover, retrying transient failures until `timeout`.

        `retry_after_send` says whether running the request twice is harmless; if not, a
        failure after the request may have reached a member raises `OutcomeUnknownError`.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        reauthenticated = False
        backoff = 0.02
        while True:
            conn = await self._connection(deadline)
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                async with _dropping(conn):
                    return await invoke(conn, remaining)
            except _Dropped:
                if self._closed:
                    raise MetadataError(f"{what}: the metadata store was closed") from None
                if not retry_after_send:
                    raise OutcomeUnknownError(
                        f"{what}: the connection to etcd {conn.target} was dropped (failover) "
                        "after the request was sent; it may or may not have been applied — "
                        "re-read and decide again"
                    ) from None
                log.info("%s: connection to %s dropped (failover); retrying", what, conn.target)
                continue
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                details = _details(exc)
                if code == grpc.StatusCode.UNAUTHENTICATED and not reauthenticated:
                    # Simple auth tokens expire; get a new one once and retry.
                    reauthenticated = True
                    await self._reauthenticate(conn.generation)
                    continue
                if code not in _TRANSIENT and not (
                    code == grpc.StatusCode.CANCELLED and not self._closed
                ):
                    raise self._translate(what, conn.target, exc) from exc
                if is_silent_connection(exc):
                    await self._silent(conn, what)
                not_sent = any(m in details.lower() for m in _NOT_SENT_MARKERS)
                if not (retry_after_send or not_sent):
                    raise OutcomeUnknownError(
                        f"{what}: connection to etcd {conn.target} failed after the request "
                        f"was sent ({details}); it may or may not have been applied — re-read "
                        "and decide again"
                    ) from exc
                log.info("%s failed at %s (%s); retrying", what, conn.target, details)
                if "no leader" in details or "not capable" in details:
                    # This member is cut off from the cluster's leader; others may not be.
                    await self._rotate(conn.generation)
                # A dead channel is noticed (and failed over) by `_connection`; back off so
                # a member answering "unavailable" at once is not hammered.
                await asyncio.sleep(min(backoff, max(0.0, deadline - loop.time())))
                backoff = min(backoff * 2, 0.5)
        raise MetadataUnavailableError(
            f"{what}: etcd did not answer within {self._timeout:.1f}s (endpoints "
            f"{', '.join(self._targets)})"
        )

    def _translate(self, what: str, target: str, exc: grpc.aio.AioRpcError) -> MetadataError:
        details = _details(exc)
        if "lease not found" in details:
            return MetadataError(f"{what}: {details}")
        if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
            return MetadataError(
                f"{what}: permission denied for etcd user {self._username!r} ({details})"
            )
        return MetadataError(f"{what}: etcd {target} answered {exc.code().name}: {details}")

    # -- reads -------------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        """The key, or None if absent. Raises `ValueDecodeError` if its value is not JSON."""
        key_b = _codec.check_key(key)

        async def invoke(conn: _Connection, timeout: float) -> Any:
            return await conn.kv.Range(
                rpc.RangeRequest(key=key_b), timeout=timeout, metadata=conn.metadata
            )

        resp = await self._call(f"get {key!r}", invoke, retry_after_send=True)
        return _key_value(resp.kvs[0]) if resp.kvs else None

    async def get_many(self, keys: Sequence[str]) -> list[KeyValue | None]:
        """Each key or None: one read-only transaction of range requests."""
        request = rpc.TxnRequest(
            success=[
                rpc.RequestOp(request_range=rpc.RangeRequest(key=key))
                for key in _codec.check_keys(keys)
            ]
        )

        async def invoke(conn: _Connection, timeout: float) -> Any:
            return await conn.kv.Txn(request, timeout=timeout, metadata=conn.metadata)

        resp = await self._call(f"get {list(keys)!r}", invoke, retry_after_send=True)
        return [
            _key_value(r.response_range.kvs[0]) if r.response_range.kvs else None
            for r in resp.responses
        ]

    async def get_prefix(self, prefix: str) -> Listing:
        """Every key under `prefix`, read page by page at one revision."""
        prefix_b = _codec.check_prefix(prefix)
        end = prefix_range_end(prefix_b)
        while True:
            try:
                return await self._list(prefix, prefix_b, end)
            except CompactedError:
                # The pinned revision was compacted between pages: list again at the newest.
                log.info("listing %r raced a compaction; listing again", prefix)

    async def get_and_list(self, key: str, prefix: str) -> tuple[KeyValue | None, Listing]:
        """The key and the first page under `prefix` in one read-only transaction; the
        other pages, if any, at its revision (as `get_prefix` reads them)."""
        prefix_b = _codec.check_prefix(prefix)
        end = prefix_range_end(prefix_b)
        request = rpc.TxnRequest(
            success=[
                rpc.RequestOp(request_range=rpc.RangeRequest(key=_codec.check_key(key))),
                rpc.RequestOp(
                    request_range=rpc.RangeRequest(
                        key=prefix_b, range_end=end, limit=self._page_size
                    )
                ),
            ]
        )

        async def invoke(conn: _Connection, timeout: float) -> Any:
            return await conn.kv.Txn(request, timeout=timeout, metadata=conn.metadata)

        resp = await self._call(f"get {key!r} and list {prefix!r}", invoke, retry_after_send=True)
        found, page = (r.response_range for r in resp.responses)
        kv = _key_value(found.kvs[0]) if found.kvs else None
        try:
            return kv, await self._list(prefix, prefix_b, end, resp.header.revision, page)
        except CompactedError:  # between pages: both again, at the newest revision
            log.info("listing %r raced a compaction; reading again", prefix)
            return await self.get_and_list(key, prefix)

    async def _list(
        self, prefix: str, start: bytes, end: bytes, revision: int = 0, first: Any = None
    ) -> Listing:
        """The listing, page by page; `revision` (0: the newest, pinned by the first page)
        and `first`, a first page read already at it."""
        items: list[KeyValue] = []
        undecodable: list[ValueDecodeError] = []
        while True:
            if first is not None:
                resp, first = first, None
            else:
                request = rpc.RangeRequest(
                    key=start, range_end=end, limit=self._page_size, revision=revision
                )

                async def invoke(conn: _Connection, timeout: float, req: Any = request) -> Any:
                    return await conn.kv.Range(req, timeout=timeout, metadata=conn.metadata)

                try:
                    resp = await self._call(f"list {prefix!r}", invoke, retry_after_send=True)
                except MetadataError as exc:
                    if "compacted" in str(exc) and revision:
                        raise CompactedError(revision, revision) from exc
                    raise
            if revision == 0:
                revision = resp.header.revision
            for kv in resp.kvs:
                try:
                    items.append(_key_value(kv))
                except ValueDecodeError as exc:
                    undecodable.append(exc)
            if not resp.more or not resp.kvs:
                return Listing(items, revision, undecodable)
            start = resp.kvs[-1].key + b"\x00"  # the smallest key after the last one read

    # -- writes ------------------------------------------------------------------------------

    async def put(self, key: str, value: Any, lease: int | None = None) -> int:
        """Write `value` (JSON) at `key`; returns the new revision."""
        return await self.put_raw(key, _codec.encode(key, value), lease)

    async def put_raw(self, key: str, data: bytes, lease: int | None = None) -> int:
        """Write raw bytes (possibly not JSON). For tools and tests of bad input."""
        key_b = _codec.check_key(key)
        request = rpc.PutRequest(key=key_b, value=data, lease=lease or 0)

        async def invoke(conn: _Connection, timeout: float) -> Any:
            return await conn.kv.Put(request, timeout=timeout, metadata=conn.metadata)

        # A repeated put leaves the same value: safe to retry after a broken connection.
        try:
            resp = await self._call(f"put {key!r}", invoke, retry_after_send=True)
        except MetadataError as exc:
            raise _lease_error(exc, lease) from exc
        return int(resp.header.revision)

    async def delete(self, key: str) -> bool:
        """Delete `key`; True if it existed."""
        key_b = _codec.check_key(key)

        async def invoke(conn: _Connection, timeout: float) -> Any:
            return await conn.kv.DeleteRange(
                rpc.DeleteRangeRequest(key=key_b), timeout=timeout, metadata=conn.metadata
            )

        resp = await self._call(f"delete {key!r}", invoke, retry_after_send=True)
        return bool(resp.deleted > 0)

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with `prefix` at one revision; returns the count."""
        prefix_b = _codec.check_prefix(prefix)
        request = rpc.DeleteRangeRequest(key=prefix_b, range_end=prefix_range_end(prefix_b))

        async def invoke(conn: _Connection, timeout: float) -> Any:
            return await conn.kv.DeleteRange(request, timeout=timeout, metadata=conn.metadata)

        resp = await self._call(f"delete prefix {prefix!r}", invoke, retry_after_send=True)
        return int(resp.deleted)

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult:
        """Atomically apply `success` if every compare holds, else `failure`.

        Raises `OutcomeUnknownError` if the connection broke after the request was sent.
        """
        for c in compare:
            _codec.check_compare(c)
        _codec.check_ops(success)
        _codec.check_ops(failure)
        request = rpc.TxnRequest(
            compare=[_compare_message(c) for c in compare],
            success=[_op_message(op) for op in success],
            failure=[_op_message(op) for op in failure],
        )

        async def invoke(conn: _Connection, timeout: float) -> Any:
            return await conn.kv.Txn(request, timeout=timeout, metadata=conn.metadata)

        keys = sorted({c.key for c in compare} | {op.key for op in (*success, *failure)})
        try:
            resp = await self._call(f"transaction on {keys}", invoke, retry_after_send=False)
        except MetadataError as exc:
            leases = [op.lease for op in (*success, *failure) if isinstance(op, Put) and op.lease]
            raise _lease_error(exc, leases[0] if leases else None) from exc
        return TxnResult(bool(resp.succeeded), int(resp.header.revision))

    async def compact(self, revision: int) -> None:
        """Forget history before `revision` (waits until the compaction is applied)."""

        async def invoke(conn: _Connection, timeout: float) -> Any:
            request = rpc.CompactionRequest(revision=revision, physical=True)
            return await conn.kv.Compact(request, timeout=timeout, metadata=conn.metadata)

        try:
            await self._call(f"compact to {revision}", invoke, retry_after_send=True)
        except MetadataError as exc:
            if "compacted" in str(exc):
                raise CompactedError(revision, revision) from exc
            raise

    # -- watches -----------------------------------------------------------------------------

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        """Watch `prefix` from `start_revision`.

        With None the watch sees changes after it is established: on `Watch.ready()` or the
        first iteration. To miss nothing, list first and pass the listing's revision + 1.
        """
        prefix_b = _codec.check_prefix(prefix)
        if self._closed:
            raise MetadataError("metadata store is closed; open a new one")

        async def produce(watch: Watch) -> None:
            await self._run_watch(watch, prefix_b, start_revision)

        watch = Watch(
            prefix, producer=produce, on_close=self._watches.discard, maxsize=WATCH_QUEUE_SIZE
        )
        self._watches.add(watch)
        return watch

    async def _run_watch(self, watch: Watch, prefix_b: bytes, start: int | None) -> None:
        """Keep one watch stream open, reconnecting and resuming until the watch is closed."""
        next_revision = start
        backoff = 0.05
        loop = asyncio.get_running_loop()
        while not self._closed:
            try:
                conn = await self._connection(loop.time() + self._timeout)
            except MetadataUnavailableError as exc:
                log.warning("watch on %r: %s; retrying", watch.prefix, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            call = conn.watch.Watch(metadata=conn.metadata)
            try:
                async with _dropping(conn):
                    create = rpc.WatchCreateRequest(
                        key=prefix_b,
                        range_end=prefix_range_end(prefix_b),
                        start_revision=next_revision or 0,
                    )
                    await call.write(rpc.WatchRequest(create_request=create))
                    async for resp in call:
                        if resp.compact_revision:
                            # Created or cancelled because the start revision is gone.
                            await watch.deliver(
                                _compacted_event(watch.prefix, next_revision, resp.compact_revision)
                            )
                            return
                        if resp.created:
                            if next_revision is None:
                                next_revision = int(resp.header.revision) + 1
                            watch.mark_established()
                            backoff = 0.05
                        if resp.canceled:
                            raise _WatchCancelled(resp.cancel_reason)
                        for event in resp.events:
                            await watch.deliver(_watch_event(event))
                            # etcd never splits one revision over two responses (no fragment
                            # option), so resuming after this revision repeats and loses nothing.
                            next_revision = int(event.kv.mod_revision) + 1
                    # The server ended the stream (e.g. member shutting down): reconnect.
                    log.info(
                        "watch on %r: stream ended by %s; reconnecting", watch.prefix, conn.target
                    )
            except grpc.aio.AioRpcError as exc:
                if self._closed:
                    return
                code = exc.code()
                if code == grpc.StatusCode.UNAUTHENTICATED:
                    await self._reauthenticate(conn.generation)
                elif code == grpc.StatusCode.PERMISSION_DENIED:
                    raise self._translate(f"watch {watch.prefix!r}", conn.target, exc) from exc
                elif is_silent_connection(exc):
                    await self._silent(conn, f"watch on {watch.prefix!r}")
                else:
                    # No rotation here: `_connection` fails over if the channel is dead,
                    # and rotating would cut other requests sharing the channel.
                    log.info(
                        "watch on %r: %s at %s; reconnecting from revision %s",
                        watch.prefix,
                        _details(exc),
                        conn.target,
                        next_revision,
                    )
            except _WatchCancelled as exc:
                reason = str(exc)
                if "permission denied" in reason:
                    raise MetadataError(
                        f"watch {watch.prefix!r}: permission denied for etcd user "
                        f"{self._username!r} ({reason})"
                    ) from exc
                log.info("watch on %r cancelled by etcd (%s); reconnecting", watch.prefix, reason)
            except _Dropped:
                if self._closed:
                    return
                log.info(
                    "watch on %r: connection to %s dropped (failover); reconnecting from "
                    "revision %s",
                    watch.prefix,
                    conn.target,
                    next_revision,
                )
            finally:
                call.cancel()
            # Jitter keeps many watchers from reconnecting in lock-step after a restart.
            await asyncio.sleep(backoff * (0.5 + random.random() / 2))
            backoff = min(backoff * 2, 2.0)

    # -- leases ------------------------------------------------------------------------------

    async def grant_lease(self, ttl: float) -> Lease:
        """Grant a lease; etcd counts whole seconds, so `ttl` is rounded up (min 1 s).

        The returned lease's `ttl` is what etcd granted (etcd may raise a tiny TTL to its
        minimum, which depends on the cluster's election timeout).
        """
        if not ttl > 0:
            raise MetadataError(f"lease ttl must be > 0 seconds, got {ttl!r}")
        request = rpc.LeaseGrantRequest(TTL=max(1, math.ceil(ttl)))

        async def invoke(conn: _Connection, timeout: float) -> Any:
            return await conn.lease.LeaseGrant(request, timeout=timeout, metadata=conn.metadata)

        # A retried grant may leave an unused lease behind; it expires on its own.
        resp = await self._call("grant lease", invoke, retry_after_send=True)
        if resp.error:
            raise MetadataError(f"grant lease: {resp.error}")
        lease = Lease(
            int(resp.ID),
            float(resp.TTL),
            refresh=self.refresh_lease,
            revoke=self.revoke_lease,
            clock=SystemClock(),
        )
        self._leases[lease.id] = lease
        return lease

    async def refresh_lease(self, lease_id: int) -> None:
        """Send one keep-alive; raises `LeaseNotFoundError` if the lease has expired."""

        async def invoke(conn: _Connection, timeout: float) -> Any:
            call = conn.lease.LeaseKeepAlive(metadata=conn.metadata, timeout=timeout)
            try:
                await call.write(rpc.LeaseKeepAliveRequest(ID=lease_id))
                return await call.read()
            finally:
                call.cancel()

        resp = await self._call(f"keep lease {lease_id} alive", invoke, retry_after_send=True)
        if resp is grpc.aio.EOF or resp.TTL <= 0:
            self._leases.pop(lease_id, None)
            raise LeaseNotFoundError(lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke a lease and delete its keys (unknown ids are ignored)."""
        lease = self._leases.pop(lease_id, None)
        if lease is not None:
            await lease.stop_keep_alive()

        async def invoke(conn: _Connection, timeout: float) -> Any:
            request = rpc.LeaseRevokeRequest(ID=lease_id)
            return await conn.lease.LeaseRevoke(request, timeout=timeout, metadata=conn.metadata)

        try:
            await self._call(f"revoke lease {lease_id}", invoke, retry_after_send=True)
        except MetadataError as exc:
            if "lease not found" not in str(exc):
                raise

    async def lease_time_to_live(self, lease_id: int) -> float | None:
        """Seconds left before the lease expires, or None if it does not exist."""

        async def invoke(conn: _Connection, timeout: float) -> Any:
            request = rpc.LeaseTimeToLiveRequest(ID=lease_id)
            return await conn.lease.LeaseTimeToLive(
                request, timeout=timeout, metadata=conn.metadata
            )

        resp = await self._call(f"lease {lease_id} ttl", invoke, retry_after_send=True)
        return None if resp.TTL < 0 else float(resp.TTL)


class _WatchCancelled(Exception):
    """etcd cancelled a watch stream (carries the reason)."""


def _lease_error(exc: MetadataError, lease: int | None) -> MetadataError:
    if lease is not None and "lease not found" in str(exc):
        return LeaseNotFoundError(lease)
    return exc


def _key_value(kv: Any) -> KeyValue:
    key = kv.key.decode("utf-8", errors="replace")
    try:
        value = _codec.decode(kv.value)
    except ValueError as exc:
        raise ValueDecodeError(key, str(exc)) from exc
    return KeyValue(
        key,
        value,
        int(kv.create_revision),
        int(kv.mod_revision),
        int(kv.version),
        int(kv.lease) or None,
    )


def _watch_event(event: Any) -> WatchEvent:
    kv = event.kv
    key = kv.key.decode("utf-8", errors="replace")
    revision = int(kv.mod_revision)
    if event.type == _DELETE_EVENT:
        return WatchEvent("delete", key, None, revision)
    try:
        value = _codec.decode(kv.value)
    except ValueError as exc:
        return WatchEvent("error", key, None, revision, f"value at {key!r} is not JSON: {exc}")
    return WatchEvent("put", key, value, revision)


def _compacted_event(prefix: str, requested: int | None, compact_revision: int) -> WatchEvent:
    error = CompactedError(requested or 0, int(compact_revision))
    return WatchEvent("compacted", prefix, None, int(compact_revision), str(error))


def _compare_message(c: Compare) -> Any:
    message = rpc.Compare(
        key=c.key.encode("utf-8"), target=_COMPARE_TARGET[c.target], result=_COMPARE_OP[c.op]
    )
    if c.target == "value":
        message.value = _codec.encode(c.key, c.operand)
    elif c.target == "version":
        message.version = c.operand
    elif c.target == "create_revision":
        message.create_revision = c.operand
    else:
        message.mod_revision = c.operand
    return message


def _op_message(op: Put | Delete) -> Any:
    key_b = op.key.encode("utf-8")
    if isinstance(op, Put):
        put = rpc.PutRequest(key=key_b, value=_codec.encode(op.key, op.value), lease=op.lease or 0)
        return rpc.RequestOp(request_put=put)
    delete = rpc.DeleteRangeRequest(key=key_b)
    if op.prefix:
        delete.range_end = prefix_range_end(key_b)
    return rpc.RequestOp(request_delete_range=delete)
