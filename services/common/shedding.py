"""The rules of every queue between an RPC and a slow resource (the embedding model,
a chat model): work for a caller who has left is dropped, and the queue is bounded.

- A caller who cancelled, or whose deadline passed, is not served: its place in
  the queue is given up, and work already queued for it is skipped before it runs
  (`caller_gone`), so that a flood of abandoned calls costs the resource nothing.
- A queue that is full refuses at once with RESOURCE_EXHAUSTED / `OVERLOADED`,
  naming the resource, with a `google.rpc.RetryInfo` delay estimated from how
  fast the queue drains: waiting longer than a caller's deadline helps nobody,
  and an unbounded queue turns a burst into memory and latency for everyone.

No transport import: the domain layers use this without knowing gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from typing import Any

from services.common import metrics
from services.common.deadlines import deadline_exceeded
from services.common.errors import Code, DomainError

# Bounds of a retry hint: soon enough to be useful, never a reason to give up.
MIN_RETRY_AFTER_S = 0.1
MAX_RETRY_AFTER_S = 30.0


def retry_delay(seconds: float) -> float:
    """A retry hint within sensible bounds, rounded to a tenth of a second."""
    return round(min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, seconds)), 1)


def overloaded(resource: str, retry_after_s: float) -> DomainError:
    """RESOURCE_EXHAUSTED / OVERLOADED: the queue in front of `resource` is full (counted)."""
    metrics.REQUESTS_SHED.labels(resource, "OVERLOADED").inc()
    return DomainError(
        Code.RESOURCE_EXHAUSTED,
        "OVERLOADED",
        f"the {resource} queue is full; retry after the delay in RetryInfo",
        metadata={"resource": resource},
        retry_after_s=retry_delay(retry_after_s),
    )


def caller_gone(future: asyncio.Future[Any], deadline: float | None, now: float) -> str | None:
    """Why queued work should be skipped: "cancelled", "deadline", or None (still wanted)."""
    if future.done():  # cancelled with its caller's task (a failed future is done too)
        return "cancelled"
    if deadline is not None and now >= deadline:
        return "deadline"
    return None


class Mean:
    """An exponentially weighted mean (of service times): the basis of retry hints."""

    __slots__ = ("value", "weight")

    def __init__(self, initial: float, weight: float = 0.2) -> None:
        self.value = initial
        self.weight = weight

    def add(self, sample: float) -> None:
        self.value += self.weight * (sample - self.value)


class SlotQueue:
    """At most `max_concurrent` callers at a time hold a slot, at most `max_queued`
    waiting; beyond that, OVERLOADED at once.

    Waiters queue in lanes, one per namespace (the `lane` a caller names), and the
    lanes take turns: a slot freed goes to the first waiter of the next lane, so one
    namespace's burst waits behind itself, not in front of everyone else (a FIFO would
    let it fill the queue ahead of another namespace's one call). Within a lane, first
    come first served.

    A wait ends with the caller: cancellation gives up its place, and `timeout`
    (what is left of the caller's deadline) bounds it (DEADLINE_EXCEEDED). A slot
    freed while waiters remain goes straight to one of them.
    """

    def __init__(self, resource: str, max_concurrent: int, max_queued: int) -> None:
        if max_concurrent < 1 or max_queued < 0:
            raise ValueError("max_concurrent must be at least 1 and max_queued at least 0")
        self.resource = resource
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.held = 0
        # Waiting callers by lane, in the order the lanes take their turns.
        self._lanes: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._waiting = 0
        self._hold = Mean(1.0)
        self._queued = metrics.WORK_QUEUED.labels(resource)

    @property
    def waiting(self) -> int:
        return self._waiting

    def _refuse(self) -> DomainError:
        # A waiter gets a slot when one of the holders finishes: about the mean
        # hold time for every max_concurrent callers ahead of it.
        ahead = self._waiting + 1
        return overloaded(self.resource, self._hold.value * ahead / self.max_concurrent)

    async def _acquire(self, timeout: float | None, lane: str) -> None:
        if self.held < self.max_concurrent and not self._waiting:
            self.held += 1
            return
        if self._waiting >= self.max_queued:
            raise self._refuse()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._lanes.get(lane)
        if queue is None:
            # A lane with nobody waiting goes first (as a sparse flow does in fair
            # queueing): its caller waits for the next slot freed, and no other.
            queue = self._lanes[lane] = deque()
            self._lanes.move_to_end(lane, last=False)
        queue.append(waiter)
        self._waiting += 1
        self._queued.inc()
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            self._give_up(waiter, lane, "deadline")
            raise deadline_exceeded(f"the {self.resource} stayed busy until the deadline") from None
        except BaseException:
            self._give_up(waiter, lane, "cancelled")
            raise
        finally:
            self._queued.dec()

    def _give_up(self, waiter: asyncio.Future[None], lane: str, cause: str) -> None:
        if waiter.done() and not waiter.cancelled():
            self._release()  # granted as the caller gave up: pass it on
            return
        queue = self._lanes.get(lane)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(waiter)
                self._waiting -= 1
            if not queue:
                del self._lanes[lane]
        metrics.WORK_ABANDONED.labels(self.resource, cause).inc()

    def _release(self) -> None:
        while self._lanes:
            lane, queue = next(iter(self._lanes.items()))
            waiter = queue.popleft()
            self._waiting -= 1
            if queue:
                self._lanes.move_to_end(lane)  # its next caller waits for the others' turns
            else:
                del self._lanes[lane]
            if not waiter.done():
                waiter.set_result(None)  # the slot changes hands: `held` stays
                return
        self.held -= 1

    @contextlib.asynccontextmanager
    async def slot(self, timeout: float | None = None, lane: str = "") -> AsyncIterator[None]:
        """Hold one of the slots for the block; `lane` is the caller's namespace
        (or "" for work of no namespace)."""
        started = await self.acquire(timeout, lane)
        try:
            yield
        finally:
            self.release(started)

    async def acquire(self, timeout: float | None = None, lane: str = "") -> float:
        """Take a slot (what `slot` does on entry); the time it was taken, for `release`."""
        await self._acquire(timeout, lane)
        return time.monotonic()

    def release(self, started: float) -> None:
        """Give back a slot taken at `started` by `acquire`."""
        self._hold.add(time.monotonic() - started)
        self._release()
