"""One stream of a change feed, whatever it follows: what it holds of the feed's byte
budget, when it was woken, when it last spoke.

Each stream's loop (`follow`) stays in its service (services/transcript/watch/stream.py,
services/memory/watch/stream.py): they share their shape, not their reads. A
conversation's stream reads pages of entries (across a fork's shared prefix), the
retractions of entries it delivered, the turns that start and finish, and ends with the
erasure of its incarnation; a namespace's stream reads one numbered change after
another and never ends by itself.

A stream holds at most one page of what it read, and only while the transport has not
taken it. The bytes of the page are counted against the feed's budget
(services/common/byte_budget.py): the stream reserves a page's worth before it reads
(waiting, without a database connection, while its namespace or the process has no
room), keeps what the page holds, and gives each event's share back as the transport
takes it. A caught-up stream holds none.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from prometheus_client import Histogram

from services.common.byte_budget import ByteBudget, Charge

StoreT_co = TypeVar("StoreT_co", covariant=True)
LimitsT_co = TypeVar("LimitsT_co", covariant=True)


@dataclass(eq=False, slots=True)
class Stream:
    """One open stream of a feed."""

    namespace: str
    budget: ByteBudget
    key: int = 0  # the store's key of what it follows (what a NOTIFY says)
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    # What the stream is up to date with after its last read (the fingerprint of the
    # head it read, service.py's `Head`); None before its first.
    seen: Hashable | None = None
    # The bytes it holds of the budget: the page read and not yet taken by the transport.
    charge: Charge | None = None
    # The share of them in the event being written (the transport's, until it took it).
    sending: int = 0
    # When it last yielded an event (time.monotonic()): a heartbeat is due a quiet
    # interval later.
    quiet_since: float = field(default_factory=time.monotonic)

    async def reserve(self, size: int) -> None:
        """Reserve `size` bytes (a page's worth), waiting for room (holding nothing else)."""
        self.release()
        self.charge = await self.budget.acquire(self.namespace, size)

    async def ready_to_read(self, size: int) -> None:
        """Before the read a wake-up asks for: reserve `size` bytes (a page's worth; a wait
        for room holds no database connection), then clear the wake-up flag: after the
        wait and before the read, so that a write during either wakes the stream again."""
        await self.reserve(size)
        self.woken.clear()

    def hold(self, size: int) -> None:
        """Keep `size` bytes of what the stream reserved (what it read holds)."""
        if self.charge is not None:
            self.charge.resize(size)

    def release(self) -> None:
        """Give back every byte the stream holds."""
        charge, self.charge = self.charge, None
        if charge is not None:
            charge.release()

    def taken(self, size: int) -> None:
        """The transport took the event being written (`size` bytes of the page): its
        share of the page is given back."""
        self.sending = 0
        if self.charge is not None:
            self.hold(self.charge.size - size)

    def spoke(self) -> None:
        """The stream yielded an event: the next heartbeat is a quiet interval away."""
        self.quiet_since = time.monotonic()

    async def woken_within(self, interval: float) -> bool:
        """Wait until the stream is woken (True), or until it has been quiet for
        `interval` seconds (False: a heartbeat is due)."""
        while True:
            left = interval - (time.monotonic() - self.quiet_since)
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self.woken.wait()
                return True


class Hub(Protocol[StoreT_co, LimitsT_co]):
    """What a stream's loop asks of the feed that opened it (service.py's WatchFeed)."""

    @property
    def store(self) -> StoreT_co:
        """The feed's reads."""

    @property
    def limits(self) -> LimitsT_co:
        """The feed's limits."""

    @property
    def closing(self) -> bool:
        """True once the server stops: streams end with SERVER_SHUTTING_DOWN."""

    def fresh(self, stream: Stream, read_time: datetime) -> datetime:
        """The latest time the server found what the stream follows where it stands."""


def observe_delivery(histogram: Histogram, recorded: datetime) -> None:
    """Record the time from a live change's commit (`recorded`, the database's clock) to
    its delivery (this host's clock)."""
    seconds = (datetime.now(UTC) - recorded).total_seconds()
    histogram.observe(max(0.0, seconds))
