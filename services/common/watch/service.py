"""The streams of one process for a change feed, and what wakes them: the part that
WatchConversation (services/transcript/watch/service.py) and WatchMemories
(services/memory/watch/service.py) share. Each service's `Feed` is a WatchFeed that says
what a stream follows, how it is opened and read (its store and its stream's loop), and
its metrics, names and messages.

What wakes a stream, whatever it follows (a conversation, a namespace's memories), each
known here by the store's key (a number: what a NOTIFY carries):

- a write through this process: the store reports each committed write to something
  watched (`changed`), at once;
- a write through another replica: that process announces the key with PostgreSQL's
  NOTIFY (services/common/postgres/notify.py), and this process's one listening
  connection wakes the key's streams;
- the pulse: every `poll_s` the store reads the heads of everything watched here (one
  statement for up to PULSE_CHUNK keys) and keeps it marked as watched (so that its
  writes announce), and the streams that are behind are woken. A lost notification
  delays a stream by at most that long; when the listening connection is back, the
  pulse runs at once.

The bounds: at most `max_watchers` streams in the process and
`max_watchers_per_namespace` of one namespace (RESOURCE_EXHAUSTED / WATCHER_LIMIT
beyond), and the bytes of the pages they hold counted against one budget per process
and per namespace (`max_buffered_bytes*`, services/common/byte_budget.py).

Knows nothing of gRPC or SQL, nor of what a stream yields.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, Protocol, TypeVar

from prometheus_client import Counter, Gauge

from services.common import metrics as common_metrics
from services.common.background import cancel_and_wait
from services.common.byte_budget import ByteBudget
from services.common.errors import DomainError
from services.common.postgres.notify import ChangeBus
from services.common.watch.stream import Stream

log = logging.getLogger(__name__)

# The pulse reads this many keys a statement.
PULSE_CHUNK = 1000

E = TypeVar("E")


class Head(Protocol):
    """What the feed's store reads of something watched (at `read_time`)."""

    @property
    def read_time(self) -> datetime:
        """When it was read (the database's clock)."""

    @property
    def fingerprint(self) -> Hashable:
        """What a stream that is up to date with this head has seen."""


HeadT = TypeVar("HeadT", bound=Head)
HeadT_co = TypeVar("HeadT_co", bound=Head, covariant=True)


class PulseStore(Protocol[HeadT_co]):
    """The one read the feed itself makes (the rest are its streams')."""

    async def pulse(
        self, keys: Sequence[int], ttl_s: float, renew_before_s: float
    ) -> Mapping[int, HeadT_co]:
        """The heads of `keys` (those that still exist), renewing their marks (those
        with less than `renew_before_s` left, to `ttl_s`; skipping rows a writer holds)."""


class FeedLimits(Protocol):
    """The limits the feed applies (each service's WatchLimits)."""

    @property
    def max_watchers(self) -> int: ...
    @property
    def max_watchers_per_namespace(self) -> int: ...
    @property
    def retry_after_s(self) -> float: ...
    @property
    def poll_s(self) -> float: ...
    @property
    def max_buffered_bytes(self) -> int: ...
    @property
    def max_buffered_bytes_per_namespace(self) -> int: ...


@dataclass(frozen=True, slots=True)
class FeedMetrics:
    """A feed's metrics (each service's own names: services/<service>/metrics.py)."""

    watchers: Gauge
    announce_failures: Counter
    buffered_bytes: Gauge
    budget_waits: Counter
    budget_waiting: Gauge

    def count_waiting(self, delta: int) -> None:
        """Streams that begin (+1) or end (-1) a wait for room in the byte budget."""
        self.budget_waiting.inc(delta)
        if delta > 0:
            self.budget_waits.inc()


@dataclass(eq=False, slots=True)
class _Watched(Generic[HeadT]):
    """A key with streams in this process."""

    streams: set[Stream] = field(default_factory=set)
    pulse: HeadT | None = None  # what the last pulse read


class WatchFeed(Generic[HeadT]):
    """The streams of one process, and what wakes them.

    `name` names the feed in the log and its tasks ("transcript feed"); `watcher_limit`
    makes the refusal beyond a limit (scope "process" or "namespace", the limit, the
    retry delay)."""

    def __init__(
        self,
        store: PulseStore[HeadT],
        bus: ChangeBus,
        limits: FeedLimits,
        *,
        name: str,
        metrics: FeedMetrics,
        watcher_limit: Callable[[str, int, float], DomainError],
    ) -> None:
        self.store = store
        self.bus = bus
        self.limits = limits
        self.name = name
        self.metrics = metrics
        self._watcher_limit = watcher_limit
        # A mark outlives a few missed pulses; renewed when less than this is left.
        self.mark_ttl_s = 60.0 + 3 * limits.poll_s
        self.renew_before_s = 30.0 + 2 * limits.poll_s
        self._watched: dict[int, _Watched[HeadT]] = {}  # by key
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
        # Told of every change this process hears of, by key (TranscriptService's turn
        # lease waiters: services/transcript/leases/service.py).
        self.on_change: Callable[[int], None] | None = None
        self.budget = ByteBudget(
            limits.max_buffered_bytes,
            limits.max_buffered_bytes_per_namespace,
            on_change=metrics.buffered_bytes.inc,
            on_waiting=metrics.count_waiting,
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
        task = self.name.replace(" ", "-")
        self._tasks = [
            asyncio.create_task(self._listen(), name=f"{task}-listen"),
            asyncio.create_task(self._announcer(), name=f"{task}-announce"),
            asyncio.create_task(self._pulser(), name=f"{task}-pulse"),
        ]
        try:
            await asyncio.wait_for(self._listening.wait(), wait_s)
        except TimeoutError:
            # Not fatal: streams still see every write, at the pulse's pace, until it listens.
            log.warning("%s: not listening yet; notifications may lag", self.name)

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
        """A write to what `key` names committed in this process (the store's ChangeSink):
        wake its streams here, and announce it to the other processes."""
        self._wake(key)
        self._announce.add(key)
        self._announce_wakeup.set()

    def _wake(self, key: int) -> None:
        if self.on_change is not None:
            self.on_change(key)
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
                log.error("%s: listener failed", self.name, exc_info=error)
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
                # The other processes see these writes at their next pulse.
                self.metrics.announce_failures.inc(len(keys))
                log.warning(
                    "%s: announcing changes failed",
                    self.name,
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
                log.warning(
                    "%s: pulse failed", self.name, extra={"error_type": type(error).__name__}
                )

    async def pulse(self) -> None:
        """Read everything watched here, renew their marks, and wake the streams that are
        not up to date with what was read (or whose key is gone)."""
        keys = sorted(self._watched)
        for start in range(0, len(keys), PULSE_CHUNK):
            chunk = keys[start : start + PULSE_CHUNK]
            found = await self.store.pulse(chunk, self.mark_ttl_s, self.renew_before_s)
            for key in chunk:
                watched = self._watched.get(key)
                if watched is None:
                    continue
                head = found.get(key)
                watched.pulse = head
                for stream in watched.streams:
                    if head is None or stream.seen != head.fingerprint:
                        stream.woken.set()

    # -- streams -------------------------------------------------------------------------

    def _admit(self, stream: Stream) -> None:
        limits = self.limits
        if self._open >= limits.max_watchers:
            common_metrics.REQUESTS_SHED.labels("watchers", "WATCHER_LIMIT").inc()
            raise self._watcher_limit("process", limits.max_watchers, limits.retry_after_s)
        if self._namespaces.get(stream.namespace, 0) >= limits.max_watchers_per_namespace:
            common_metrics.REQUESTS_SHED.labels("watchers", "WATCHER_LIMIT").inc()
            raise self._watcher_limit(
                "namespace", limits.max_watchers_per_namespace, limits.retry_after_s
            )
        self._open += 1
        self._namespaces[stream.namespace] = self._namespaces.get(stream.namespace, 0) + 1
        self._gone.clear()
        self.metrics.watchers.inc()

    def attach(self, stream: Stream, key: int) -> None:
        """Wake `stream` from now on for the changes of `key` (what it opened follows).
        Called with no await between the read of the mark and this: a write committed
        after the stream's first read wakes it."""
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
        self.metrics.watchers.dec()
        if self._open == 0:
            self._gone.set()

    async def serve(
        self,
        namespace: str,
        begin: Callable[[Callable[[], Stream]], Awaitable[AsyncGenerator[E]]],
        until_done: Callable[[Callable[[], None]], None] | None = None,
    ) -> AsyncGenerator[E]:
        """One stream of `namespace`. `begin(admit)` checks the request, then calls
        `admit()` for its stream (RESOURCE_EXHAUSTED / WATCHER_LIMIT beyond the process's
        limits: a request refused by its checks takes no slot), opens what it follows,
        `attach`es the stream, and gives its events, passed on here until they end.

        `until_done(release)`, when given, is handed what the stream holds (its watcher
        slot and its bytes) once it ends, to give back when the call has ended: the
        transport may still hold the event it was writing when the stream was cut (a
        reader that stopped reading), and releases it only with the call."""
        admitted: list[Stream] = []  # the stream, once admit() took its slot

        def admit() -> Stream:
            stream = Stream(namespace, self.budget)
            self._admit(stream)
            admitted.append(stream)
            return stream

        try:
            events = await begin(admit)
            try:
                while True:
                    # Passed on without a name here: an event held by this frame while
                    # the stream waits would keep what it carries alive past its write.
                    try:
                        yield await anext(events)
                    except StopAsyncIteration:
                        break
            finally:
                await events.aclose()
        finally:
            for stream in admitted:
                if until_done is None:
                    self._leave(stream)
                else:
                    # The rest of the page is garbage now; the event being written is not.
                    stream.hold(stream.sending)
                    until_done(functools.partial(self._leave, stream))

    def fresh(self, stream: Stream, read_time: datetime) -> datetime:
        """The latest time the server found what the stream follows where it stands: its
        own read, or a later pulse that read the same."""
        watched = self._watched.get(stream.key)
        pulse = watched.pulse if watched is not None else None
        if pulse is not None and pulse.fingerprint == stream.seen and pulse.read_time > read_time:
            return pulse.read_time
        return read_time
