"""`EtcdStore` beyond the contract: pagination, endpoints, TLS, auth and fault tolerance.

Fault tests use real failures: etcd stopped or killed and restarted on the same data, a
member of a 3-member cluster killed, and a TCP proxy cut between a client and etcd.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from etcd_fixtures import EtcdCluster, EtcdServer, free_port, make_tls_files, tcp_proxy
from metadata_helpers import assert_quiet, eventually, next_event, take

from ballast.metadata import (
    EtcdStore,
    MetadataError,
    MetadataUnavailableError,
    OutcomeUnknownError,
    WatchEvent,
)
from ballast.metadata.etcd import parse_endpoints

pytestmark = pytest.mark.timeout(60)


# -- configuration ----------------------------------------------------------------------------


def test_parse_endpoints_accepts_urls_and_lists() -> None:
    assert parse_endpoints("http://127.0.0.1:2379") == (["127.0.0.1:2379"], False)
    assert parse_endpoints(" http://a:1 , http://b:2,") == (["a:1", "b:2"], False)
    assert parse_endpoints(["https://a:1", "https://b:2"]) == (["a:1", "b:2"], True)
    assert parse_endpoints("a:1") == (["a:1"], False)
    assert parse_endpoints("http://[::1]:2379") == (["[::1]:2379"], False)


@pytest.mark.parametrize(
    ("endpoints", "message"),
    [
        ("", "no etcd endpoint"),
        ("ftp://a:1", "unsupported scheme"),
        ("http://a", "host:port"),
        ("http://a:1/path", "host:port"),
        ("http://a:notaport", "invalid port"),
        ("http://a:1,https://b:2", "mix http and https"),
    ],
)
def test_parse_endpoints_rejects_bad_input_clearly(endpoints: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_endpoints(endpoints)


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="both username and password"):
        EtcdStore("http://a:1", username="root")
    with pytest.raises(ValueError, match="cert_key and cert_cert"):
        EtcdStore("http://a:1", cert_key="k.pem")
    with pytest.raises(MetadataError, match="cannot read etcd CA certificate"):
        EtcdStore("https://a:1", ca_cert="/nonexistent/ca.pem")


async def test_unreachable_etcd_fails_within_the_timeout_naming_endpoints() -> None:
    port = free_port()
    async with EtcdStore(f"http://127.0.0.1:{port}", timeout=1.0) as store:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(MetadataUnavailableError, match=f"127.0.0.1:{port}"):
            await store.get("/k")
        assert loop.time() - start < 3.0


# -- pagination ---------------------------------------------------------------------------------


async def test_get_and_list_reads_the_other_pages_at_its_own_revision(
    etcd_server: EtcdServer, prefix: str
) -> None:
    async with EtcdStore(etcd_server.client_url, page_size=3) as store:
        await store.put(prefix + "meta", "m")
        revisions = [await store.put(f"{prefix}s/{i:02d}", i) for i in range(10)]
        kv, listing = await store.get_and_list(prefix + "meta", prefix + "s/")
        assert kv is not None and kv.value == "m"
        assert [item.value for item in listing.items] == list(range(10))
        assert listing.revision == revisions[-1]  # four pages, the first in the transaction


async def test_get_prefix_pages_through_a_consistent_snapshot(
    etcd_server: EtcdServer, prefix: str
) -> None:
    async with EtcdStore(etcd_server.client_url, page_size=3) as store:
        for i in range(10):
            await store.put(f"{prefix}{i:02d}", i)
        listing = await store.get_prefix(prefix)
        assert [kv.value for kv in listing.items] == list(range(10))

        # Writers racing the paginated read: the listing is exactly the state at its
        # revision, never a mix of pages read at different revisions.
        written: dict[str, int] = {}

        async def writer() -> None:
            for i in range(40):
                written[f"{prefix}w{i:02d}"] = await store.put(f"{prefix}w{i:02d}", i)

        task = asyncio.create_task(writer())
        await asyncio.sleep(0.02)
        racing = await store.get_prefix(prefix + "w")
        await task
        expected = sorted(k for k, rev in written.items() if rev <= racing.revision)
        assert [kv.key for kv in racing.items] == expected
        assert all(kv.mod_revision <= racing.revision for kv in racing.items)


# -- endpoints and failover ---------------------------------------------------------------------


async def test_dead_first_endpoint_fails_over_to_the_next(
    etcd_server: EtcdServer, prefix: str
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with EtcdStore(f"{dead},{etcd_server.client_url}", timeout=5) as store:
        rev = await store.put(prefix + "k", 1)
        kv = await store.get(prefix + "k")
        assert kv is not None and kv.mod_revision == rev
        assert store.current_endpoint == f"127.0.0.1:{etcd_server.client_port}"


async def test_cluster_keeps_serving_when_the_connected_member_dies(
    etcd_cluster: EtcdCluster,
) -> None:
    p = "/cluster-fault/"
    async with (
        EtcdStore(etcd_cluster.endpoints, timeout=15) as store,
        EtcdStore(etcd_cluster.endpoints, timeout=15) as watcher,
    ):
        first = await store.put(p + "0", 0)
        lease = await store.grant_lease(2)
        lease.start_keep_alive()
        await store.put(p + "leased", "kept alive", lease=lease.id)
        async with watcher.watch_prefix(p, first) as watch:
            assert (await next_event(watch)).value == 0
            assert (await next_event(watch)).key == p + "leased"

            # Both clients talk to the first member; crash exactly that one.
            connected = store.current_endpoint
            victim = next(m for m in etcd_cluster.members if m.client_url.endswith(connected))
            await asyncio.to_thread(victim.kill)

            revisions = [await store.put(f"{p}{i}", i) for i in range(1, 6)]
            assert store.current_endpoint != connected
            kv = await store.get(p + "3")
            assert kv is not None and kv.value == 3
            assert await store.create_if_absent(p + "leader", "b1")
            assert len((await store.get_prefix(p)).items) == 8  # 0, leased, 1-5, leader
            revisions.append((await store.get(p + "leader")).mod_revision)  # type: ignore[union-attr]

            events = await take(watch, 6, timeout=15)
            assert [e.revision for e in events] == revisions
            assert [e.value for e in events] == [1, 2, 3, 4, 5, "b1"]
            await assert_quiet(watch)

            # The keep-alive failed over too: the leased key outlives its TTL (plus etcd's
            # 500 ms expiry check) counted from the crash.
            await asyncio.sleep(lease.ttl + 1.0)
            assert await store.get(p + "leased") is not None
            assert not lease.lost.is_set()
        await lease.revoke()


# -- restarts and outages -----------------------------------------------------------------------


@pytest.mark.parametrize("crash", [False, True], ids=["stop", "kill"])
async def test_watch_survives_an_etcd_restart_without_loss_or_duplicates(
    fresh_etcd_server: EtcdServer, crash: bool
) -> None:
    server = fresh_etcd_server
    p = "/restart/"
    async with (
        EtcdStore(server.client_url, timeout=20) as watcher,
        EtcdStore(server.client_url, timeout=20) as writer,
    ):

        async def write(values: range) -> list[int]:
            return [await writer.put(f"{p}{i:02d}", i) for i in values]

        expected = await write(range(3))
        async with watcher.watch_prefix(p, expected[0]) as watch:
            events = await take(watch, 3)

            await asyncio.to_thread(server.kill if crash else server.stop)
            # Writes issued during the outage wait (retrying) until etcd is back.
            queued = asyncio.create_task(write(range(3, 6)))
            await asyncio.sleep(0.5)
            assert not queued.done()
            await asyncio.to_thread(server.start)
            expected += await queued
            expected += await write(range(6, 9))

            events += await take(watch, 6, timeout=20)
            assert [e.revision for e in events] == expected
            assert [e.value for e in events] == list(range(9))
            await assert_quiet(watch, 0.5)


async def test_watch_resumes_after_a_network_outage_with_writes_during_it(
    etcd_server: EtcdServer, prefix: str
) -> None:
    async with (
        tcp_proxy(etcd_server.client_port) as proxy,
        EtcdStore(proxy.url, timeout=10) as watcher,
        EtcdStore(etcd_server.client_url) as writer,
    ):
        watch = watcher.watch_prefix(prefix)
        await watch.ready()
        expected = [await writer.put(prefix + "before", 0)]
        events = [await next_event(watch)]

        await proxy.cut()
        # Another client keeps writing while this watcher is cut off.
        expected += [await writer.put(f"{prefix}during{i}", i) for i in range(5)]
        expected.append(await writer.put(prefix + "x", 9))
        await asyncio.sleep(0.3)
        await proxy.restore()
        expected += [await writer.put(f"{prefix}after{i}", i) for i in range(3)]

        events += await take(watch, 9, timeout=10)
        await watch.aclose()
        assert [e.revision for e in events] == expected
        assert len({(e.key, e.revision) for e in events}) == len(events)


async def test_a_frozen_connection_is_noticed_by_its_keepalive_and_the_watch_resumes(
    etcd_server: EtcdServer, prefix: str
) -> None:
    """A gray failure: the watcher's connection stays open and forwards nothing (a hung
    middlebox, a blackholed path) while new connections work. The keepalive ping goes
    unanswered, the connection is dropped and counted, and the watch resumes where it was
    on a new one: within keepalive + timeout (5 + 1 s here), not grpc-core's 60 s."""
    async with (
        tcp_proxy(etcd_server.client_port) as proxy,
        EtcdStore(proxy.url, timeout=10, keepalive=5, keepalive_timeout=1) as watcher,
        EtcdStore(etcd_server.client_url) as writer,
    ):
        watch = watcher.watch_prefix(prefix)
        await watch.ready()
        first = await writer.put(prefix + "before", 0)
        assert (await next_event(watch)).revision == first
        assert proxy.freeze() == 1
        during = await writer.put(prefix + "during", 1)
        started = asyncio.get_running_loop().time()
        event = await next_event(watch, timeout=20)
        noticed = asyncio.get_running_loop().time() - started
        assert (event.key, event.revision) == (prefix + "during", during)
        assert noticed < 5 + 1 + 3, noticed  # a ping every 5 s, 1 s for its answer, slack
        assert watcher.connection_timeouts == 1
        await watch.aclose()


async def test_a_failover_by_another_task_does_not_strand_calls_on_the_old_channel(
    etcd_server: EtcdServer, prefix: str
) -> None:
    """One task fails over (closes the shared channel) while others have calls on it.

    A closed channel can leave a call on it hanging for ever: a watch then misses every
    later change (seen in the console after a network cut, when a read noticed the dead
    endpoint first). Every call on the old channel must move to the new one.
    """
    async with (
        EtcdStore(etcd_server.client_url, timeout=10) as store,
        EtcdStore(etcd_server.client_url) as writer,
    ):
        watches = [store.watch_prefix(prefix + w) for w in ("a/", "b/")]
        for watch in watches:
            await watch.ready()
        old = await store._current_connection(asyncio.get_running_loop().time() + 5)
        await store._rotate(old.generation)  # what `_connection` does on a dead endpoint

        revisions = [await writer.put(prefix + w + "k", i) for i, w in enumerate(("a/", "b/"))]
        for watch, revision in zip(watches, revisions, strict=True):
            event = await next_event(watch, timeout=10)
            assert (event.kind, event.revision) == ("put", revision)
        assert (await store.get(prefix + "a/k")) is not None  # reads go on, too
        for watch in watches:
            await watch.aclose()


async def test_outage_across_a_compaction_yields_compacted(
    etcd_server: EtcdServer, prefix: str
) -> None:
    async with (
        tcp_proxy(etcd_server.client_port) as proxy,
        EtcdStore(proxy.url, timeout=10) as watcher,
        EtcdStore(etcd_server.client_url) as writer,
    ):
        watch = watcher.watch_prefix(prefix)
        await watch.ready()
        await writer.put(prefix + "a", 1)
        assert (await next_event(watch)).kind == "put"

        await proxy.cut()
        await writer.put(prefix + "a", 2)
        latest = await writer.put(prefix + "a", 3)
        await writer.compact(latest)  # the watcher's resume point is gone
        await proxy.restore()

        event = await next_event(watch, timeout=10)
        assert event.kind == "compacted" and event.revision == latest
        with pytest.raises(StopAsyncIteration):
            await next_event(watch)
        # The documented recovery: re-list, then watch from the listing's revision + 1.
        listing = await watcher.get_prefix(prefix)
        assert [kv.value for kv in listing.items] == [3]
        async with watcher.watch_prefix(prefix, listing.revision + 1) as again:
            rev = await writer.put(prefix + "a", 4)
            assert await next_event(again) == WatchEvent("put", prefix + "a", 4, rev)


async def test_lost_txn_reply_raises_outcome_unknown_not_a_false_failure(
    etcd_server: EtcdServer, prefix: str
) -> None:
    async with (
        tcp_proxy(etcd_server.client_port) as proxy,
        EtcdStore(proxy.url, timeout=5) as store,
        EtcdStore(etcd_server.client_url) as observer,
    ):
        await store.put(prefix + "warm", 1)  # connection up
        proxy.hold_responses = True
        attempt = asyncio.create_task(store.create_if_absent(prefix + "leader", "me"))

        async def applied() -> bool:
            return await observer.get(prefix + "leader") is not None

        await eventually(applied, 5)
        await proxy.cut()  # the reply dies with the connection
        proxy.hold_responses = False
        with pytest.raises(OutcomeUnknownError, match="re-read"):
            await attempt
        await proxy.restore()
        # A blind retry would now report "not created" although this client created it.
        kv = await store.get(prefix + "leader")
        assert kv is not None and kv.value == "me"


async def test_lost_put_reply_is_retried_transparently(
    etcd_server: EtcdServer, prefix: str
) -> None:
    async with (
        tcp_proxy(etcd_server.client_port) as proxy,
        EtcdStore(proxy.url, timeout=10) as store,
        EtcdStore(etcd_server.client_url) as observer,
    ):
        await store.put(prefix + "warm", 1)
        proxy.hold_responses = True
        attempt = asyncio.create_task(store.put(prefix + "k", "v"))

        async def applied() -> bool:
            return await observer.get(prefix + "k") is not None

        await eventually(applied, 5)
        await proxy.cut()
        proxy.hold_responses = False
        await asyncio.sleep(0.2)
        await proxy.restore()
        revision = await asyncio.wait_for(attempt, 10)
        kv = await observer.get(prefix + "k")
        assert kv is not None and kv.value == "v" and kv.mod_revision == revision


# -- security -----------------------------------------------------------------------------------


async def test_tls_with_client_certificates(tmp_path: Path) -> None:
    tls = make_tls_files(tmp_path / "tls")
    with EtcdServer(tmp_path / "etcd", tls=tls) as server:
        assert server.client_url.startswith("https://")
        async with EtcdStore(
            server.client_url,
            ca_cert=tls.ca,
            cert_key=tls.client_key,
            cert_cert=tls.client_cert,
            timeout=5,
        ) as store:
            async with store.watch_prefix("/tls/") as watch:
                await watch.ready()
                rev = await store.put("/tls/k", {"secure": True})
                assert await next_event(watch) == WatchEvent("put", "/tls/k", {"secure": True}, rev)
            lease = await store.grant_lease(5)
            await lease.refresh()
            await lease.revoke()

        # Without the client certificate the server refuses the handshake.
        async with EtcdStore(server.client_url, ca_cert=tls.ca, timeout=1.0) as no_cert:
            with pytest.raises(MetadataUnavailableError):
                await no_cert.get("/tls/k")
        # Plain text against a TLS port gets nowhere either.
        plain = server.client_url.replace("https://", "http://")
        async with EtcdStore(plain, timeout=1.0) as no_tls:
            with pytest.raises(MetadataUnavailableError):
                await no_tls.get("/tls/k")


async def test_username_password_auth_including_token_expiry(tmp_path: Path) -> None:
    # A 1 s token TTL makes the store's token expire between calls below.
    with EtcdServer(tmp_path, extra_args=("--auth-token-ttl=1",)) as server:
        server.etcdctl("user", "add", "root:rootpw")
        server.etcdctl("auth", "enable")

        async with EtcdStore(
            server.client_url, username="root", password="rootpw", timeout=5
        ) as store:
            rev = await store.put("/auth/k", 1)
            async with store.watch_prefix("/auth/", rev) as watch:
                assert (await next_event(watch)).value == 1
                await asyncio.sleep(2.5)  # the simple token expires after 1 s unused
                rev2 = await store.put("/auth/k", 2)
                assert await next_event(watch) == WatchEvent("put", "/auth/k", 2, rev2)
            assert await store.create_if_absent("/auth/once", True)

        async with EtcdStore(server.client_url, username="root", password="wrong") as bad:
            with pytest.raises(MetadataError, match="authentication as 'root' failed"):
                await bad.get("/auth/k")
        async with EtcdStore(server.client_url, timeout=2) as anonymous:
            with pytest.raises(MetadataError):
                await anonymous.get("/auth/k")
