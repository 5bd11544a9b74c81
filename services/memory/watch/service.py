"""WatchMemories: the change feed of a namespace's memories (MemoryService).

Every change of a memory (created, updated, superseded, deleted, expired, erased) is
numbered in its namespace by the write that makes it, in its transaction, without gaps
and in commit order (migrations/0006_change_feed.sql). A stream replays the changes
after the client's `after_change_sequence` in bounded pages, then follows the
namespace: each time it wakes it reads, by number, what committed after what it
delivered, so every change goes out once, in order, whichever replica wrote it. What
wakes a stream:

- a write through this process: the store reports each committed write to a watched
  namespace (`Feed.changed`), at once;
- a write through another replica: that process announces the namespace's feed key
  (a number only: no namespace, no content) with PostgreSQL's NOTIFY, and this
  process's one listening connection wakes the namespace's streams;
- the pulse: every RUNIFOLD_MEMORY_WATCH_POLL_S one statement reads the heads of
  every namespace watched here (and keeps them marked as watched,
  `memory.feeds.watched_until`, so that their writes announce), and wakes the streams
  that are behind. A lost notification (a dropped listening connection, a replica
  killed between its commit and its NOTIFY) delays a stream by at most that long;
  when the listening connection is back, the pulse runs at once.

An idle stream costs no database connection and no query of its own: its heartbeats
come from what the last read or pulse saw. A stream holds at most one page of changes,
and only while the transport has not taken it (stream.py), so a slow reader holds back
only its own stream (the servicer ends one that takes nothing for
RUNIFOLD_MEMORY_WATCH_SEND_TIMEOUT_S). The bytes of the pages held are counted against
a budget per namespace and per process (RUNIFOLD_MEMORY_WATCH_MAX_BUFFERED_BYTES*): a
namespace whose readers stop reading fills its own share and no more.

Knows nothing of gRPC or SQL: the store (`FeedStore`, store.py) reads, the bus
(`ChangeBus`, services/common/postgres/notify.py) carries the notifications between
processes; the events and the feed's errors are in model.py.
What wakes streams, their registry and bounds are the WatchFeed every change feed
shares (services/common/watch/service.py); what is WatchMemories' own is here: what a
stream follows and how it opens.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

from services.common import validation
from services.common.errors import invalid_argument
from services.common.postgres.notify import ChangeBus
from services.common.watch.model import heartbeat_interval
from services.common.watch.service import FeedMetrics, WatchFeed
from services.common.watch.stream import Stream
from services.memory import metrics
from services.memory.config import WatchLimits
from services.memory.watch.model import (
    Head,
    WatchEvent,
    change_sequence_out_of_range,
    shutting_down,
    watcher_limit,
)
from services.memory.watch.store import FeedStore
from services.memory.watch.stream import follow

# The channel of the notifications between MemoryService processes.
CHANNEL = "runifold_memory"

METRICS = FeedMetrics(
    watchers=metrics.WATCHERS,
    announce_failures=metrics.WATCH_ANNOUNCE_FAILURES,
    buffered_bytes=metrics.WATCH_BUFFERED_BYTES,
    budget_waits=metrics.WATCH_BUDGET_WAITS,
    budget_waiting=metrics.WATCH_BUDGET_WAITING,
)


class Feed(WatchFeed[Head]):
    """The WatchMemories streams of one process, and what wakes them."""

    store: FeedStore
    limits: WatchLimits

    def __init__(self, store: FeedStore, bus: ChangeBus, limits: WatchLimits) -> None:
        super().__init__(
            store,
            bus,
            limits,
            name="memory feed",
            metrics=METRICS,
            watcher_limit=watcher_limit,
        )

    def watch(
        self,
        namespace: str,
        after_change_sequence: int,
        heartbeat_s: float = 0.0,
        until_done: Callable[[Callable[[], None]], None] | None = None,
    ) -> AsyncGenerator[WatchEvent]:
        """Follow a namespace's memories: every change after `after_change_sequence`
        (replayed, then live), each once and in order; a Heartbeat once caught up and
        after every quiet `heartbeat_s`.

        INVALID_ARGUMENT / SEQUENCE_OUT_OF_RANGE past the namespace's last change;
        RESOURCE_EXHAUSTED / WATCHER_LIMIT beyond the process's limits; UNAVAILABLE /
        SERVER_SHUTTING_DOWN when the server stops.

        `until_done(release)`, when given, is handed what the stream holds (its watcher
        slot and its bytes) once it ends, to give back when the call has ended: the
        transport may still hold the event it was writing when the stream was cut (a
        reader that stopped reading), and releases it only with the call.
        """

        async def begin(admit: Callable[[], Stream]) -> AsyncGenerator[WatchEvent]:
            validation.namespace(namespace)
            if after_change_sequence < 0:
                raise invalid_argument(
                    "INVALID_SEQUENCE",
                    "after_change_sequence must not be negative",
                    field="after_change_sequence",
                )
            interval = heartbeat_interval(heartbeat_s, self.limits.heartbeat_s)
            if self.closing:
                raise shutting_down()
            if after_change_sequence > 0:
                # Refused before the namespace is marked watched: a refusal writes nothing.
                # (A head only grows: what passes here passes below.)
                last = await self.store.last_change_sequence(namespace)
                if after_change_sequence > last:
                    raise change_sequence_out_of_range(last)
            stream = admit()
            head = await self.store.open_watch(namespace, self.mark_ttl_s, self.renew_before_s)
            # No await between the mark's read and this: a write committed after the
            # first read below wakes the stream.
            self.attach(stream, head.key)
            if after_change_sequence > head.last_change_sequence:
                raise change_sequence_out_of_range(head.last_change_sequence)
            return follow(self, stream, head, after_change_sequence, interval)

        return self.serve(namespace, begin, until_done)
