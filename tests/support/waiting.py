"""Waiting for a condition: poll with a deadline, never a bare sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0, interval: float = 0.05
) -> None:
    """Poll an async predicate until true, failing after a deadline (never a bare sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        if await predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached within the deadline")
        await asyncio.sleep(interval)


def holds(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """A plain predicate as the async one `wait_for` polls."""

    async def check() -> bool:
        return predicate()

    return check
