"""The subscription dispatcher on its own: windows, types, cursors, redelivery."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from ballast.broker.dispatch import (
    ConsumerHandle,
    Delivery,
    SubscriptionDispatcher,
    drain,
    fnv1a64,
)
from ballast.wire.errors import RpcFailure


def d(offset: int, key: str = "k") -> Delivery:
    return Delivery(offset, f"m{offset}", key, 1)


def offsets(queue: asyncio.Queue[Delivery | None]) -> list[int]:
    return [x.offset for x in drain(queue)]


def reliable(sub_type: str = "shared", window: int = 10) -> SubscriptionDispatcher:
    return SubscriptionDispatcher("s", sub_type, window=window, reliable=True, buffer=100)


async def test_the_window_bounds_what_a_consumer_holds_unacked() -> None:
    sub = reliable("exclusive", window=2)
    c = sub.join("c", "exclusive", (), 0.0)
    q = c.attach()
    for i in range(5):
        sub.offer(d(i))
    assert offsets(q) == [0, 1]
    sub.ack(0)
    assert offsets(q) == [2]
    assert sub.waiting == 2


async def test_out_of_order_acks_move_the_cursor_to_the_lowest_unacked() -> None:
    sub = reliable()
    c = sub.join("c", "shared", (), 0.0)
    c.attach()
    for i in range(5):
        sub.offer(d(i))
    for offset in (4, 2, 1):
        sub.ack(offset)
    assert sub.cursor == -1  # 0 still unacked
    sub.ack(0)
    assert sub.cursor == 2
    sub.ack(3)
    assert sub.cursor == 4
    sub.ack(3)  # duplicate: fine
    assert sub.cursor == 4


async def test_an_ack_before_the_message_is_read_skips_it() -> None:
    # This owner began at offset 3: a previous owner wrote (and may have delivered) 0..2.
    sub = SubscriptionDispatcher(
        "s", "shared", window=10, reliable=True, buffer=100, previous_owner_below=3
    )
    c = sub.join("c", "shared", (), 0.0)
    q = c.attach()
    assert sub.ack(1)  # acked at the old owner's time, arriving here before we read it
    for i in range(3):
        sub.offer(d(i))
    assert offsets(q) == [0, 2]
    sub.ack(0)
    sub.ack(2)
    assert sub.cursor == 2


async def test_an_ack_for_an_offset_this_owner_wrote_and_never_delivered_is_refused() -> None:
    sub = SubscriptionDispatcher(
        "s", "exclusive", window=10, reliable=True, buffer=100, previous_owner_below=3
    )
    c = sub.join("c", "exclusive", (), 0.0)
    q = c.attach()
    # Within the window for the previous owner's acks, but 3 and 4 are this owner's (or
    # not written yet): nobody can have received them.
    assert not sub.ack(3)
    assert not sub.ack(4)
    for i in range(6):
        sub.offer(d(i))
    assert offsets(q) == [0, 1, 2, 3, 4, 5]  # nothing skipped


async def test_shared_round_robin_and_failover_order() -> None:
    shared = reliable()
    a, b = shared.join("a", "shared", (), 0.0), shared.join("b", "shared", (), 0.0)
    qa, qb = a.attach(), b.attach()
    for i in range(4):
        shared.offer(d(i))
    assert (offsets(qa), offsets(qb)) == ([0, 2], [1, 3])
    failover = reliable("failover")
    first, second = failover.join("a", "failover", (), 0.0), failover.join("b", "failover", (), 0.0)
    q1, q2 = first.attach(), second.attach()
    failover.offer(d(0))
    assert (offsets(q1), offsets(q2)) == ([0], [])
    first.detach(q1)  # the active one goes: the next takes over, with what was unacked
    failover.offer(d(1))
    assert offsets(q2) == [0, 1]


async def test_key_shared_routes_by_key_and_filter() -> None:
    sub = reliable("key_shared")
    eu = sub.join("eu", "key_shared", ("eu-*",), 0.0)
    us = sub.join("us", "key_shared", ("us-*",), 0.0)
    qe, qu = eu.attach(), us.attach()
    for i, key in enumerate(["eu-1", "us-1", "eu-2", "us-9"]):
        sub.offer(d(i, key))
    assert (offsets(qe), offsets(qu)) == ([0, 2], [1, 3])
    assert fnv1a64(b"") == 0xCBF29CE484222325


async def test_type_mismatch_and_a_second_exclusive_consumer_are_refused() -> None:
    sub = reliable("exclusive")
    c = sub.join("c", "exclusive", (), 0.0)
    c.attach()
    with pytest.raises(RpcFailure) as err:
        sub.join("other", "exclusive", (), 0.0)
    assert err.value.code is grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(RpcFailure) as err:
        sub.join("x", "shared", (), 0.0)
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert sub.join("c", "exclusive", (), 1.0) is c  # the same name: a reconnect


async def test_after_a_takeover_sent_messages_get_a_grace_before_redelivery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ballast.broker.dispatch as dispatch

    monkeypatch.setattr(dispatch, "REDELIVERY_GRACE", 0.05)
    sub = reliable()
    c = sub.join("c", "shared", (), 0.0)
    first = c.attach()
    for i in range(3):
        sub.offer(d(i))
    first.get_nowait()  # 0 was sent on the first stream; 1 and 2 were still queued
    second = c.attach()
    assert offsets(second) == [1, 2]  # unsent: at once
    sub.ack(1)
    sub.ack(2)
    await asyncio.sleep(0.1)
    assert offsets(second) == [0]  # sent but never acked: after the grace


async def test_key_shared_a_key_without_a_consumer_holds_back_only_that_key() -> None:
    sub = reliable("key_shared")
    eu = sub.join("eu", "key_shared", ("eu-*",), 0.0)
    q = eu.attach()
    for i, key in enumerate(["asia-1", "eu-1", "asia-1", "eu-2"]):
        sub.offer(d(i, key))
    assert offsets(q) == [1, 3]  # asia waits for a consumer that accepts it
    asia = sub.join("asia", "key_shared", ("asia-*",), 0.0)
    qa = asia.attach()
    assert offsets(qa) == [0, 2]


async def test_acks_persisted_above_the_cursor_are_not_delivered_again() -> None:
    """A new owner (a move, a failover) starts from the cursor and the acks above it."""
    sub = SubscriptionDispatcher(
        "s", "shared", window=10, reliable=True, buffer=100,
        start_cursor=0, acked_above=((2, 4), (6, 6)),
    )  # fmt: skip
    q = sub.join("c", "shared", (), 0.0).attach()
    for i in range(1, 9):
        sub.offer(d(i))
    assert offsets(q) == [1, 5, 7, 8]
    assert sub.cursor == 0
    assert sub.ack(5) and sub.acked_above_cursor(5)
    assert sub.ack(1) and sub.cursor == 6  # 2..4 and 6 were acked before the move
    assert not sub.acked_above_cursor(5)
    assert sub.ack(2)  # a duplicate ack of what the previous owner had: fine


def key_shared(window: int = 10) -> SubscriptionDispatcher:
    return reliable("key_shared", window=window)


async def test_key_shared_a_joining_consumer_gets_its_keys_once_the_other_acked_them() -> None:
    sub = key_shared(window=50)
    a = sub.join("a", "key_shared", (), 0.0)
    qa = a.attach()
    keys = [f"k{i}" for i in range(20)]
    for i, key in enumerate(keys):
        sub.offer(d(i, key))
    assert offsets(qa) == list(range(20))
    b = sub.join("b", "key_shared", (), 0.0)
    qb = b.attach()  # joins while a holds one unacked message of every key
    for i, key in enumerate(keys, start=20):
        sub.offer(d(i, key))
    kept = offsets(qa)  # a's keys go on at a; b's keys wait for a's acks
    assert offsets(qb) == []
    assert 3 <= len(kept) <= 17  # rendezvous hashing: b takes part of the keys
    for i in range(20):
        sub.ack(i)
    moved = offsets(qb)
    assert sorted(kept + moved) == list(range(20, 40))
    # Placement is stable: the same keys go to the same consumers again.
    for i in range(20, 40):
        sub.ack(i)
    for i, key in enumerate(keys, start=40):
        sub.offer(d(i, key))
    assert [o - 20 for o in offsets(qa)] == kept and [o - 20 for o in offsets(qb)] == moved


async def test_key_shared_a_leavers_unacked_go_first_and_in_order() -> None:
    """What the leaving consumer held of a key reaches the next consumer before that
    key's newer messages, even while the next consumer's window is full."""
    sub = key_shared(window=2)
    a = sub.join("a", "key_shared", (), 0.0)
    qa = a.attach()
    for i in range(4):
        sub.offer(d(i, "k"))
    assert offsets(qa) == [0, 1]  # 2 and 3 wait for a's window
    b = sub.join("b", "key_shared", (), 0.0)
    qb = b.attach()
    assert offsets(qb) == []  # k stays with a: it holds 0 and 1
    a.detach(qa)
    sub.offer(d(4, "k"))
    got = offsets(qb)
    for _ in range(3):
        for offset in got:
            sub.ack(offset)
        got += offsets(qb)
    assert got == [0, 1, 2, 3, 4]


class OrderCheck:
    """Wraps a dispatcher's `_give`: whenever a message of a key is given to a consumer,
    every older message of that key must be acked or held by that same consumer."""

    def __init__(self, sub: SubscriptionDispatcher) -> None:
        self.key_of: dict[int, str] = {}
        self.acked: set[int] = set()
        self.violations: list[str] = []
        self._give = sub._give
        sub._give = self.give  # type: ignore[method-assign]

    def give(self, c: ConsumerHandle, x: Delivery) -> None:
        self.violations += [
            f"{x.offset} to {c.name} while {older} is elsewhere"
            for older, key in self.key_of.items()
            if key == x.key and older < x.offset
            and older not in self.acked and older not in c.unacked
        ]  # fmt: skip
        self._give(c, x)


async def test_key_shared_per_key_order_holds_under_random_joins_leaves_and_acks() -> None:
    rng = random.Random(4)
    for _ in range(40):
        sub = key_shared(window=rng.randint(1, 4))
        check = OrderCheck(sub)
        for _ in range(300):
            op = rng.random()
            names = sorted(sub.consumers)
            if op < 0.1 or not names:  # a new consumer, or a takeover of a stream
                sub.join(rng.choice("abcd"), "key_shared", (), 0.0).attach()
            elif op < 0.15:
                c = sub.consumers[rng.choice(names)]
                if c.queue is not None:
                    c.detach(c.queue)
            elif op < 0.18:
                sub.remove(sub.consumers[rng.choice(names)])
            elif op < 0.55:
                offset = len(check.key_of)
                check.key_of[offset] = f"k{rng.randint(0, 5)}"
                sub.offer(d(offset, check.key_of[offset]))
            else:
                c = sub.consumers[rng.choice(names)]
                if c.unacked:
                    offset = rng.choice(sorted(c.unacked))
                    check.acked.add(offset)
                    assert sub.ack(offset)
                    assert offset not in c.unacked
        assert check.violations == []


async def test_an_acked_copy_left_in_an_ended_stream_is_not_delivered_again() -> None:
    """The client acked what it read; copies still queued in the stream when it ended
    go back, but not those already acked (the cursor passed them)."""
    sub = reliable()
    c = sub.join("c", "shared", (), 0.0)
    q = c.attach()
    for i in range(3):
        sub.offer(d(i))
    sub.ack(0)
    sub.ack(1)  # acked while their copies still wait in the stream's queue
    c.detach(q)
    assert offsets(c.attach()) == [2]


async def test_messages_given_back_one_at_a_time_come_again_in_offset_order() -> None:
    """A departing owner's relay gives back (nacks) what the client dropped, one message
    per request, while no stream is attached; the client's new stream gets them in order,
    before anything fresh (a seen-in-CI reorder: 12, 14, 13)."""
    sub = reliable("exclusive")
    c = sub.join("c", "exclusive", (), 0.0)
    q = c.attach()
    for i in range(5):
        sub.offer(d(i))
    assert offsets(q) == [0, 1, 2, 3, 4]
    c.detach(q, keep_sent=True)  # the relay's stream ended; 0..4 stay the consumer's
    for offset in (1, 2, 3):
        sub.nack(offset, 0)
    sub.offer(d(5))
    assert offsets(c.attach()) == [1, 2, 3, 5]  # 0 and 4: still in the client's hands
    sub.nack(0, 0)
    sub.nack(4, 0)  # given back after the client re-attached: in order among themselves
    assert c.queue is not None and offsets(c.queue) == [0, 4]


async def test_nacks_in_any_order_are_redelivered_in_offset_order() -> None:
    sub = reliable("exclusive")
    c = sub.join("c", "exclusive", (), 0.0)
    q = c.attach()
    for i in range(10):
        sub.offer(d(i))
    assert offsets(q) == list(range(10))
    c.detach(q, keep_sent=True)
    for offset in (7, 2, 9, 1):
        sub.nack(offset, 0)
    assert offsets(c.attach()) == [1, 2, 7, 9]
