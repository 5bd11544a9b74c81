"""The slot queue (services/common/shedding.py) in front of a slow resource: a full queue
refuses at once, a wait ends at its deadline, namespaces are served in turns."""

from __future__ import annotations

import asyncio

import pytest

from services.common.errors import DomainError
from services.common.shedding import SlotQueue
from tests.support.metrics import shed
from tests.support.waiting import holds, wait_for

# Admission keeps each call's slot in a context variable: none left behind (conftest.py).
pytestmark = pytest.mark.usefixtures("own_context")


async def test_a_full_slot_queue_refuses_at_once_with_a_retry_delay() -> None:
    queue = SlotQueue("model", max_concurrent=1, max_queued=1)
    before = shed("model", "OVERLOADED")
    held, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with queue.slot(10):
            held.set()
            await release.wait()

    first = asyncio.ensure_future(hold())
    await held.wait()
    waiting = asyncio.ensure_future(hold())
    await wait_for(holds(lambda: queue.waiting == 1))
    with pytest.raises(DomainError) as refused:
        async with queue.slot(10):
            pass
    assert refused.value.code.value == "RESOURCE_EXHAUSTED"
    assert refused.value.reason == "OVERLOADED"
    assert refused.value.metadata == {"resource": "model"}
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s > 0
    assert shed("model", "OVERLOADED") == before + 1
    release.set()
    await asyncio.gather(first, waiting)  # the one that waited was served
    assert queue.held == 0 and queue.waiting == 0


async def test_a_wait_ends_at_the_deadline_and_a_cancelled_waiter_gives_up_its_place() -> None:
    queue = SlotQueue("model", max_concurrent=1, max_queued=2)
    release = asyncio.Event()
    held = asyncio.Event()

    async def hold() -> None:
        async with queue.slot():
            held.set()
            await release.wait()

    holder = asyncio.ensure_future(hold())
    await held.wait()
    with pytest.raises(DomainError) as late:
        async with queue.slot(0.05):
            pass
    assert late.value.reason == "DEADLINE_EXCEEDED"
    assert queue.waiting == 0, "a waiter past its deadline leaves the queue"

    async def enter() -> str:
        async with queue.slot(10):
            return "served"

    cancelled = asyncio.ensure_future(enter())
    served = asyncio.ensure_future(enter())
    await wait_for(holds(lambda: queue.waiting == 2))
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert queue.waiting == 1
    release.set()
    await holder
    assert await served == "served"
    assert queue.held == 0


async def test_the_slot_queue_serves_namespaces_in_turns_not_first_come() -> None:
    queue = SlotQueue("model", max_concurrent=1, max_queued=16)
    release = asyncio.Event()
    served: list[str] = []

    async def call(lane: str) -> None:
        async with queue.slot(10, lane):
            served.append(lane)
            await release.wait()

    holder = asyncio.ensure_future(call("busy"))
    await wait_for(holds(lambda: queue.held == 1))
    flood = [asyncio.ensure_future(call("busy")) for _ in range(6)]
    await wait_for(holds(lambda: queue.waiting == 6))
    quiet = asyncio.ensure_future(call("quiet"))  # one call, after a burst of another
    await wait_for(holds(lambda: queue.waiting == 7))
    release.set()
    await asyncio.gather(holder, *flood, quiet)
    # The quiet namespace waited for the call that held the slot, not for the burst.
    assert served[:2] == ["busy", "quiet"]
    assert queue.held == queue.waiting == 0
