"""Domain records of the summary service, and the rule every commit obeys."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from services.common.domain import Entry, Usage
from services.common.errors import Code, DomainError


@dataclass(frozen=True, slots=True)
class Summary:
    """The summary of the transcript prefix 1..through_sequence of one conversation."""

    conversation_id: uuid.UUID
    namespace: str
    text: str
    through_sequence: int
    revision: int
    create_time: datetime
    # The conversation incarnation it summarizes (0: recorded before incarnations were).
    incarnation: int = 0

    def describes(self, conversation: ConversationState) -> bool:
        """True when this summary is about the conversation as it exists now: the same
        incarnation (a summary from before incarnations: one that fits the transcript)."""
        if self.incarnation == 0:
            return self.through_sequence <= conversation.last_sequence
        return self.incarnation == conversation.incarnation


@dataclass(frozen=True, slots=True)
class ConversationState:
    """What the summary service reads of a conversation from TranscriptService."""

    last_sequence: int
    incarnation: int
    # A fork's source and the last sequence it shares with it (ForkConversation): a
    # summary of the source within that prefix serves the fork until it has its own.
    fork_source: uuid.UUID | None = None
    fork_through: int = 0


@dataclass(frozen=True, slots=True)
class NewSummary:
    """A commit as the store receives it (already validated)."""

    namespace: str
    conversation_id: uuid.UUID
    text: str
    through_sequence: int
    expected_through_sequence: int | None
    incarnation: int = 0
    # A fork without a summary of its own: what its source's summary covers (it serves
    # the fork, so the fork's first commit must be newer and may name it as expected).
    inherited_through: int = 0


@dataclass(frozen=True, slots=True)
class CommitResult:
    """The summary now current, and whether this commit wrote it (False: a replay)."""

    summary: Summary
    written: bool


@dataclass(frozen=True, slots=True)
class SummaryErasure:
    """What an erasure of a conversation erased here: `rows` by this call (summaries,
    history and jobs); `summaries` (current and history) and `jobs` by every erasure of
    the incarnation so far, as its tombstone keeps them (by this call when the incarnation
    is 0: no tombstone). Counts only: an erasure receipt is made of them."""

    rows: int
    summaries: int
    jobs: int


@dataclass(frozen=True, slots=True)
class TranscriptView:
    """The part of a TranscriptService view the summarizer needs."""

    summary_buffer: Sequence[Entry]
    summary_backlog: int
    incarnation: int = 0


@dataclass(frozen=True, slots=True)
class SummarizeResult:
    """What Summarize did: the summary after the passes, passes committed, backlog left."""

    summary: Summary | None
    passes: int
    backlog: int
    usage: Usage


class SummaryConflict(DomainError):
    """A commit's expected_through_sequence was not the current summary's."""

    def __init__(self, current_through_sequence: int, expected_through_sequence: int) -> None:
        super().__init__(
            Code.ABORTED,
            "SUMMARY_CONFLICT",
            f"the summary covers through sequence {current_through_sequence}, "
            f"not {expected_through_sequence}",
            metadata={
                "current_through_sequence": current_through_sequence,
                "expected_through_sequence": expected_through_sequence,
            },
        )
        self.current_through_sequence = current_through_sequence


class SummaryNotNewer(DomainError):
    """A commit that does not cover more than the current summary (summaries only move forward)."""

    def __init__(self, current_through_sequence: int, through_sequence: int) -> None:
        super().__init__(
            Code.FAILED_PRECONDITION,
            "SUMMARY_NOT_NEWER",
            f"through_sequence {through_sequence} is not newer than the current summary "
            f"({current_through_sequence})",
            metadata={
                "current_through_sequence": current_through_sequence,
                "through_sequence": through_sequence,
            },
        )
        self.current_through_sequence = current_through_sequence


def conversation_erased() -> DomainError:
    """NOT_FOUND: the conversation (this incarnation of its id) was erased."""
    return DomainError(
        Code.NOT_FOUND,
        "CONVERSATION_ERASED",
        "the conversation was erased; nothing derived from it can be written",
    )


def belongs(current: Summary | None, new: NewSummary) -> Summary | None:
    """The current summary if it is about the incarnation `new` is for, else None (a
    summary of an earlier incarnation describes nothing that exists)."""
    if current is None or current.incarnation in (0, new.incarnation):
        return current
    return None


def check_commit(current: Summary | None, new: NewSummary) -> Summary | None:
    """The monotonic rule, applied by a store while it holds the conversation's summary
    (`current`, already filtered by `belongs`).

    Returns the current summary when `new` is a replay of it (same range, same
    text: nothing to write), None when `new` may be written. Raises
    SummaryConflict when the compare-and-swap fails, SummaryNotNewer when the
    commit does not cover more than the current summary.
    """
    current_through = current.through_sequence if current is not None else new.inherited_through
    if (
        current is not None
        and current.through_sequence == new.through_sequence
        and current.text == new.text
    ):
        return current
    expected = new.expected_through_sequence
    if expected is not None and expected != current_through:
        raise SummaryConflict(current_through, expected)
    if new.through_sequence <= current_through:
        raise SummaryNotNewer(current_through, new.through_sequence)
    return None
