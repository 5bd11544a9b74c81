"""The vocabulary of WatchMemories (service.py): the events a stream yields, what the
feed's store reads (store.py), the feed's errors, and its pure rules (the kind of a
change). No I/O, no gRPC, no SQL. What every change feed shares (the heartbeat
interval a request may ask for, the refusals of a stream) is services/common/watch/model.py.

A namespace's changes are the rows of its memories' history (memory.revisions), each
numbered by its `change_sequence` (migrations/0006_change_feed.sql): a change is one
revision of one memory, so its kind follows from why the revision was written.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from services.common.errors import DomainError, invalid_argument
from services.common.watch import model as feeds
from services.memory.model import Memory

# Where a client resumes from, in the messages of the errors that end a stream.
_RESUME_FROM = "change sequence"


class ChangeKind(enum.IntEnum):
    """What a change did. Values equal runifold.memory.v1.MemoryEventKind's."""

    CREATED = 1
    UPDATED = 2
    SUPERSEDED = 3
    DELETED = 4
    EXPIRED = 5
    ERASED = 6


# The kind of each reason a revision is written for (RevisionRecord.reason). A memory
# leaves once, by whatever removes its row first: DeleteMemory (DELETED), ForgetSource
# and the erasure of a conversation (ERASED), or its expiry (EXPIRED: the sweeper, or a
# create of its id after it lapsed); a read that finds it lapsed writes nothing.
_KINDS = {
    "create": ChangeKind.CREATED,
    "update": ChangeKind.UPDATED,
    # Its successor was erased: its validity is open again.
    "reopened": ChangeKind.UPDATED,
    "superseded": ChangeKind.SUPERSEDED,
    "delete": ChangeKind.DELETED,
    "forget_source": ChangeKind.ERASED,
    "expired": ChangeKind.EXPIRED,
}

# The kinds after which the memory is gone: their events carry no memory.
REMOVALS = frozenset({ChangeKind.DELETED, ChangeKind.EXPIRED, ChangeKind.ERASED})


def kind_of(kind: str, reason: str) -> ChangeKind:
    """The change a revision records, from its kind ("write", "delete") and reason (a
    reason this code does not know counts as an update, or as a deletion)."""
    known = _KINDS.get(reason)
    if known is not None:
        return known
    return ChangeKind.DELETED if kind == "delete" else ChangeKind.UPDATED


# -- the events of a stream --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Changed:
    """One change of a memory of the namespace, numbered `change_sequence`."""

    change_sequence: int
    kind: ChangeKind
    memory_id: uuid.UUID
    revision: int  # the revision the change wrote (a removal: its tombstone's)
    change_time: datetime  # when it was recorded (the revision's record time)
    # The memory as of this revision; None for a removal, and for a change of a memory
    # removed since (a removal erases the content of the memory's whole history).
    memory: Memory | None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Caught up: every change through `change_sequence` was delivered."""

    change_sequence: int
    read_time: datetime  # when the server last found that to be the namespace's last


WatchEvent = Changed | Heartbeat


# -- what the store reads ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Head:
    """A namespace's feed at `read_time` (the database's clock)."""

    key: int  # the feed's key of the namespace (memory.feeds.feed_key): what a NOTIFY says
    last_change_sequence: int
    read_time: datetime

    @property
    def fingerprint(self) -> int:
        """What a stream that is up to date with this head has seen: its last change."""
        return self.last_change_sequence


@dataclass(frozen=True, slots=True)
class ChangePage:
    """One read of a namespace's feed: its head, and the first changes after a number."""

    head: Head
    changes: Sequence[Changed]
    # What the stream is charged for holding each change: its memory's bytes as stored,
    # and CHANGE_OVERHEAD_BYTES (services/memory/config.py).
    sizes: Sequence[int] = ()


# -- errors ------------------------------------------------------------------------------


def watcher_limit(scope: str, limit: int, retry_after_s: float) -> DomainError:
    """RESOURCE_EXHAUSTED: as many streams are open as this process allows."""
    return feeds.watcher_limit("WatchMemories", scope, limit, retry_after_s)


def watcher_too_slow(timeout_s: float) -> DomainError:
    """RESOURCE_EXHAUSTED: the reader took nothing for too long (it resumes where it was)."""
    return feeds.watcher_too_slow(timeout_s, _RESUME_FROM)


def shutting_down() -> DomainError:
    """UNAVAILABLE: this server is stopping; resume on another replica."""
    return feeds.shutting_down(_RESUME_FROM)


def change_sequence_out_of_range(last: int) -> DomainError:
    """INVALID_ARGUMENT: a stream asked to start after a change the namespace never had
    (a client that followed another database, or one restored from an older backup)."""
    return invalid_argument(
        "SEQUENCE_OUT_OF_RANGE",
        "after_change_sequence is beyond the namespace's last change",
        field="after_change_sequence",
        last_change_sequence=last,
    )
