"""Reliable topics of one broker on its one write-ahead log (`BrokerLog`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ballast.clock import FakeClock
from ballast.metadata import MemoryStore
from ballast.storage import FsspecObjectStore, ReliableTopic, StorageConfig, StorageStats, Tier
from ballast.storage.log import BrokerLog

from .helpers import collect, payload


async def test_a_sealed_topic_back_on_the_same_broker_sees_none_of_its_old_records(
    tmp_path: Path,
    object_store: FsspecObjectStore,
    metadata: MemoryStore,
    clock: FakeClock,
    config: StorageConfig,
) -> None:
    stats = StorageStats()
    kw = {"objects": object_store, "metadata": metadata, "clock": clock, "config": config}

    def on_a(name: str, log: BrokerLog) -> ReliableTopic:
        return ReliableTopic(
            name, broker_id="a", data_dir=tmp_path / "a", stats=stats, log=log, **kw
        )

    log = BrokerLog(tmp_path / "a" / "_log", clock=clock, config=config, stats=stats)
    one, two = on_a("/default/one", log), on_a("/default/two", log)
    async with one, two:
        for start in range(0, 10, 5):
            sends = [t.append(payload(o)) for o in range(start, start + 5) for t in (one, two)]
            await asyncio.gather(*sends)
        # Both topics in the one log: no directory, no file, no task of a topic's own.
        assert [p.name for p in (tmp_path / "a").iterdir()] == ["_log"]
        assert one.opened.recovery.records == 0 and log.part("/default/two").records == 10
        await one.seal()
    # b continues the topic (its own data directory) and hands it back.
    async with ReliableTopic("/default/one", broker_id="b", data_dir=tmp_path / "b", **kw) as b:
        assert await b.append(payload(10)) == 10
        await b.seal()
    for restart in (False, True):
        if restart:  # the broker restarted: the reset frame in its log says the same
            await log.close()
            log = BrokerLog(tmp_path / "a" / "_log", clock=clock, config=config, stats=stats)
        async with on_a("/default/one", log) as back:
            assert back.opened.local_end is None  # a's old records are not the topic's
            items = await collect(back.read(0, live=False))
            assert [(i.offset, i.record.payload) for i in items] == [
                (o, payload(o)) for o in range(11 + restart)
            ]
            assert {i.tier for i in items} <= {Tier.OBJECT, Tier.WAL}
            assert await back.append(payload(11 + restart)) == 11 + restart
            await back.seal()
        async with on_a("/default/two", log) as other:  # the other topic kept its own
            assert other.opened.local_end == 9
    await log.close()
