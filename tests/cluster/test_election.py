"""Leader election: one leader, immediate hand-over, fencing, lease expiry on a fake clock."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from ballast.clock import FakeClock, SystemClock
from ballast.cluster import LeaderElection
from ballast.metadata import MetadataStore, Put, keys
from ballast.metadata.memory import MemoryStore
from ballast.metadata.records import leader_value
from tests.cluster.helpers import wait_until

pytestmark = pytest.mark.timeout(60)


def leaders(elections: list[LeaderElection]) -> list[str]:
    return [e.broker_id for e in elections if e.is_leader]


async def test_one_leader_and_an_immediate_handover(store: MetadataStore) -> None:
    clock = SystemClock()
    elections = [LeaderElection(store, clock, f"b{i}", ttl=5.0) for i in range(3)]
    async with contextlib.AsyncExitStack() as stack:
        for e in elections:
            await stack.enter_async_context(e)

        async def one() -> bool:
            return len(leaders(elections)) == 1

        await wait_until(one, 5, "one leader")
        await asyncio.sleep(0.3)
        assert len(leaders(elections)) == 1  # and it stays one
        winner = next(e for e in elections if e.is_leader)
        kv = await store.get(keys.LEADER)
        assert kv is not None and kv.value["broker_id"] == winner.broker_id
        assert winner.term is not None and kv.create_revision == winner.term.revision
        assert all(e.leader == winner.broker_id for e in elections)

        # A graceful stop resigns: a follower takes over well within the 5 s lease TTL.
        await winner.__aexit__(None, None, None)
        rest = [e for e in elections if e is not winner]
        took = await wait_until(lambda: one_of(rest), 2, "a new leader after resigning")
        assert took < 2
        elections = rest


async def one_of(elections: list[LeaderElection]) -> bool:
    return len(leaders(elections)) == 1


async def test_a_deposed_leader_cannot_write(store: MetadataStore) -> None:
    clock = SystemClock()
    first = LeaderElection(store, clock, "b1", ttl=5.0)
    async with first:
        term = await asyncio.wait_for(first.elected(), 5)
        # The key vanishes (as when the lease expires) and another broker wins at once.
        # (Written by the test, so that b1, campaigning again, cannot win the race.)
        await store.delete(keys.LEADER)
        won = await store.create_if_absent(keys.LEADER, leader_value("b2", clock.now()))
        if not won:  # b1 was quicker: depose it once more, now that it follows no one
            await wait_until(_is_leader(first), 5, "b1 leads again")
            term = first.term  # type: ignore[assignment]
            await store.delete(keys.LEADER)
            assert await store.create_if_absent(keys.LEADER, leader_value("b2", clock.now()))
        # The old term's fenced write fails, whether or not b1 has noticed yet.
        result = await store.txn([term.fence], [Put(keys.LOAD_BALANCE, {"from": "b1"})])
        assert not result.succeeded
        assert await store.get(keys.LOAD_BALANCE) is None
        await wait_until(_ended(term.ended), 5, "b1 notices its term is over")
        assert not first.is_leader
        await wait_until(_follows(first, "b2"), 5, "b1 follows b2")
        await store.delete(keys.LEADER)


def _is_leader(election: LeaderElection):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return election.is_leader

    return check


def _follows(election: LeaderElection, leader: str):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return election.leader == leader

    return check


def _ended(event: asyncio.Event):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return event.is_set()

    return check


async def test_crashed_leader_is_replaced_when_its_lease_expires_on_the_clock() -> None:
    clock = FakeClock()
    async with MemoryStore(clock) as store:
        first = LeaderElection(store, clock, "b1", ttl=10.0)
        second = LeaderElection(store, clock, "b2", ttl=10.0)
        await first.__aenter__()
        await clock.advance(0)
        assert first.is_leader
        async with second:
            await clock.advance(25)  # b1 keeps its lease alive meanwhile
            assert first.is_leader and not second.is_leader
            first.abandon()  # crash: no resignation, the lease is left to expire
            await first.__aexit__(None, None, None)
            # The last refresh was at most ttl/3 ago: the lease outlives the crash by
            # between 2/3 ttl and a whole ttl, and not a moment longer.
            await clock.advance(6)
            assert not second.is_leader
            await clock.advance(4.5)
            assert second.is_leader
