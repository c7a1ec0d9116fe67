"""`aio.TaskOwner`: the one way tasks are owned — a crash surfaces, a contained failure
is logged and the others go on."""

from __future__ import annotations

import asyncio

import pytest

from ballast.aio import TaskOwner, both


async def _fail() -> None:
    await asyncio.sleep(0)
    raise ValueError("boom")


async def test_a_contained_failure_is_logged_and_the_owner_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owner = TaskOwner("host")
    await owner.open()
    forever = owner.spawn(asyncio.Event().wait(), "loop")
    failed = owner.spawn_contained(_fail(), "open/t")
    await failed
    assert not forever.done()  # the failure was the task's own
    assert "task host/open/t failed" in caplog.text and "boom" in caplog.text
    await owner.close()
    assert forever.cancelled() and not owner.running


async def test_a_crash_of_a_plain_task_surfaces_at_close() -> None:
    owner = TaskOwner("svc")
    await owner.open()
    crashed = owner.spawn(_fail(), "loop")
    with pytest.raises(asyncio.CancelledError):
        await asyncio.sleep(1)  # the group cancels the task that opened it
    assert crashed.done()
    with pytest.raises(ExceptionGroup) as caught:
        await owner.close()
    assert isinstance(caught.value.exceptions[0], ValueError)


async def test_spawning_outside_open_is_refused_without_leaking_the_coroutine() -> None:
    owner = TaskOwner("x")
    coro = _fail()
    with pytest.raises(RuntimeError, match="before open"):
        owner.spawn_contained(coro, "t")
    assert coro.cr_frame is None  # closed, so no "never awaited" warning


async def test_both_waits_for_the_other_before_raising_the_first_failure() -> None:
    finished = asyncio.Event()

    async def slow() -> int:
        await asyncio.sleep(0.05)
        finished.set()
        return 2

    assert await both(asyncio.sleep(0, 1), slow()) == (1, 2)
    finished.clear()
    with pytest.raises(ValueError, match="boom"):
        await both(_fail(), slow())
    assert finished.is_set()  # a plain gather would have raised with `slow` still running
