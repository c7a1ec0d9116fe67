"""Object storage on S3: s3fs against moto's S3 server over HTTP (a real endpoint)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from ballast.clock import FakeClock
from ballast.metadata import MemoryStore
from ballast.storage import (
    FsspecObjectStore,
    ObjectNotFoundError,
    StorageConfig,
    Tier,
    load_catalog,
)

from .helpers import collect, make_topic, payload

BUCKET = "ballast-storage-test"


@pytest.fixture(scope="module")
def s3_options() -> Iterator[dict[str, Any]]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options: dict[str, Any] = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": f"http://{host}:{port}", "region_name": "us-east-1"},
            "skip_instance_cache": True,
        }
        boto3.client(
            "s3",
            endpoint_url=f"http://{host}:{port}",
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket=BUCKET)
        yield options
    finally:
        server.stop()


@pytest.fixture
def s3_store(s3_options: dict[str, Any]) -> FsspecObjectStore:
    # A fresh prefix per test: tests share the bucket, never each other's objects.
    return FsspecObjectStore(f"s3://{BUCKET}/{uuid.uuid4().hex}", s3_options)


async def test_s3_store_put_get_range_delete(s3_store: FsspecObjectStore) -> None:
    await s3_store.put("ns/t/obj.bobj", b"abcdefghij")
    assert await s3_store.get("ns/t/obj.bobj") == b"abcdefghij"
    assert await s3_store.get("ns/t/obj.bobj", 3, 6) == b"def"
    await s3_store.delete("ns/t/obj.bobj")
    with pytest.raises(ObjectNotFoundError):
        await s3_store.get("ns/t/obj.bobj")


async def test_reference_timeline_on_s3(
    tmp_path: Path, s3_store: FsspecObjectStore, config: StorageConfig
) -> None:
    clock = FakeClock()
    async with MemoryStore(clock) as metadata:
        kw: dict[str, Any] = {
            "objects": s3_store,
            "metadata": metadata,
            "clock": clock,
            "config": replace(config, max_object_bytes=300),  # several objects
        }
        async with make_topic("broker-a", tmp_path, **kw) as a:
            for offset in range(22):
                assert await a.append(payload(offset)) == offset
            await a.upload_now()
            sealed = await a.seal()
        assert sealed.last_committed_offset == 21
        catalog = await load_catalog(metadata, a.topic)
        assert catalog.end == 21 and len(catalog.objects) > 1
        async with make_topic("broker-b", tmp_path, **kw) as b:
            assert b.opened.next_offset == 22
            for offset in range(22, 28):
                assert await b.append(payload(offset)) == offset
            items = await collect(b.read(14, live=False))
    assert [i.offset for i in items] == list(range(14, 28))
    assert [i.record.payload for i in items] == [payload(o) for o in range(14, 28)]
    assert [i.tier for i in items] == [Tier.OBJECT] * 8 + [Tier.WAL] * 6
