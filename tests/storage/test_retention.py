"""Retention per namespace: the owner releases the oldest objects (index entries and
descriptor keys) beyond the policy's time or size, never past the slowest subscription's
cursor; on real etcd (the transactions it writes)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ballast.clock import FakeClock
from ballast.metadata import keys
from ballast.metadata.etcd import EtcdStore
from ballast.storage import (
    FsspecObjectStore,
    InitialPosition,
    StorageConfig,
    StorageStats,
    load_catalog,
    stored_size,
)
from ballast.storage.catalog import ObjectDescriptor
from ballast.storage.retention import (
    RetentionError,
    RetentionPolicy,
    parse_retention_size,
    parse_retention_time,
    releasable,
)
from tests.etcd_fixtures import EtcdServer, etcd_server

from .helpers import collect, eventually, make_topic, payload

__all__ = ["etcd_server"]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def etcd(etcd_server: EtcdServer) -> AsyncIterator[EtcdStore]:
    async with EtcdStore(etcd_server.client_url, timeout=5) as store:
        yield store


async def test_retention_releases_old_objects_and_keys_but_not_what_a_subscription_needs(
    tmp_path: Path,
    etcd: EtcdStore,
    object_store: FsspecObjectStore,
    clock: FakeClock,
    config: StorageConfig,
) -> None:
    stats = StorageStats()
    namespace = f"ret_{uuid.uuid4().hex[:8]}"  # the policy is per namespace; etcd is shared
    config = replace(
        config,
        merge_objects=4,
        catalog_keys=8,
        upload_interval_seconds=600,
        merge_grace_seconds=60,
    )
    kw: dict[str, Any] = {
        "objects": object_store,
        "metadata": etcd,
        "clock": clock,
        "config": config,
        "topic": f"/{namespace}/t",
    }
    policy_key = keys.retention_policy(namespace)
    await etcd.put(policy_key, {"size_bytes": -1})  # malformed: keeps everything, logged
    rounds = 20
    async with make_topic("a", tmp_path, **kw, stats=stats) as a:
        await a.subscribe("slow", initial=InitialPosition.EARLIEST)
        for r in range(rounds):
            if r == 5:
                await etcd.put(policy_key, RetentionPolicy(time_seconds=3600).to_dict())
            for i in range(3):  # three acknowledged sends: three small objects
                assert await a.append(payload(3 * r + i)) == 3 * r + i
            await clock.advance(600)  # the merge interval: the three become one
            await eventually(lambda r=r: stats.objects_merged == 3 * (r + 1))  # type: ignore[misc]
        # Hours old, but "slow" has read nothing: nothing is released.
        assert stats.objects_released == 0
        catalog = await load_catalog(etcd, a.topic, objects=object_store)
        assert catalog.start == 0 and catalog.indexed > 0  # some are in the index object
        released = [d.object_id for d in catalog.objects if d.end <= 29]
        await a.ack("slow", 29)
        await a.flush_cursors()
        await clock.advance(600)
        await eventually(lambda: stats.objects_released == len(released))
        catalog = await load_catalog(etcd, a.topic, objects=object_store)
        assert catalog.start == 30 and catalog.end == 3 * rounds - 1  # keys and index entries
        assert (await stored_size(etcd, a.topic)).first_offset == 30
        await clock.advance(600)  # past the grace: the released objects are deleted
        await a.upload_now()
        await eventually(lambda: not any((tmp_path / "objects" / n).exists() for n in released))
    async with make_topic("b", tmp_path, **kw) as b:  # reopened: continues, reads the rest
        items = await collect(b.read(0, live=False))
        assert [i.offset for i in items] == list(range(30, 3 * rounds))
        assert await b.append(payload(3 * rounds)) == 3 * rounds


def test_retention_limits_are_parsed_and_applied_oldest_first() -> None:
    assert parse_retention_time("7d") == 7 * 86_400 and parse_retention_time("90") == 90
    assert parse_retention_size("10GiB") == 10 * 2**30 and parse_retention_size("5MB") == 5 * 10**6
    for bad in ("", "-1d", "7y", "0"):
        with pytest.raises(RetentionError, match="invalid retention time"):
            parse_retention_time(bad)
    with pytest.raises(RetentionError, match="invalid retention size"):
        parse_retention_size("10 parsecs")
    with pytest.raises(RetentionError, match=r"k\.time_seconds: expected a positive number"):
        RetentionPolicy.from_dict({"time_seconds": "7d"}, "k")
    objects = [ObjectDescriptor(10 * i, 10 * i + 9, f"o{i}", 100, float(i)) for i in range(5)]
    by_size = RetentionPolicy(size_bytes=250)
    assert releasable(objects, by_size, now=10.0, lowest=None) == 3  # 500 bytes -> 200
    assert releasable(objects, by_size, now=10.0, lowest=19) == 2  # a cursor holds it back
    assert releasable(objects, RetentionPolicy(time_seconds=7.5), now=10.0, lowest=None) == 3
    everything_old = RetentionPolicy(time_seconds=1)
    assert releasable(objects, everything_old, now=99, lowest=None) == 4  # newest kept
    assert releasable(objects, RetentionPolicy(), now=99, lowest=None) == 0  # the default
