"""`aio.TaskOwner`: the one way tasks are owned — a crash surfaces, a contained failure
is logged and the others go on."""

from __future__ import annotations

import asyncio

import pytest

from ballast.aio import TaskOwner


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
