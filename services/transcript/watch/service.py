"""WatchConversation: the change feed of a conversation (TranscriptService).

A stream replays the entries after the client's `after_sequence` in bounded
pages, then follows the conversation. Each time it wakes it reads, by sequence,
what committed after what it delivered: every entry goes out once, in order,
and only after its append committed (a rolled-back append wrote no row to read).
What wakes a stream:

- a write through this process: the store reports each committed write to a
  watched conversation (`Feed.changed`), at once;
- a write through another replica: that process announces the conversation's
  key (the key only, no content) with PostgreSQL's NOTIFY, and this process's
  one listening connection wakes the conversation's streams;
- the pulse: every RUNIFOLD_WATCH_POLL_S one statement reads the counters and
  running turns of every conversation watched here (and keeps them marked as
  watched, `conversations.watched_until`, so that their writes announce), and
  wakes the streams that are behind. A lost notification (a dropped listening
  connection, a replica killed between its commit and its NOTIFY) delays a
  stream by at most that long; when the listening connection is back, the pulse
  runs at once.

An idle stream costs no database connection and no query of its own: its
heartbeats come from what the last read or pulse saw. A stream holds at most one
page of entries, and only while the transport has not taken it (stream.py), so a
slow reader holds back only its own stream (the servicer ends one that takes nothing
for RUNIFOLD_WATCH_SEND_TIMEOUT_S). The bytes of the pages held are counted against a
budget per namespace and per process (RUNIFOLD_WATCH_MAX_BUFFERED_BYTES*): a
namespace whose readers stop reading fills its own share and no more: its next
streams wait, the others' do not.

Knows nothing of gRPC or SQL: the store (`FeedStore`, store.py) reads, the bus
(`ChangeBus`, bus.py) carries the notifications between processes; the events and
the feed's errors are in model.py. What wakes streams, their registry and bounds are
the WatchFeed every change feed shares (services/common/watch/service.py); what is
WatchConversation's own is here: what a stream follows and how it opens.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

from services.common import validation
from services.common.errors import invalid_argument
from services.common.validation import conversation_id
from services.common.watch.model import heartbeat_interval
from services.common.watch.service import FeedMetrics, WatchFeed
from services.common.watch.stream import Stream
from services.transcript import metrics as transcript_metrics
from services.transcript.config import WatchLimits
from services.transcript.conversations.model import conversation_not_found
from services.transcript.watch.bus import ChangeBus
from services.transcript.watch.model import (
    Erased,
    Snapshot,
    WatchEvent,
    shutting_down,
    watcher_limit,
)
from services.transcript.watch.store import FeedStore
from services.transcript.watch.stream import follow

METRICS = FeedMetrics(
    watchers=transcript_metrics.WATCHERS,
    announce_failures=transcript_metrics.WATCH_ANNOUNCE_FAILURES,
    buffered_bytes=transcript_metrics.WATCH_BUFFERED_BYTES,
    budget_waits=transcript_metrics.WATCH_BUDGET_WAITS,
    budget_waiting=transcript_metrics.WATCH_BUDGET_WAITING,
)


class Feed(WatchFeed[Snapshot]):
    """The WatchConversation streams of one process, and what wakes them."""

    store: FeedStore
    limits: WatchLimits

    def __init__(self, store: FeedStore, bus: ChangeBus, limits: WatchLimits) -> None:
        super().__init__(
            store,
            bus,
            limits,
            name="transcript feed",
            metrics=METRICS,
            watcher_limit=watcher_limit,
        )

    def watch(
        self,
        namespace: str,
        conversation_id_text: str,
        after_sequence: int,
        incarnation: int,
        heartbeat_s: float = 0.0,
        until_done: Callable[[Callable[[], None]], None] | None = None,
    ) -> AsyncGenerator[WatchEvent]:
        """Follow a conversation: the entries after `after_sequence` (replayed, then live),
        each once and in order; TurnStarted / TurnFinished beside them; a Heartbeat once
        caught up and after every quiet `heartbeat_s`; Erased, then the end, when the
        incarnation followed is erased.

        NOT_FOUND as GetConversation (another namespace's conversation included);
        INVALID_ARGUMENT / SEQUENCE_OUT_OF_RANGE past the transcript's end;
        RESOURCE_EXHAUSTED / WATCHER_LIMIT beyond the process's limits; UNAVAILABLE /
        SERVER_SHUTTING_DOWN when the server stops. With `incarnation`, a conversation
        made again under the id since answers Erased at once.

        `until_done(release)`, when given, is handed what the stream holds (its watcher
        slot and its bytes) once it ends, to give back when the call has ended: the
        transport may still hold the event it was writing when the stream was cut
        (a reader that stopped reading), and releases it only with the call.
        """

        async def begin(admit: Callable[[], Stream]) -> AsyncGenerator[WatchEvent]:
            validation.namespace(namespace)
            cid = conversation_id(conversation_id_text)
            if after_sequence < 0:
                raise invalid_argument(
                    "INVALID_SEQUENCE",
                    "after_sequence must not be negative",
                    field="after_sequence",
                )
            if incarnation < 0:
                raise invalid_argument(
                    "INVALID_INCARNATION", "incarnation must not be negative", field="incarnation"
                )
            interval = heartbeat_interval(heartbeat_s, self.limits.heartbeat_s)
            if self.closing:
                raise shutting_down()
            stream = admit()
            head = await self.store.open_watch(
                namespace, cid, after_sequence, incarnation, self.mark_ttl_s, self.renew_before_s
            )
            if head is None:
                raise conversation_not_found()
            # No await between the mark's read and this: a write committed after the
            # first read below wakes the stream.
            self.attach(stream, head.key)
            if incarnation and incarnation != head.incarnation:
                return _erased(incarnation)
            if after_sequence > head.last_sequence:
                raise invalid_argument(
                    "SEQUENCE_OUT_OF_RANGE",
                    "after_sequence is beyond the transcript",
                    field="after_sequence",
                    last_sequence=head.last_sequence,
                )
            return follow(self, stream, head, after_sequence, interval)

        return self.serve(namespace, begin, until_done)


async def _erased(incarnation: int) -> AsyncGenerator[WatchEvent]:
    """The stream of a conversation made again since the incarnation it asked for."""
    yield Erased(incarnation)
    transcript_metrics.WATCH_EVENTS.labels("erased").inc()
