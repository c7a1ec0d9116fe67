"""`Turns`: one holder at a time; who finds the turn taken is woken for its own, in order."""

from __future__ import annotations

import asyncio

from ballast.storage.turns import Turns


def a_holding_b_and_c_queued() -> tuple[Turns, asyncio.Event, asyncio.Event, asyncio.Event]:
    turns = Turns()
    a, b, c = asyncio.Event(), asyncio.Event(), asyncio.Event()
    assert turns.take(a)
    assert not turns.take(b)
    assert not turns.take(c)
    return turns, a, b, c


async def test_one_holder_and_the_others_woken_in_arrival_order() -> None:
    turns = Turns()
    a, b, c = asyncio.Event(), asyncio.Event(), asyncio.Event()
    assert turns.take(a)
    assert turns.take(a)  # the holder asking again keeps it
    assert not turns.take(b)
    assert not turns.take(c)
    assert not turns.take(b)  # queued once
    assert turns.waiting == 2
    turns.give_back(a)
    assert b.is_set() and not c.is_set()
    assert turns.take(b)
    assert not turns.take(a)  # a turn later: behind c
    turns.give_back(b)
    assert c.is_set()
    assert turns.take(c)
    turns.give_back(c)
    assert a.is_set()


async def test_a_turn_declined_or_abandoned_goes_to_the_next() -> None:
    turns, a, b, c = a_holding_b_and_c_queued()
    turns.give_back(a)
    assert b.is_set()
    turns.forget(b)  # woken, it found nothing to do: c's turn
    assert c.is_set()
    assert turns.take(c)
    turns.forget(c)  # the holder stopped: free for anyone
    assert turns.take(a)
    turns.give_back(b)  # not the holder: nothing happens
    assert not turns.take(b)
    assert turns.waiting == 1


async def test_forgetting_an_offered_turn_while_another_holds_it_offers_nothing() -> None:
    turns, a, b, c = a_holding_b_and_c_queued()
    turns.give_back(a)  # offered to b, but a takes it again first
    assert turns.take(a)
    turns.forget(b)
    assert not c.is_set()  # a holds it: c is woken when a gives it back
    turns.give_back(a)
    assert c.is_set()
