"""One background loop per job a service runs by itself (sweeps, indexers)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel the tasks, then wait until each has ended (None stands for no task)."""
    for task in tasks:
        if task is not None:
            task.cancel()
    for task in tasks:
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task


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
