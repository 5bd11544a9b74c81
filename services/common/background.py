"""One background loop per job a service runs by itself (sweeps, indexers)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel the tasks, then wait until each has ended (None stands for no task).

    A task's own cancellation is what was asked for and is not raised; its other
    exception is (the first one). The caller's cancellation while it waits is never
    swallowed: asyncio.wait lets it through, where awaiting the task under a
    suppress(CancelledError) could not tell it from the task's.
    """
    pending = [task for task in tasks if task is not None]
    for task in pending:
        task.cancel()
    if not pending:
        return
    await asyncio.wait(pending)
    for task in pending:
        if not task.cancelled() and (error := task.exception()) is not None:
            raise error


async def finish_regardless(work: Coroutine[Any, Any, T], what: str) -> T:
    """Run `work` to its end even if the caller is cancelled meanwhile (a release, a
    place given up: what must happen once started), and return its result. When the
    caller has gone, a failure of the work is logged (its type only) instead of being
    left for asyncio's "Task exception was never retrieved"."""
    task = asyncio.ensure_future(work)

    def retrieved(done: asyncio.Future[T]) -> None:
        if not done.cancelled() and (error := done.exception()) is not None:
            log.warning("%s failed", what, extra={"error_type": type(error).__name__})

    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            task.add_done_callback(retrieved)
        raise


class Background:
    """A `run()` loop started and stopped as one background task."""

    task_name = "background"
    _task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Run in the background."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=self.task_name)

    async def stop(self) -> None:
        """Cancel the background loop (idempotent)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
