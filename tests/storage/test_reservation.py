"""Offset reservations: a crash never makes a topic reuse an offset, even with its disk.

The owner may assign offsets up to `reserved_through` (in the topic's state key) and
extends it, fenced on its claim, before it runs out; whoever opens after a crash
continues after it. The offsets skipped that way are recorded gaps that readers step
over; since a send is acknowledged only once committed to object storage, a gap never
covers an acknowledged message.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ballast.clock import FakeClock
from ballast.metadata import MemoryStore, keys
from ballast.metadata.store import (
    Compare,
    MetadataUnavailableError,
    OutcomeUnknownError,
    Put,
    TxnOp,
)
from ballast.storage import (
    DurabilityTimeoutError,
    FsspecObjectStore,
    InitialPosition,
    Message,
    ReservationError,
    SealedState,
    StartSource,
    StorageConfig,
    StorageStats,
    Tier,
    TopicFencedError,
    TopicStatus,
    WalClosedError,
    load_catalog,
)

from .helpers import FlakyObjectStore, advancing, collect, eventually, make_topic, payload

STEP = 100
TOPIC = "/default/reliable_topic"


@pytest.fixture
def kw(
    object_store: FsspecObjectStore, metadata: MemoryStore, clock: FakeClock, config: StorageConfig
) -> dict[str, Any]:
    config = replace(config, offset_reservation_step=STEP)
    return {"objects": object_store, "metadata": metadata, "clock": clock, "config": config}


async def append_range(topic: Any, start: int, stop: int) -> None:
    for offset in range(start, stop):
        assert await topic.append(payload(offset)) == offset


async def state_of(metadata: Any) -> SealedState:
    kv = await metadata.get(keys.storage_state(TOPIC))
    assert kv is not None
    return SealedState.from_dict(kv.value)


async def crash_with_disk(topic: Any) -> None:
    """The broker dies with its disk: no seal, no release, local files gone."""
    await topic.close(release_reservation=False)
    shutil.rmtree(topic.directory)


async def read_all(topic: Any, start: int = 0) -> list[int]:
    async with asyncio.timeout(5):  # a reader waiting for skipped offsets would hang here
        return [i.offset for i in await collect(topic.read(start, live=False))]


async def test_disk_loss_never_reuses_an_offset_and_keeps_every_acknowledged_message(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    async with make_topic("a", tmp_path, **kw) as a:
        assert a.reserved_through == STEP - 1
        sub = await a.subscribe("s", initial=InitialPosition.EARLIEST)
        await append_range(a, 0, 50)  # acknowledged: committed to object storage
        assert a.uploaded_offset == 49
        await sub.ack(29)
        await a.flush_cursors()
        reservation = a.reserved_through
        await crash_with_disk(a)
    assert (await state_of(metadata)).reserved_through == reservation

    stats = StorageStats()
    async with make_topic("b", tmp_path, **kw, stats=stats) as b:
        opened = b.opened
        assert opened.next_offset == reservation + 1 and opened.next_offset > 49
        assert opened.source is StartSource.RESERVATION
        # Only offsets that were never acknowledged are skipped.
        assert opened.gap == (50, reservation) and b.gaps == ((50, reservation),)
        assert "reservation" in opened.reason and stats.opens_by_source == {"reservation": 1}
        state = await state_of(metadata)
        assert (state.broker_id, state.gaps) == ("b", ((50, reservation),))
        first = reservation + 1
        await append_range(b, first, first + 5)
        # From 0: a's messages from object storage, then b's; no hang, no duplicate.
        items = await collect(b.read(0, live=False))
        assert [i.offset for i in items] == [*range(50), *range(first, first + 5)]
        assert [i.tier for i in items] == [Tier.OBJECT] * 50 + [Tier.WAL] * 5
        assert [i.record.payload for i in items] == [payload(i.offset) for i in items]
        assert stats.reader_gaps == 0 and stats.reader_known_gaps >= 1
        # The subscription resumes after its cursor with everything it had not acked.
        sub = await b.subscribe("s")
        assert sub.start_offset == 30
        assert await read_all(b, sub.start_offset) == [*range(30, 50), *range(first, first + 5)]
        # A live reader from inside the gap gets b's next message as it is appended.
        received: list[int] = []

        async def consume() -> None:
            async for item in b.read(60):
                received.append(item.offset)

        consumer = asyncio.ensure_future(consume())
        await eventually(lambda: len(received) == 5)
        await append_range(b, first + 5, first + 6)
        await eventually(lambda: len(received) == 6)
        assert received == list(range(first, first + 6))
        catalog = await load_catalog(metadata, b.topic)
        flat = [o for d in catalog.objects for o in range(d.start, d.end + 1)]
        assert flat == [*range(50), *range(first, first + 6)]
        await b.seal()
        await asyncio.wait_for(consumer, 5)
    async with make_topic("c", tmp_path, **kw) as c:
        assert (c.opened.next_offset, c.opened.source, c.opened.gap) == (
            first + 6,
            StartSource.SEALED,
            None,
        )
        assert c.gaps == ((50, reservation),)  # carried through the seal
        assert await read_all(c) == [*range(50), *range(first, first + 6)]


async def test_an_append_that_was_not_acknowledged_may_be_skipped_never_an_acknowledged_one(
    tmp_path: Path, kw: dict[str, Any], object_store: FsspecObjectStore
) -> None:
    flaky = FlakyObjectStore(object_store)
    config = replace(kw["config"], ack_timeout_seconds=0.2)
    async with make_topic("a", tmp_path, **{**kw, "objects": flaky, "config": config}) as a:
        await append_range(a, 0, 10)
        flaky.fail_puts = 10**6  # the object store goes down
        with pytest.raises(DurabilityTimeoutError, match="offset 10 not committed"):
            await a.append(payload(10))
        assert a.uploaded_offset == 9
        reservation = a.reserved_through
        await crash_with_disk(a)
    async with make_topic("b", tmp_path, **kw) as b:
        assert b.opened.gap == (10, reservation)  # 10 was never acknowledged
        assert await read_all(b) == list(range(10))


async def test_consecutive_disk_losses_lose_nothing_acknowledged(
    tmp_path: Path, kw: dict[str, Any]
) -> None:
    async with make_topic("a", tmp_path, **kw) as a:
        await append_range(a, 0, 20)
        await crash_with_disk(a)
    async with make_topic("b", tmp_path, **kw) as b:
        first_b = b.next_offset
        await append_range(b, first_b, first_b + 20)
        await crash_with_disk(b)
    async with make_topic("c", tmp_path, **kw) as c:
        first_c = c.next_offset
        assert first_c > first_b + 19
        assert c.gaps == ((20, first_b - 1), (first_b + 20, first_c - 1))
        await append_range(c, first_c, first_c + 3)
        assert await read_all(c) == [
            *range(20),
            *range(first_b, first_b + 20),
            *range(first_c, first_c + 3),
        ]


async def test_crash_on_the_same_broker_keeps_its_wal_and_skips_the_rest_of_the_reservation(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    async with make_topic("a", tmp_path, **kw) as a:
        await append_range(a, 0, 20)
        await a.upload_now()
        await append_range(a, 20, 50)
        reservation = a.reserved_through
        await a.close(release_reservation=False)  # a crash: the disk survives
    async with make_topic("a", tmp_path, **kw) as again:
        opened = again.opened
        assert (opened.next_offset, opened.source, opened.local_end) == (
            reservation + 1,
            StartSource.RESERVATION,
            49,
        )
        assert opened.discarded_segments == 0 and opened.gap == (50, reservation)
        first = reservation + 1
        await append_range(again, first, first + 5)
        assert await read_all(again) == [*range(50), *range(first, first + 5)]
        assert await read_all(again, 30) == [*range(30, 50), *range(first, first + 5)]
        # The un-uploaded 20..49 come from the kept WAL; an object never spans the gap.
        assert await again.upload_now() == first + 4
        catalog = await load_catalog(metadata, again.topic)
        flat = [o for d in catalog.objects for o in range(d.start, d.end + 1)]
        assert flat == [*range(50), *range(first, first + 5)]
        assert all(d.end < 50 or d.start >= first for d in catalog.objects)
    # A graceful close released the reservation: the restart continues without a gap,
    # and the WAL's own record of the gap survives the restart.
    async with make_topic("a", tmp_path, **kw) as third:
        assert (third.opened.next_offset, third.opened.gap) == (first + 5, None)
        assert third.opened.recovery.gaps == ((50, reservation),)
        assert third.gaps == ((50, reservation),)
        assert await read_all(third) == [*range(50), *range(first, first + 5)]


async def test_a_graceful_close_releases_the_unused_reservation(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    async with make_topic("a", tmp_path, **kw) as a:
        await append_range(a, 0, 7)
        assert (await state_of(metadata)).reserved_through == STEP - 1
    assert (await state_of(metadata)).reserved_through == 6
    async with make_topic("a", tmp_path, **kw) as again:
        assert (again.opened.next_offset, again.opened.source) == (7, StartSource.LOCAL_WAL)
        assert again.opened.gap is None and again.gaps == ()


async def test_a_deposed_owner_cannot_extend_its_reservation(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    config = replace(kw["config"], offset_reservation_step=10)
    a = make_topic("a", tmp_path, **{**kw, "config": config})
    await a.open()
    assert a.reserved_through == 9
    # Split brain (the leader never assigns two owners; this test forces it): b claims
    # the topic while a still runs, and continues after a's reservation.
    async with make_topic("b", tmp_path, **{**kw, "config": config}) as b:
        assert b.opened.next_offset == 10 and b.opened.source is StartSource.RESERVATION
        # a cannot commit, so it acknowledges nothing (and never extends its reservation).
        with pytest.raises(TopicFencedError, match="acknowledges nothing more"):
            await a.append(b"zombie")
        with pytest.raises((TopicFencedError, WalClosedError)):
            for _ in range(20):
                await a.append(b"zombie")
        assert await b.append(b"owner") == 10
        assert await read_all(b) == [10]
        state = await state_of(metadata)
        assert (state.broker_id, state.reserved_through) == ("b", 19)
        with pytest.raises(TopicFencedError):
            await a.seal()
        assert a.status is TopicStatus.CLOSED
    assert a.stats.reservation_extensions == 0


async def test_the_reservation_is_extended_before_it_runs_out(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    step = 20
    stats = StorageStats()
    config = replace(kw["config"], offset_reservation_step=step)
    async with make_topic("a", tmp_path, **{**kw, "config": config}, stats=stats) as topic:
        await append_range(topic, 0, 200)
        # Extended in the background at half a step: no append ever waited for it.
        assert stats.reservation_stalls == 0
        assert stats.reservation_extensions == 200 // step
        assert topic.reserved_through >= 199
        # A batch larger than a step waits for one extension that covers all of it.
        got = await topic.append_batch([Message(payload(o)) for o in range(200, 260)])
        assert got == range(200, 260) and topic.reserved_through >= 259
        assert stats.reservation_stalls == 1
        assert await read_all(topic) == list(range(260))


async def test_concurrent_producers_keep_their_order_across_extensions(
    tmp_path: Path, kw: dict[str, Any]
) -> None:
    config = replace(kw["config"], offset_reservation_step=4)
    async with make_topic("a", tmp_path, **{**kw, "config": config}) as topic:

        async def producer(name: str) -> list[int]:
            return [await topic.append(f"{name}-{i}".encode()) for i in range(30)]

        results = await asyncio.gather(*(producer(f"p{n}") for n in range(5)))
        offsets = sorted(o for r in results for o in r)
        assert offsets == list(range(150))  # each exactly once, none unreserved
        assert all(r == sorted(r) for r in results)
        assert topic.reserved_through >= 149


class FlakyTxnMetadata:
    """Passes everything to `inner`; txn fails (before or after applying) when told to."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.fail_before = 0
        self.lose_reply = 0

    async def txn(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail_before > 0:
            self.fail_before -= 1
            raise MetadataUnavailableError("injected: store unavailable")
        result = await self.inner.txn(*args, **kwargs)
        if self.lose_reply > 0:
            self.lose_reply -= 1
            raise OutcomeUnknownError("injected: reply lost")
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_failed_extension_fails_the_append_that_needs_it_then_recovers(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    flaky = FlakyTxnMetadata(metadata)
    config = replace(kw["config"], offset_reservation_step=10)
    topic = make_topic("a", tmp_path, **{**kw, "metadata": flaky, "config": config})
    async with topic:
        await append_range(topic, 0, 4)
        flaky.fail_before = 10**6  # the store is down
        # Reserved, but not committed: not acknowledged (committed later, once it is back).
        pending = [asyncio.ensure_future(topic.append(payload(o))) for o in range(4, 10)]
        await asyncio.sleep(0.01)
        with pytest.raises(ReservationError, match="could not extend"):
            await topic.append(b"unreserved")
        assert topic.next_offset == 10  # never assigned
        assert not any(p.done() for p in pending)
        flaky.fail_before = 0
        assert await advancing(kw["clock"], asyncio.gather(*pending)) == list(range(4, 10))
        assert await topic.append(payload(10)) == 10
        # A lost reply: the write was applied; the next write adopts it, not fenced.
        flaky.lose_reply = 1
        await advancing(kw["clock"], append_range(topic, 11, 40))
        assert topic.reserved_through >= 39
        state = await state_of(metadata)
        assert state.broker_id == "a" and state.reserved_through == topic.reserved_through
        assert (await topic.seal()).last_committed_offset == 39


class GatedTxnMetadata:
    """Passes everything to `inner`; while `gate` is set, txns wait for it to open."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.gate: asyncio.Event | None = None

    async def txn(self, *args: Any, **kwargs: Any) -> Any:
        if self.gate is not None:
            await self.gate.wait()
        return await self.inner.txn(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_an_append_waiting_for_its_reservation_gets_no_offset_after_the_seal(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    gated = GatedTxnMetadata(metadata)
    config = replace(kw["config"], offset_reservation_step=10)
    topic = make_topic("a", tmp_path, **{**kw, "metadata": gated, "config": config})
    async with topic:
        gated.gate = asyncio.Event()  # the metadata store stalls: extensions and commits hang
        acked = [asyncio.ensure_future(topic.append(payload(o))) for o in range(10)]
        waiting = asyncio.ensure_future(topic.append(b"needs an extension"))
        await asyncio.sleep(0.01)
        assert not waiting.done() and not any(a.done() for a in acked)
        seal = asyncio.ensure_future(topic.seal())
        await asyncio.sleep(0.01)
        gated.gate.set()
        sealed = await asyncio.wait_for(seal, 5)
        assert [await a for a in acked] == list(range(10))
        with pytest.raises(WalClosedError, match="sealing"):
            await waiting
    assert sealed.last_committed_offset == 9
    catalog = await load_catalog(metadata, topic.topic)
    assert catalog.end == 9


async def test_a_deposed_owner_cannot_move_the_new_owners_cursors_back(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    a = make_topic("a", tmp_path, **kw)
    await a.open()
    await append_range(a, 0, 10)
    sub = await a.subscribe("s", initial=InitialPosition.EARLIEST)
    await sub.ack(2)
    await a.flush_cursors()
    async with make_topic("b", tmp_path, **kw) as b:  # b claims the topic (split brain)
        moved = await b.subscribe("s")
        await moved.ack(8)
        await b.flush_cursors()
        await a.ack("s", 5)  # a deposed owner's late ack…
        with pytest.raises(TopicFencedError):
            await a.flush_cursors()  # …is never written
        cursor = await metadata.get(keys.subscription_cursor(TOPIC, "s"))
        assert cursor is not None and cursor.value["last_acked_offset"] == 8
    with pytest.raises(TopicFencedError):
        await a.seal()


async def test_acks_above_the_cursor_survive_a_failover_and_a_deposed_owner_cannot_add_any(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    """Failover: the next owner resumes where the periodic flush left the cursor and the
    acks above it; the deposed owner's late acks are never written."""
    a = make_topic("a", tmp_path, **kw)
    await a.open()
    await append_range(a, 0, 10)
    await a.subscribe("s", initial=InitialPosition.EARLIEST)
    await a.ack("s", 0)
    for offset in (3, 4, 5, 7):  # 1, 2 and 6 are still out
        await a.ack_above("s", offset)
    await a.flush_cursors()
    async with make_topic("b", tmp_path, **kw) as b:  # a stalled; b took the topic over
        moved = await b.subscribe("s")
        assert (moved.start_offset, moved.acked_above) == (1, ((3, 5), (7, 7)))
        await a.ack_above("s", 6)  # the deposed owner's late ack…
        with pytest.raises(TopicFencedError):
            await a.flush_cursors()  # …is never written
        await b.ack("s", 2)
        await b.flush_cursors()
    cursor = await metadata.get(keys.subscription_cursor(TOPIC, "s"))
    assert cursor is not None
    # 1 and 2 acked: the cursor moves through 3..5 too.
    assert (cursor.value["last_acked_offset"], cursor.value["acked_above"]) == (5, [[7, 7]])
    await crash_with_disk(a)


async def test_a_crash_between_the_object_write_and_its_commit_acknowledges_nothing(
    tmp_path: Path, kw: dict[str, Any]
) -> None:
    flaky = FlakyTxnMetadata(kw["metadata"])
    config = replace(kw["config"], ack_timeout_seconds=0.2)
    async with make_topic("a", tmp_path, **{**kw, "metadata": flaky, "config": config}) as a:
        await append_range(a, 0, 5)
        flaky.fail_before = 10**6  # the commit never happens: the broker dies before it
        with pytest.raises(DurabilityTimeoutError):
            await a.append(payload(5))
        reservation = a.reserved_through
        await crash_with_disk(a)
    written = sorted((tmp_path / "objects").rglob("*.bobj"))
    assert len(written) == 6  # the sixth object was written, never committed: an orphan
    async with make_topic("b", tmp_path, **kw) as b:
        assert b.opened.gap == (5, reservation)  # offset 5 was never acknowledged
        assert await read_all(b) == list(range(5))  # the orphan is never read


class KeyHandoff:
    """A `Handoff` that puts `key` if it is still at `revision` (0: absent)."""

    def __init__(self, key: str, revision: int) -> None:
        self.key, self.revision = key, revision
        self.calls = 0

    async def writes(self) -> tuple[list[Compare], list[TxnOp]]:
        return [Compare.mod_revision_equals(self.key, self.revision)], [Put(self.key, "ready")]

    def written(self) -> None:
        self.calls += 1


async def test_a_seal_writes_its_handoff_in_the_same_transaction_only_while_it_holds(
    tmp_path: Path, kw: dict[str, Any], metadata: MemoryStore
) -> None:
    marker = "/cluster/unassigned/default/reliable_topic"
    await metadata.put(marker, "waiting")
    kv = await metadata.get(marker)
    assert kv is not None
    async with make_topic("a", tmp_path, **kw) as a:
        await append_range(a, 0, 3)
        handoff = KeyHandoff(marker, kv.mod_revision)
        await a.seal(handoff)
    state, ready = await metadata.get(keys.storage_state(TOPIC)), await metadata.get(marker)
    assert state is not None and ready is not None and ready.value == "ready"
    assert state.mod_revision == ready.mod_revision and handoff.calls == 1  # one write
    # A condition that no longer holds: the state is sealed alone, the handoff left.
    async with make_topic("b", tmp_path, **kw) as b:
        await append_range(b, 3, 5)
        stale = KeyHandoff(marker, kv.mod_revision)
        sealed = await b.seal(stale)
    assert sealed.last_committed_offset == 4 and stale.calls == 0
    assert (await state_of(metadata)).sealed
    after = await metadata.get(marker)
    assert after is not None and after.mod_revision == ready.mod_revision
    # A deposed owner writes neither.
    c = make_topic("c", tmp_path, **kw)
    await c.open()
    async with make_topic("d", tmp_path, **kw):
        fenced = KeyHandoff(marker, after.mod_revision)
        with pytest.raises(TopicFencedError):
            await c.seal(fenced)
    assert fenced.calls == 0
    final = await metadata.get(marker)
    assert final is not None and final.mod_revision == after.mod_revision
