"""The subscription dispatcher on its own: windows, types, cursors, redelivery."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from ballast.server.dispatch import Delivery, SubscriptionDispatcher, drain, fnv1a64
from ballast.server.errors import RpcFailure


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
    sub = reliable()
    c = sub.join("c", "shared", (), 0.0)
    q = c.attach()
    sub.ack(1)  # acked at the old owner's time, arriving here before we read it
    for i in range(3):
        sub.offer(d(i))
    assert offsets(q) == [0, 2]
    sub.ack(0)
    sub.ack(2)
    assert sub.cursor == 2


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
    import ballast.server.dispatch as dispatch

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
