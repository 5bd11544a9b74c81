"""What a watch that resumes remembers: where to resume from, and what it reported.

WatchConversation's stream breaks (a replica restarts, a reader falls behind); the
client watches again from the last sequence received and its incarnation. The new
stream reports again what the old one had (running turns, retractions up to the
version seen): `Position` drops those repeats and, once the new stream has caught up,
reports the turns that finished while it was down.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import grpc

from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client.errors import RunifoldError


def resumable(error: RunifoldError) -> bool:
    """A WatchConversation (or WatchMemories) that ended so can be watched again from
    where it was."""
    return error.code == grpc.StatusCode.UNAVAILABLE or (
        error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.reason == "WATCHER_TOO_SLOW"
    )


def backoff_s(attempt: int, max_s: float) -> float:
    """The wait before watching again: 0.1 s doubling up to `max_s`, jittered."""
    return float(min(max_s, 0.1 * 2 ** min(attempt, 16)) * random.uniform(0.5, 1.0))


class Position:
    """Where a watch stands, and what it reported (no I/O)."""

    def __init__(self, after_sequence: int, incarnation: int) -> None:
        self.after = after_sequence
        self.known = incarnation
        # The newest version an event showed: every retraction up to it was reported
        # (the server sends them before later entries), so a resumed stream's repeat of
        # one is dropped.
        self.version = 0
        self.running: set[str] = set()  # turns reported started and not finished
        self.announced: set[str] | None = None  # after a resume: the turns reported again
        self.attempt = 0

    def resumed(self) -> None:
        """A new stream starts: it reports the running turns again."""
        self.announced = set()

    def see(
        self, event: transcript_pb.WatchConversationResponse
    ) -> Iterator[transcript_pb.WatchConversationResponse]:
        """The events to report for one the stream sent: none for a repeat; before a
        heartbeat that ends a resume, a `turn_finished` for each turn that finished
        while the stream was down."""
        kind = event.WhichOneof("event")
        if kind == "appended":
            if event.appended.entries:
                self.after = event.appended.entries[-1].sequence
            self.known = event.appended.incarnation or self.known
            self.version = max(self.version, event.appended.version)
        elif kind == "retracted":
            if event.retracted.version <= self.version:
                return  # reported before the resume
            self.version = event.retracted.version
        elif kind == "turn_started":
            turn_id = event.turn_started.turn_id
            if self.announced is not None:
                self.announced.add(turn_id)
            if turn_id in self.running:
                return  # reported by the stream before the resume
            self.running.add(turn_id)
        elif kind == "turn_finished":
            self.running.discard(event.turn_finished.turn_id)
        elif kind == "heartbeat":
            self.known = event.heartbeat.incarnation or self.known
            self.version = max(self.version, event.heartbeat.version)
            self.attempt = 0
            if self.announced is not None:  # caught up after a resume
                for turn_id in sorted(self.running - self.announced):
                    self.running.discard(turn_id)
                    yield transcript_pb.WatchConversationResponse(
                        turn_finished=transcript_pb.TurnFinished(turn_id=turn_id)
                    )
                self.announced = None
        yield event
