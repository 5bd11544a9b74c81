"""One WatchConversation stream's loop (`follow`; the stream is opened and woken by the
process's Feed, service.py; what it holds is services/common/watch/stream.py's Stream).

Each time it wakes, a stream reads, by sequence, what committed after what it
delivered: every entry goes out once, in order, and only after its append committed
(a rolled-back append wrote no row to read). It holds at most one page of entries
(`WatchLimits.page_bytes`), and only while the transport has not taken it: the next
page is read once the transport took the last event. The bytes of the page are counted
against the feed's budget (services/common/byte_budget.py): the stream reserves a
page's worth before it reads (waiting, without a database connection, while its
namespace or the process has no room), keeps what the page holds, and gives each
event's share back as the transport takes it. A caught-up stream holds none.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import AsyncGenerator

from services.common.watch.stream import Hub, Stream, observe_delivery
from services.transcript import metrics as transcript_metrics
from services.transcript.config import WatchLimits
from services.transcript.watch.model import (
    Appended,
    AppendSlice,
    Erased,
    Heartbeat,
    Retracted,
    RunningTurn,
    Snapshot,
    TurnStarted,
    WatchEvent,
    finish_of,
    more_retractions,
    shutting_down,
)
from services.transcript.watch.store import FeedStore


async def follow(
    hub: Hub[FeedStore, WatchLimits], stream: Stream, head: Snapshot, after: int, interval: float
) -> AsyncGenerator[WatchEvent]:
    """A stream's events from `after` on: the entries (replayed, then live), what later
    writes retracted of those delivered, the turns that start and finish, heartbeats;
    Erased, then the end, when the incarnation followed is erased. Reads only when woken
    (`stream.woken`), and holds at most a page of entries, counted against the budget."""
    limits = hub.limits
    key, incarnation = head.key, head.incarnation
    delivered = after
    running: dict[str, RunningTurn] = {}  # the turns reported started, by turn id
    version, read_time = head.version, head.read_time
    # Retractions are reported after this version (-1: after the version of the
    # append that wrote entry `after`, which a resuming client has seen).
    since = -1
    caught_up = False
    stream.spoke()
    while True:
        if hub.closing:
            raise shutting_down()
        await stream.ready_to_read(limits.page_charge)
        state = await hub.store.read_state(
            key,
            [(turn.turn_id, turn.fencing_token) for turn in running.values()],
            delivered,
            limits.page_entries,
            limits.page_bytes,
            since,
        )
        if state is None or state.snapshot.incarnation != incarnation:
            stream.release()
            yield Erased(incarnation)
            transcript_metrics.WATCH_EVENTS.labels("erased").inc()
            return
        # The page's entries leave `state`: each is let go once the transport took it.
        slices = deque(state.entries)
        state = dataclasses.replace(state, entries=())
        stream.hold(sum(piece.size_bytes for piece in slices))
        snapshot = state.snapshot
        # First what later writes retracted of the entries delivered before this read,
        # then the entries after them (which carry their retraction, if any): once
        # a version's entries are delivered, so is everything before it.
        for retraction in state.retractions:
            sequences = [s for s in retraction.sequences if s <= delivered]
            yield Retracted(retraction.version, sequences, retraction.retract_time)
            transcript_metrics.WATCH_EVENTS.labels("retracted").inc()
            stream.spoke()
        if more_retractions(state.retractions, limits.page_entries):
            # A page of them (a stream resumed far back): the rest before any entry.
            since = state.retractions[-1].version
            continue
        since = snapshot.version
        while delivered < snapshot.last_sequence:
            if not slices:
                await stream.reserve(limits.page_charge)
                slices = deque(
                    await hub.store.read_entries(
                        key,
                        delivered,
                        snapshot.last_sequence,
                        limits.page_entries,
                        limits.page_bytes,
                    )
                )
                stream.hold(sum(piece.size_bytes for piece in slices))
            if not slices or slices[0].entries[0].sequence != delivered + 1:
                # Entries go only with their conversation, in the erasure's transaction.
                stream.release()
                yield Erased(incarnation)
                transcript_metrics.WATCH_EVENTS.labels("erased").inc()
                return
            while slices:
                piece = slices[0]
                last, size = piece.entries[-1].sequence, piece.size_bytes
                committed = piece.entries[-1].created_at
                del piece
                # Yielded with no reference kept here: once the servicer has written
                # the event, its entries are garbage.
                stream.sending = size
                yield _appended(slices.popleft(), incarnation)
                stream.taken(size)  # the transport took it: its share goes back
                transcript_metrics.WATCH_EVENTS.labels("appended").inc()
                if delivered >= head.last_sequence:  # live, not replayed: how late
                    observe_delivery(transcript_metrics.WATCH_DELIVERY_SECONDS, committed)
                delivered = last
            stream.spoke()
        stream.release()  # caught up: a stream that waits holds no bytes
        live = {(turn.turn_id, turn.fencing_token) for turn in state.running}
        for trace in state.traces:
            if (trace.turn_id, trace.fencing_token) not in live:
                del running[trace.turn_id]
                yield finish_of(trace)
                transcript_metrics.WATCH_EVENTS.labels("turn_finished").inc()
                stream.spoke()
        for turn in state.running:
            if turn.turn_id not in running:
                running[turn.turn_id] = turn
                yield TurnStarted(turn.turn_id, turn.start_time, turn.exclusive)
                transcript_metrics.WATCH_EVENTS.labels("turn_started").inc()
                stream.spoke()
        version, read_time = snapshot.version, snapshot.read_time
        stream.seen = snapshot.fingerprint
        if not caught_up:  # the replay is done
            caught_up = True
            yield Heartbeat(version, delivered, incarnation, read_time)
            transcript_metrics.WATCH_EVENTS.labels("heartbeat").inc()
            stream.spoke()
        while not await stream.woken_within(interval):
            yield Heartbeat(version, delivered, incarnation, hub.fresh(stream, read_time))
            transcript_metrics.WATCH_EVENTS.labels("heartbeat").inc()
            stream.spoke()


def _appended(piece: AppendSlice, incarnation: int) -> Appended:
    return Appended(piece.version, piece.last_sequence, incarnation, piece.entries)
