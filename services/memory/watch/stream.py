"""One WatchMemories stream's loop (`follow`; the stream is opened and woken by the
process's Feed, service.py; what it holds is services/common/watch/stream.py's Stream).

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

from collections import deque
from collections.abc import AsyncGenerator

from services.common.watch.stream import Hub, Stream, observe_delivery
from services.memory import metrics
from services.memory.config import WatchLimits
from services.memory.watch.model import Head, Heartbeat, WatchEvent, shutting_down
from services.memory.watch.store import FeedStore


async def follow(
    hub: Hub[FeedStore, WatchLimits], stream: Stream, head: Head, after: int, interval: float
) -> AsyncGenerator[WatchEvent]:
    """A stream's events from `after` on: the namespace's changes (replayed, then live),
    each once and in order, and heartbeats. Reads only when woken (`stream.woken`), and
    holds at most a page of changes, counted against the budget."""
    limits = hub.limits
    delivered = after
    read_time = head.read_time
    caught_up = False
    stream.spoke()
    while True:
        if hub.closing:
            raise shutting_down()
        await stream.ready_to_read(limits.page_charge)
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
            stream.taken(size)  # the transport took it: its share goes back
            metrics.WATCH_EVENTS.labels(kind).inc()
            if number > head.last_change_sequence:  # live, not replayed: how late
                observe_delivery(metrics.WATCH_DELIVERY_SECONDS, recorded)
            delivered = number
            stream.spoke()
        if delivered < last:
            continue  # a page of them: the rest at once
        stream.release()  # caught up: a stream that waits holds no bytes
        stream.seen = delivered
        if not caught_up:  # the replay is done
            caught_up = True
            yield Heartbeat(delivered, read_time)
            metrics.WATCH_EVENTS.labels("heartbeat").inc()
            stream.spoke()
        while not await stream.woken_within(interval):
            yield Heartbeat(delivered, hub.fresh(stream, read_time))
            metrics.WATCH_EVENTS.labels("heartbeat").inc()
            stream.spoke()
