"""One WatchMemories stream (opened and woken by the process's Feed, service.py): what
it holds, and its loop (`follow`).

Each time it wakes, a stream reads, by change sequence, what committed after what it
delivered: every change goes out once, in order, and only after its write committed
(a rolled-back write numbered nothing: its numbers are the next write's). It holds at
most one page of changes (`WatchLimits.page_bytes`), and only while the transport has
not taken it: the next page is read once the transport took the last event. The bytes
of the page are counted against the feed's budget (services/common/byte_budget.py):
the stream reserves a page's worth before it reads (waiting, without a database
connection, while its namespace or the process has no room), keeps what the page
holds, and gives each event's share back as the transport takes it. A caught-up
stream holds none.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from services.common.byte_budget import ByteBudget, Charge
from services.memory import metrics
from services.memory.config import WatchLimits
from services.memory.watch.model import Head, Heartbeat, WatchEvent, shutting_down
from services.memory.watch.store import FeedStore


@dataclass(eq=False, slots=True)
class Stream:
    """One open WatchMemories."""

    namespace: str
    budget: ByteBudget
    key: int = 0
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    # The last change sequence the stream is up to date with (after its last read).
    seen: int = -1
    # The bytes it holds of the budget: the page read and not yet taken by the transport.
    charge: Charge | None = None
    # The share of them in the event being written (the transport's, until it took it).
    sending: int = 0

    async def reserve(self, size: int) -> None:
        """Reserve `size` bytes (a page's worth), waiting for room (holding nothing else)."""
        self.release()
        self.charge = await self.budget.acquire(self.namespace, size)

    def hold(self, size: int) -> None:
        """Keep `size` bytes of what the stream reserved (what it read holds)."""
        if self.charge is not None:
            self.charge.resize(size)

    def release(self) -> None:
        """Give back every byte the stream holds."""
        charge, self.charge = self.charge, None
        if charge is not None:
            charge.release()


class Hub(Protocol):
    """What a stream's loop asks of the feed that opened it."""

    @property
    def store(self) -> FeedStore:
        """The feed's reads."""

    @property
    def limits(self) -> WatchLimits:
        """The feed's limits."""

    @property
    def closing(self) -> bool:
        """True once the server stops: streams end with SERVER_SHUTTING_DOWN."""

    def fresh(self, stream: Stream, read_time: datetime) -> datetime:
        """The latest time the server found the stream's namespace where it stands."""


async def follow(
    hub: Hub, stream: Stream, head: Head, after: int, interval: float
) -> AsyncGenerator[WatchEvent]:
    """A stream's events from `after` on: the namespace's changes (replayed, then live),
    each once and in order, and heartbeats. Reads only when woken (`stream.woken`), and
    holds at most a page of changes, counted against the budget."""
    limits = hub.limits
    delivered = after
    read_time = head.read_time
    caught_up = False
    quiet_since = time.monotonic()
    while True:
        if hub.closing:
            raise shutting_down()
        # Room for a page before the read (a wait here holds no connection). The
        # wake-up flag is cleared after the wait and before the read: a write during
        # either wakes the stream again.
        await stream.reserve(limits.page_charge)
        stream.woken.clear()
        page = await hub.store.read_changes(
            head.key, stream.namespace, delivered, limits.page_changes, limits.page_bytes
        )
        # The page's changes leave `page`: each is let go once the transport took it.
        changes, sizes = deque(page.changes), deque(page.sizes)
        last, read_time = page.head.last_change_sequence, page.head.read_time
        del page
        stream.hold(sum(sizes))
        while changes:
            size = sizes.popleft()
            recorded = changes[0].change_time
            number = changes[0].change_sequence
            kind = changes[0].kind.name.lower()
            # Yielded with no reference kept here: once the servicer has written the
            # event, its memory is garbage.
            stream.sending = size
            yield changes.popleft()
            # The transport took it: its share of the page is given back.
            stream.sending = 0
            if stream.charge is not None:
                stream.hold(stream.charge.size - size)
            metrics.WATCH_EVENTS.labels(kind).inc()
            if number > head.last_change_sequence:  # live, not replayed: how late
                _observe_delivery(recorded)
            delivered = number
            quiet_since = time.monotonic()
        if delivered < last:
            continue  # a page of them: the rest at once
        stream.release()  # caught up: a stream that waits holds no bytes
        stream.seen = delivered
        if not caught_up:  # the replay is done
            caught_up = True
            yield Heartbeat(delivered, read_time)
            metrics.WATCH_EVENTS.labels("heartbeat").inc()
            quiet_since = time.monotonic()
        while True:
            left = interval - (time.monotonic() - quiet_since)
            if left <= 0:
                yield Heartbeat(delivered, hub.fresh(stream, read_time))
                metrics.WATCH_EVENTS.labels("heartbeat").inc()
                quiet_since = time.monotonic()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await stream.woken.wait()
                break


def _observe_delivery(recorded: datetime) -> None:
    """Record time to delivery of a live change (the database's clock against this host's)."""
    seconds = (datetime.now(UTC) - recorded).total_seconds()
    metrics.WATCH_DELIVERY_SECONDS.observe(max(0.0, seconds))
