"""The vocabulary of WatchConversation (service.py): the events a stream yields, what the
feed's store reads (store.py), the feed's errors, and its pure rules (how a reported
turn ended). No I/O, no gRPC, no SQL. What every change feed shares (the heartbeat
interval a request may ask for, the refusals of a stream) is services/common/watch/model.py.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from services.common.domain import Entry
from services.common.errors import DomainError
from services.common.watch import model as feeds

# Where a client resumes from, in the messages of the errors that end a stream.
_RESUME_FROM = "sequence"


class TurnFinish(enum.IntEnum):
    """How a reported turn ended. Values equal runifold.transcript.v1.TurnFinish's."""

    COMMITTED = 1
    ENDED = 2
    RELEASED = 3
    LAPSED = 4


# -- the events of a stream --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Appended:
    """Entries of one append (all of it, or a page's share of a long one), in order."""

    version: int
    last_sequence: int  # the append's last sequence
    incarnation: int
    entries: Sequence[Entry]


@dataclass(frozen=True, slots=True)
class TurnStarted:
    """A turn holds a lease on the conversation."""

    turn_id: str
    start_time: datetime
    exclusive: bool


@dataclass(frozen=True, slots=True)
class TurnFinished:
    """A turn reported by TurnStarted no longer runs."""

    turn_id: str
    finish: TurnFinish
    version: int = 0  # COMMITTED: the version its append made
    reason: str = ""  # ENDED: the ErrorInfo reason it ended with


@dataclass(frozen=True, slots=True)
class Retracted:
    """Entries the stream delivered earlier that the write at `version` retracted."""

    version: int
    sequences: Sequence[int]  # increasing
    retract_time: datetime


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Caught up: every entry through `last_sequence` was delivered."""

    version: int
    last_sequence: int
    incarnation: int
    read_time: datetime  # when the server last found that to be the conversation's state


@dataclass(frozen=True, slots=True)
class Erased:
    """The incarnation the stream followed is gone; the stream ends."""

    incarnation: int


WatchEvent = Appended | Retracted | TurnStarted | TurnFinished | Heartbeat | Erased


# -- what the store reads ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A conversation's counters at `read_time` (the database's clock)."""

    key: int  # the store's key of this incarnation; never reused
    version: int
    last_sequence: int
    incarnation: int
    read_time: datetime
    # Fencing tokens of its running turns, sorted: only compared, never sent.
    running: tuple[int, ...] = ()

    @property
    def fingerprint(self) -> tuple[int, int, int, tuple[int, ...]]:
        """What a stream that is up to date with this snapshot has seen."""
        return (self.version, self.last_sequence, self.incarnation, self.running)


@dataclass(frozen=True, slots=True)
class RunningTurn:
    """A turn whose lease holds."""

    turn_id: str
    fencing_token: int  # tells a new grant of the same turn id
    exclusive: bool
    start_time: datetime


@dataclass(frozen=True, slots=True)
class TurnTrace:
    """What became of a turn a stream reported running (`fencing_token`): its row now, if any,
    and the version its append made, if it committed."""

    turn_id: str
    fencing_token: int
    state: str | None  # "running", "waiting", "ended", "committed"; None: no row
    row_fencing_token: int | None
    reason: str | None  # the outcome's reason of an ended turn
    committed_version: int | None


@dataclass(frozen=True, slots=True)
class AppendSlice:
    """Consecutive entries of one append."""

    version: int
    last_sequence: int
    entries: Sequence[Entry]
    # What the stream is charged for holding them: their content's bytes as stored,
    # and ENTRY_OVERHEAD_BYTES each.
    size_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Retraction:
    """A write that retracted entries: its version, the sequences, when."""

    version: int
    sequences: tuple[int, ...]
    retract_time: datetime


@dataclass(frozen=True, slots=True)
class FeedState:
    """One consistent read of a watched conversation."""

    snapshot: Snapshot
    running: Sequence[RunningTurn]
    traces: Sequence[TurnTrace]
    # The first page of entries after what the stream delivered.
    entries: Sequence[AppendSlice] = ()
    # The writes after the version read_state was given that retracted delivered
    # entries: the first `max_entries` of them, in version order, and past the first
    # no more than about `max_entries` sequences in all.
    retractions: Sequence[Retraction] = ()


# -- errors ------------------------------------------------------------------------------


def watcher_limit(scope: str, limit: int, retry_after_s: float) -> DomainError:
    """RESOURCE_EXHAUSTED: as many streams are open as this process allows."""
    return feeds.watcher_limit("WatchConversation", scope, limit, retry_after_s)


def watcher_too_slow(timeout_s: float) -> DomainError:
    """RESOURCE_EXHAUSTED: the reader took nothing for too long (it resumes where it was)."""
    return feeds.watcher_too_slow(timeout_s, _RESUME_FROM)


def shutting_down() -> DomainError:
    """UNAVAILABLE: this server is stopping; resume on another replica."""
    return feeds.shutting_down(_RESUME_FROM)


# -- rules -------------------------------------------------------------------------------


def more_retractions(retractions: Sequence[Retraction], page: int) -> bool:
    """Whether retractions may follow those one read returned: it held a page of them
    (`page` writes, or `page` sequences in all)."""
    return len(retractions) >= page or sum(len(r.sequences) for r in retractions) >= page


def finish_of(trace: TurnTrace) -> TurnFinished:
    """How a reported turn that no longer runs ended, from what is left of it."""
    if trace.committed_version is not None:
        return TurnFinished(trace.turn_id, TurnFinish.COMMITTED, version=trace.committed_version)
    if trace.state is None:
        # No row: the lease was released without an outcome (or it lapsed and another
        # lease decision cleared it before the stream looked again).
        return TurnFinished(trace.turn_id, TurnFinish.RELEASED)
    if trace.state == "ended" and trace.row_fencing_token == trace.fencing_token:
        return TurnFinished(trace.turn_id, TurnFinish.ENDED, reason=trace.reason or "")
    # Still its row but no longer live, or a newer grant of the same turn id.
    return TurnFinished(trace.turn_id, TurnFinish.LAPSED)
