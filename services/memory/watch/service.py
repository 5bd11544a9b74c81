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
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from datetime import datetime

from services.common import metrics as common_metrics
from services.common import validation
from services.common.background import cancel_and_wait
from services.common.byte_budget import ByteBudget
from services.common.errors import invalid_argument
from services.common.postgres.notify import ChangeBus
from services.memory import metrics
from services.memory.config import WatchLimits
from services.memory.watch.model import (
    Head,
    WatchEvent,
    change_sequence_out_of_range,
    heartbeat_interval,
    shutting_down,
    watcher_limit,
)
from services.memory.watch.store import FeedStore
from services.memory.watch.stream import Stream, follow

log = logging.getLogger(__name__)

# The channel of the notifications between MemoryService processes.
CHANNEL = "runifold_memory"
# The pulse reads this many namespaces a statement.
_PULSE_CHUNK = 1000


@dataclass(eq=False, slots=True)
class _Watched:
    """A namespace with streams in this process."""

    streams: set[Stream] = field(default_factory=set)
    pulse: Head | None = None  # what the last pulse read


class Feed:
    """The WatchMemories streams of one process, and what wakes them."""

    def __init__(self, store: FeedStore, bus: ChangeBus, limits: WatchLimits) -> None:
        self.store = store
        self.bus = bus
        self.limits = limits
        # A mark outlives a few missed pulses; renewed when less than this is left.
        self.mark_ttl_s = 60.0 + 3 * limits.poll_s
        self.renew_before_s = 30.0 + 2 * limits.poll_s
        self._watched: dict[int, _Watched] = {}  # by feed key
        self._namespaces: dict[str, int] = {}  # open streams by namespace
        self._open = 0
        self._closing = False
        self._announce: set[int] = set()
        self._announce_wakeup = asyncio.Event()
        self._pulse_now = asyncio.Event()
        self._listening = asyncio.Event()
        self._gone = asyncio.Event()
        self._gone.set()
        self._tasks: list[asyncio.Task[None]] = []
        self.budget = ByteBudget(
            limits.max_buffered_bytes,
            limits.max_buffered_bytes_per_namespace,
            on_change=metrics.WATCH_BUFFERED_BYTES.inc,
            on_waiting=_count_waiting,
        )

    @property
    def open_streams(self) -> int:
        """Streams open in this process."""
        return self._open

    @property
    def closing(self) -> bool:
        """True once the server stops (drain or stop): streams end, SERVER_SHUTTING_DOWN."""
        return self._closing

    async def start(self, wait_s: float = 5.0) -> None:
        """Start listening, announcing and the pulse; wait (at most `wait_s`) until the
        listening connection listens, so that the first streams miss nothing."""
        self._tasks = [
            asyncio.create_task(self._listen(), name="memory-feed-listen"),
            asyncio.create_task(self._announcer(), name="memory-feed-announce"),
            asyncio.create_task(self._pulser(), name="memory-feed-pulse"),
        ]
        try:
            await asyncio.wait_for(self._listening.wait(), wait_s)
        except TimeoutError:
            # Not fatal: streams still see every change, at the pulse's pace, until it listens.
            log.warning("memory feed: not listening yet; notifications may lag")

    async def drain(self, timeout_s: float) -> None:
        """End every stream with UNAVAILABLE / SERVER_SHUTTING_DOWN (their clients resume
        on another replica) and wait, at most `timeout_s`, until they have ended."""
        self._closing = True
        for watched in self._watched.values():
            for stream in watched.streams:
                stream.woken.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._gone.wait(), timeout_s)

    async def stop(self) -> None:
        """Stop the background tasks and close the bus (idempotent)."""
        self._closing = True
        tasks, self._tasks = self._tasks, []
        await cancel_and_wait(*tasks)
        await self.bus.close()

    # -- what wakes streams ------------------------------------------------------------

    def changed(self, key: int) -> None:
        """A write to the namespace of feed `key` committed in this process (the store's
        ChangeSink): wake its streams here, and announce it to the other processes."""
        self._wake(key)
        self._announce.add(key)
        self._announce_wakeup.set()

    def _wake(self, key: int) -> None:
        watched = self._watched.get(key)
        if watched is not None:
            for stream in watched.streams:
                stream.woken.set()

    def _connected(self) -> None:
        # Notifications may have been missed while not listening: look at everything now.
        self._listening.set()
        self._pulse_now.set()

    async def _listen(self) -> None:
        while True:
            try:
                await self.bus.listen(self._wake, self._connected)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the bus reconnects by itself; this is a bug
                log.error("memory feed: listener failed", exc_info=error)
            self._listening.clear()
            await asyncio.sleep(1.0)

    async def _announcer(self) -> None:
        while True:
            await self._announce_wakeup.wait()
            self._announce_wakeup.clear()
            keys, self._announce = sorted(self._announce), set()
            try:
                await self.bus.announce(keys)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                # The other processes see these changes at their next pulse.
                metrics.WATCH_ANNOUNCE_FAILURES.inc(len(keys))
                log.warning(
                    "memory feed: announcing changes failed",
                    extra={"error_type": type(error).__name__},
                )

    async def _pulser(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._pulse_now.wait(), self.limits.poll_s)
            self._pulse_now.clear()
            try:
                await self.pulse()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("memory feed: pulse failed", extra={"error_type": type(error).__name__})

    async def pulse(self) -> None:
        """Read every namespace watched here, renew their marks, and wake the streams that
        have not delivered what was read."""
        keys = sorted(self._watched)
        for start in range(0, len(keys), _PULSE_CHUNK):
            chunk = keys[start : start + _PULSE_CHUNK]
            found = await self.store.pulse(chunk, self.mark_ttl_s, self.renew_before_s)
            for key in chunk:
                watched = self._watched.get(key)
                if watched is None:
                    continue
                head = found.get(key)
                watched.pulse = head
                for stream in watched.streams:
                    if head is None or stream.seen != head.last_change_sequence:
                        stream.woken.set()

    # -- streams -------------------------------------------------------------------------

    def _admit(self, stream: Stream) -> None:
        limits = self.limits
        if self._open >= limits.max_watchers:
            common_metrics.REQUESTS_SHED.labels("watchers", "WATCHER_LIMIT").inc()
            raise watcher_limit("process", limits.max_watchers, limits.retry_after_s)
        if self._namespaces.get(stream.namespace, 0) >= limits.max_watchers_per_namespace:
            common_metrics.REQUESTS_SHED.labels("watchers", "WATCHER_LIMIT").inc()
            raise watcher_limit(
                "namespace", limits.max_watchers_per_namespace, limits.retry_after_s
            )
        self._open += 1
        self._namespaces[stream.namespace] = self._namespaces.get(stream.namespace, 0) + 1
        self._gone.clear()
        metrics.WATCHERS.inc()

    def _attach(self, stream: Stream, key: int) -> None:
        stream.key = key
        self._watched.setdefault(key, _Watched()).streams.add(stream)

    def _leave(self, stream: Stream) -> None:
        stream.release()
        watched = self._watched.get(stream.key)
        if watched is not None:
            watched.streams.discard(stream)
            if not watched.streams:
                del self._watched[stream.key]
        left = self._namespaces[stream.namespace] - 1
        if left:
            self._namespaces[stream.namespace] = left
        else:
            del self._namespaces[stream.namespace]  # bounded: namespaces with open streams
        self._open -= 1
        metrics.WATCHERS.dec()
        if self._open == 0:
            self._gone.set()

    async def watch(
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
        validation.namespace(namespace)
        if after_change_sequence < 0:
            raise invalid_argument(
                "INVALID_SEQUENCE",
                "after_change_sequence must not be negative",
                field="after_change_sequence",
            )
        interval = heartbeat_interval(heartbeat_s, self.limits.heartbeat_s)
        if self._closing:
            raise shutting_down()
        if after_change_sequence > 0:
            # Refused before the namespace is marked watched: a refusal writes nothing.
            # (A head only grows: what passes here passes below.)
            last = await self.store.last_change_sequence(namespace)
            if after_change_sequence > last:
                raise change_sequence_out_of_range(last)
        stream = Stream(namespace, self.budget)
        self._admit(stream)
        try:
            head = await self.store.open_watch(namespace, self.mark_ttl_s, self.renew_before_s)
            # No await between the mark's read and this: a write committed after the
            # first read below wakes the stream.
            self._attach(stream, head.key)
            if after_change_sequence > head.last_change_sequence:
                raise change_sequence_out_of_range(head.last_change_sequence)
            events = follow(self, stream, head, after_change_sequence, interval)
            try:
                while True:
                    # Passed on without a name here: an event held by this frame while
                    # the stream waits would keep its memory alive past its write.
                    try:
                        yield await anext(events)
                    except StopAsyncIteration:
                        break
            finally:
                await events.aclose()
        finally:
            if until_done is None:
                self._leave(stream)
            else:
                # The rest of the page is garbage now; the event being written is not.
                stream.hold(stream.sending)
                until_done(functools.partial(self._leave, stream))

    def fresh(self, stream: Stream, read_time: datetime) -> datetime:
        """The latest time the server found the stream's namespace where it stands: its
        own read, or a later pulse that read the same."""
        watched = self._watched.get(stream.key)
        pulse = watched.pulse if watched is not None else None
        if (
            pulse is not None
            and pulse.last_change_sequence == stream.seen
            and pulse.read_time > read_time
        ):
            return pulse.read_time
        return read_time


def _count_waiting(delta: int) -> None:
    metrics.WATCH_BUDGET_WAITING.inc(delta)
    if delta > 0:
        metrics.WATCH_BUDGET_WAITS.inc()
