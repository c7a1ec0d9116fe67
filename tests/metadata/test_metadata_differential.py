"""Differential test: random operation sequences give identical results on both stores.

Revisions are compared relative to each store's revision before the sequence, so the shared
etcd server's absolute revision does not matter (no other test writes concurrently).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from etcd_fixtures import EtcdServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ballast.metadata import (
    Compare,
    Delete,
    EtcdStore,
    KeyValue,
    MemoryStore,
    MetadataError,
    Put,
)

pytestmark = pytest.mark.timeout(120)

KEYS = st.sampled_from(["a", "b", "d/e", "d/f", "dx"])
VALUES = st.one_of(st.integers(-3, 3), st.sampled_from(["x", "y"]), st.just({"k": [1]}))
OP = st.one_of(
    st.tuples(st.just("put"), KEYS, VALUES),
    st.tuples(st.just("delete"), KEYS),
    st.tuples(st.just("delete_prefix"), st.sampled_from(["d/", "d", "zz"])),
    st.tuples(st.just("create"), KEYS, VALUES),
    st.tuples(st.just("cas"), KEYS, VALUES, st.booleans()),
    st.tuples(st.just("cad"), KEYS, st.booleans()),
    st.tuples(
        st.just("txn"),
        KEYS,
        st.sampled_from(["==", "!=", "<", ">"]),
        st.integers(0, 3),
        st.lists(st.tuples(KEYS, VALUES), max_size=2, unique_by=lambda kv: kv[0]),
        st.sampled_from([None, "d/"]),
    ),
    st.tuples(st.just("value_txn"), KEYS, VALUES),
)


async def run(store: MemoryStore | EtcdStore, root: str, ops: list[tuple[Any, ...]]) -> Any:
    base = (await store.get_prefix(root)).revision

    def rel(rev: int) -> int:
        return rev - base if rev > base else 0

    def norm(kv: KeyValue | None) -> Any:
        if kv is None:
            return None
        return (kv.key, kv.value, rel(kv.create_revision), rel(kv.mod_revision), kv.version)

    out: list[Any] = []
    for op in ops:
        kind = op[0]
        try:
            if kind == "put":
                out.append(rel(await store.put(root + op[1], op[2])))
            elif kind == "delete":
                out.append(await store.delete(root + op[1]))
            elif kind == "delete_prefix":
                out.append(await store.delete_prefix(root + op[1]))
            elif kind == "create":
                out.append(await store.create_if_absent(root + op[1], op[2]))
            elif kind in ("cas", "cad"):
                kv = await store.get(root + op[1])
                current = kv.mod_revision if kv else 0
                expected = current if op[-1] else current - 1
                if kind == "cas":
                    out.append(await store.compare_and_swap(root + op[1], expected, op[2]))
                else:
                    out.append(await store.compare_and_delete(root + op[1], expected))
            elif kind == "txn":
                _, key, cmp_op, version, puts, delete = op
                success: list[Put | Delete] = [Put(root + k, v) for k, v in puts]
                if delete is not None and not any(k.startswith(delete) for k, _ in puts):
                    success.append(Delete(root + delete, prefix=True))
                result = await store.txn(
                    [Compare(root + key, "version", cmp_op, version)],
                    success,
                    [Put(root + "failed", key)],
                )
                out.append((result.succeeded, rel(result.revision)))
            else:
                result = await store.txn([Compare.value_equals(root + op[1], op[2])], [])
                out.append(result.succeeded)
        except MetadataError as exc:
            out.append(type(exc).__name__)
        if kind != "delete_prefix":
            out.append(norm(await store.get(root + op[1])))
    listing = await store.get_prefix(root)
    # Replay the whole sequence from the event log, up to a sentinel written afterwards.
    sentinel = root.rstrip("/") + "~end"
    events = []
    async with store.watch_prefix(root.rstrip("/"), base + 1) as watch:
        await store.put(sentinel, True)
        async for event in watch:
            if event.key == sentinel:
                break
            events.append((event.kind, event.key, event.value, rel(event.revision)))
    return out, [norm(kv) for kv in listing.items], rel(listing.revision), events


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(OP, min_size=1, max_size=25))
def test_memory_and_etcd_agree(etcd_server: EtcdServer, ops: list[tuple[Any, ...]]) -> None:
    async def both() -> tuple[Any, Any]:
        root = f"/diff-{uuid.uuid4().hex[:10]}/"
        async with MemoryStore() as memory, EtcdStore(etcd_server.client_url) as etcd:
            return await run(memory, root, ops), await run(etcd, root, ops)

    from_memory, from_etcd = asyncio.run(both())
    assert from_memory == from_etcd
