"""One background loop per job a service runs by itself (sweeps, indexers)."""

from __future__ import annotations

import asyncio
import contextlib


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
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
