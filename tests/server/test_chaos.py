"""Chaos, bounded: etcd, three broker processes, a gateway and real clients; for a fixed
number of rounds a random broker is SIGKILLed (then restarted), a topic is moved, a broker
is drained and activated again. Then: every acknowledged message was consumed, offsets
were never reused and every hole is a recorded crash gap, no topic was ever owned by two
brokers (the store's history replayed revision by revision), and the cluster is balanced
again."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from ballast.cluster import AdminClient
from ballast.cluster.traffic import LiveTraffic
from ballast.config import load_config
from ballast.metadata import keys
from ballast.metadata.etcd import EtcdStore
from tests.etcd_fixtures import EtcdServer
from tests.server.helpers import wait_until
from tests.server.procs import Processes, write_config

pytestmark = pytest.mark.timeout(170)

ROUNDS = 2
TOPICS = 6
BROKERS = ("x1", "x2", "x3")
CV_THRESHOLD = 0.20


async def owners_never_doubled(store: EtcdStore, start: int, end: int) -> list[str]:
    """Replay the assignments from `start` to `end`; the revisions where a topic had two."""
    listing = await store.get_prefix(keys.BROKERS_PREFIX)
    assert listing.revision >= end
    owners: dict[str, set[str]] = {}
    problems: list[str] = []
    pending: list[tuple[str, str, bool]] = []
    current = start

    def check(revision: int) -> None:
        for key, _, deleted in pending:
            if key.endswith("/state"):
                continue
            broker, topic = keys.parse_assignment_key(key)
            if deleted:
                owners.get(str(topic), set()).discard(broker)
            else:
                owners.setdefault(str(topic), set()).add(broker)
        pending.clear()
        for topic, brokers in owners.items():
            if len(brokers) > 1:
                problems.append(f"revision {revision}: {topic} owned by {sorted(brokers)}")

    watch = store.watch_prefix(keys.BROKERS_PREFIX, start)
    seen = 0
    try:
        while True:
            # The history up to `end` is in the store already: it arrives at once.
            try:
                event = await asyncio.wait_for(watch.__anext__(), 3.0)
            except (TimeoutError, StopAsyncIteration):
                break
            if event.kind not in ("put", "delete") or event.revision > end:
                continue
            seen += 1
            if event.revision != current:
                check(current)
                current = event.revision
            pending.append((event.key, "", event.kind == "delete"))
    finally:
        await watch.aclose()
    check(current)
    assert seen > 0, "no assignment history replayed"
    return problems


async def test_chaos_rounds_keep_every_message_and_one_owner(
    etcd_store: EtcdStore, etcd_server: EtcdServer, tmp_path: Path
) -> None:
    rng = random.Random(11)
    config_path = write_config(
        tmp_path / "c.yaml",
        tmp_path / "data",
        load_manager={
            "rebalancing": {
                "enabled": True,
                "aggressiveness": "aggressive",
                "check_interval_seconds": 0.5,
                "cooldown_seconds": 0,
                "min_topic_age_seconds": 0,
                "max_moves_per_hour": 10_000,
                "target_cv": 0.05,
            }
        },
        data_plane={"unacked_window": 100},
    )
    admin = AdminClient(etcd_store, config=load_config(config_path))
    start_revision = (await etcd_store.get_prefix(keys.BROKERS_PREFIX)).revision + 1
    procs = Processes(etcd_server.client_url, config_path, etcd_store)
    topics = [f"/default/chaos-{i}" for i in range(TOPICS)]
    traffic: LiveTraffic | None = None
    try:
        await asyncio.gather(*(procs.start_broker(b) for b in BROKERS))
        gateway = await procs.start_gateway()
        traffic = LiveTraffic(gateway, topics, rate=15)
        await traffic.start()
        live = traffic

        async def flowing() -> bool:
            return all(len(t.delivered) >= 5 for t in live.topics.values())

        await wait_until(flowing, 40, "traffic on every topic")
        for round_no in range(ROUNDS):
            # kill -9 a random broker, wait for its lease to expire, restart it
            victim = rng.choice(BROKERS)

            async def gone(b: str = victim) -> bool:
                return await etcd_store.get(keys.register(b)) is None

            await procs.kill(victim)
            await wait_until(gone, 20, f"{victim}'s registration to expire")
            await procs.start_broker(victim)
            # move a live topic
            topic = rng.choice(topics)
            if await procs.owner(topic) is not None:
                await admin.unload_topic(topic)
            # drain a broker, then activate it again (once)
            if round_no == 0:
                drained = rng.choice([b for b in BROKERS if b != victim])
                await admin.drain(drained)

                async def empty(b: str = drained) -> bool:
                    return not (await admin.view()).topics_of(b)

                await wait_until(empty, 30, f"{drained} to be drained")
                await admin.activate(drained)

        async def everything_placed() -> bool:
            view = await admin.view()
            return all(view.owner(t) is not None for t in topics) and not view.markers

        await wait_until(everything_placed, 30, "every topic to have an owner")

        async def balanced() -> bool:
            return (await admin.balance()).stats.cv < CV_THRESHOLD

        await wait_until(balanced, 40, f"the cluster to be balanced (CV < {CV_THRESHOLD})")
        await asyncio.sleep(1.0)
        started = time.monotonic()
        await traffic.stop_producing(settle=40)
        verdict = await traffic.verdict(etcd_store)
        assert verdict.produced > 100, verdict
        assert verdict.lost == 0, (verdict.lost_examples, time.monotonic() - started)
        assert verdict.reused_offsets == 0 and verdict.unexplained_gaps == 0, verdict
        end_revision = (await etcd_store.get_prefix(keys.BROKERS_PREFIX)).revision
        assert await owners_never_doubled(etcd_store, start_revision, end_revision) == []
    finally:
        if traffic is not None:
            await traffic.close()
        await procs.close()
