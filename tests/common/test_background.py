"""cancel_and_wait: the tasks' cancellation is asked for; the caller's is its own."""

from __future__ import annotations

import asyncio

import pytest

from services.common.background import cancel_and_wait


async def test_the_tasks_end_and_their_cancellation_is_not_raised() -> None:
    first = asyncio.create_task(asyncio.Event().wait())
    second = asyncio.create_task(asyncio.Event().wait())
    await cancel_and_wait(first, None, second)
    assert first.cancelled() and second.cancelled()


async def test_a_tasks_failure_is_raised() -> None:
    started = asyncio.Event()

    async def fails_when_stopped() -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("could not stop cleanly") from None

    task = asyncio.create_task(fails_when_stopped())
    await started.wait()
    with pytest.raises(RuntimeError, match="could not stop cleanly"):
        await cancel_and_wait(task)


async def test_the_callers_own_cancellation_goes_through() -> None:
    """A caller cancelled (its client gone) while a task is slow to stop is cancelled,
    not returned from as if the wait had ended."""
    stopping, release = asyncio.Event(), asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopping.set()
            await release.wait()
            raise

    task = asyncio.create_task(slow_to_stop())
    caller = asyncio.create_task(cancel_and_wait(task))
    await stopping.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
