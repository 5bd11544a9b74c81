"""ForkConversation: a conversation made from a prefix of another, sharing it without
copying it. The fork as the store receives it, the prefix a fork shares with its
lineage, and the errors of its rules. Pure rules: no I/O.

A fork at `through_sequence` t of a source shares the source's entries 1..t and its
appends 1..V, where V is the fork point's version: the last append of the source whose
entries all lie within the prefix (its last sequence at most t). When t cuts an append
(V + 1 wrote entries on both sides of it), the fork keeps the entries of that append up
to t, but not its state change or retractions: they are the source's write, made after
the fork point. The fork's own first append, version V + 1, is the fork itself (its
sequences are those cut entries, none when t cut nothing); the fork's own entries follow
from t + 1, its own appends from V + 2.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from services.common.domain import SEQUENCE_MAX, payload_hash
from services.common.errors import Code, DomainError, invalid_argument
from services.transcript.conversations.model import Segment

# A fork's own part, as the last segment of a chain: everything after the prefix.
_UNBOUNDED = SEQUENCE_MAX


@dataclass(frozen=True, slots=True)
class ForkRef:
    """A fork as ListForks names it: what erasing its source erases with it."""

    conversation_id: uuid.UUID
    incarnation: int
    source_id: uuid.UUID  # the conversation it was made from
    through_sequence: int  # the last entry of its source it shares
    # Where it stands in the order forks were made (the store's key: a fork's is larger
    # than its source's), the cursor of ListForks' pages.
    key: int


@dataclass(frozen=True, slots=True)
class ForkPage:
    """A page of ListForks."""

    forks: list[ForkRef]
    next_page_token: str


@dataclass(frozen=True, slots=True)
class NewFork:
    """A fork as the store receives it (already validated)."""

    namespace: str
    source_id: uuid.UUID
    through_sequence: int
    conversation_id: uuid.UUID  # the new conversation's
    request_id: str | None
    payload_hash: bytes


def fork_payload_hash(through_sequence: int, new_conversation_id: str) -> bytes:
    """What a fork's request id stands for: the fork point and the id asked for (empty
    when the server made one)."""
    return payload_hash(json.dumps(["fork", through_sequence, new_conversation_id]))


def chain(prefix: tuple[Segment, ...], key: int) -> tuple[Segment, ...]:
    """The whole lineage of conversation `key` whose shared prefix is `prefix`: the
    prefix's segments, then the conversation's own part (unbounded)."""
    return (*prefix, Segment(key, _UNBOUNDED, _UNBOUNDED))


def clip_prefix(lineage: tuple[Segment, ...], through: int, version: int) -> tuple[Segment, ...]:
    """The prefix of a fork at sequence `through` and version `version` of a conversation
    whose whole lineage is `lineage`: its segments cut at the fork point, without those
    that hold nothing of it. Its length is at most the lineage's: a fork of a fork of a
    fork shares with at most three conversations, however long they are."""
    clipped: list[Segment] = []
    low_sequence = low_version = 0
    for segment in lineage:
        if low_sequence >= through and low_version >= version:
            break
        high_sequence = min(segment.through_sequence, through)
        high_version = min(segment.through_version, version)
        if high_sequence > low_sequence or high_version > low_version:
            clipped.append(Segment(segment.key, high_sequence, high_version))
        low_sequence, low_version = high_sequence, high_version
    return tuple(clipped)


def fork_point_out_of_range(last_sequence: int) -> DomainError:
    """INVALID_ARGUMENT: a fork point beyond the source's last entry."""
    return invalid_argument(
        "SEQUENCE_OUT_OF_RANGE",
        "through_sequence is beyond the source conversation",
        field="through_sequence",
        last_sequence=last_sequence,
    )


def forks_changed(not_erased: int) -> DomainError:
    """FAILED_PRECONDITION: an erasure's deletion would erase forks whose derived data the
    erasure has not erased (made since it listed them); nothing was deleted."""
    return DomainError(
        Code.FAILED_PRECONDITION,
        "FORKS_CHANGED",
        "the conversation has forks that were not listed when its erasure began: list "
        "its forks again, erase what was derived from the new ones, and delete again",
        metadata={"forks_not_erased": not_erased},
    )


def conversation_exists() -> DomainError:
    """ALREADY_EXISTS: the fork's new_conversation_id names a conversation of the
    namespace that is not this fork (a repeat of the same fork returns it)."""
    return DomainError(
        Code.ALREADY_EXISTS,
        "CONVERSATION_EXISTS",
        "new_conversation_id names a conversation that already exists in this namespace",
        field="new_conversation_id",
    )
