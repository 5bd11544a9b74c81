"""Automatic curation's records and rules: a job and its queue, a batch of entries and the
facts it stores, the hourly budget, and the errors. No I/O.

What a batch stores is decided here from what the proposer answered (already checked by
proposals/model.py's `check_proposals`): an ADD is a new memory, a SUPERSEDE a new memory
that closes the validity of the memory it replaces, at the revision the proposer was
shown (compare-and-swap: a memory changed meanwhile refuses the whole batch, which is
proposed again), and a DUPLICATE is skipped.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from services.common.errors import Code, DomainError
from services.memory.model import MemorySource
from services.memory.proposals.model import ADD, DUPLICATE, SUPERSEDE, Proposal, RelatedMemory
from services.memory.writes.model import Supersession

# The metadata every curated memory carries (its origin), and the key of the
# conversation's user when it has one (that user's memories are the ones a batch may
# supersede, and the ones shown to the proposer).
ORIGIN_KEY, ORIGIN = "runifold.origin", "curation"
USER_KEY = "user_id"

# What refuses a batch's supersession because the memory it replaces changed after the
# proposer saw it (the batch is proposed again from what is stored now).
CONFLICT_REASONS = frozenset(
    {
        "REVISION_CONFLICT",
        "VALIDITY_ENDED",
        "MEMORY_NOT_FOUND",
        "SUPERSEDES_LATER_FACT",
        "SUPERSESSION_CYCLE",
    }
)


class JobState(enum.IntEnum):
    """State of a curation job. Values equal the protobuf enum's (CurationJobState)."""

    PENDING = 1
    RUNNING = 2
    DONE = 3
    FAILED = 4


# The job state as stored (its name in lower case, readable in SQL) and back.
STATES_BY_NAME = {state.name.lower(): state for state in JobState}


@dataclass(frozen=True, slots=True)
class CurationJob:
    """A background curation job of one conversation (one incarnation of it)."""

    job_id: uuid.UUID
    namespace: str
    conversation_id: uuid.UUID
    incarnation: int
    state: JobState
    attempts: int
    failures: int
    create_time: datetime
    enqueue_time: datetime
    lease_token: uuid.UUID | None = None
    claimed_by: str = ""
    last_error: str = ""
    batches: int = 0
    facts: int = 0


@dataclass(frozen=True, slots=True)
class CurationBacklog:
    """The curation queue of a namespace (or of all, for the gauges), and what the
    namespace's curation spent in the current hour."""

    depth: int = 0
    oldest_pending_age_s: float = 0.0
    failed_count: int = 0
    running_count: int = 0
    model_calls_this_hour: int = 0
    tokens_this_hour: int = 0
    facts_this_hour: int = 0


@dataclass(frozen=True, slots=True)
class Cursor:
    """How far curation read a conversation's incarnation (0, 0: not at all)."""

    curated_through: int = 0
    curated_version: int = 0


@dataclass(frozen=True, slots=True)
class Fact:
    """A memory a batch stores: its content, exact sources, valid time, and the memory
    it supersedes (at the revision the proposer was shown), if any."""

    content: str
    sources: Sequence[MemorySource]
    valid_from_time: datetime
    supersedes: Sequence[Supersession] = ()


@dataclass(frozen=True, slots=True)
class Batch:
    """What one batch applies, in one transaction: the facts of entries
    `after_sequence` + 1 .. `through_sequence`, read at `conversation_version`, and the
    sequences retracted since the cursor's version (their curated memories go)."""

    job_id: uuid.UUID
    lease_token: uuid.UUID
    namespace: str
    conversation_id: uuid.UUID
    incarnation: int
    after_sequence: int
    through_sequence: int
    conversation_version: int
    facts: Sequence[Fact] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)
    retracted: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What a batch stored: memories added, memories they superseded, curated memories
    forgotten because their entries were retracted."""

    added: int = 0
    superseded: int = 0
    forgotten: int = 0


# -- rules -------------------------------------------------------------------------


def batch_range(start: int, last_sequence: int, size: int) -> tuple[int, int] | None:
    """The next batch after `start` (inclusive bounds), at most `size` entries, never past
    the last entry; None when everything through `last_sequence` was curated."""
    if start >= last_sequence:
        return None
    return start + 1, min(start + size, last_sequence)


def facts_of(
    proposals: Sequence[Proposal], related: Sequence[RelatedMemory]
) -> tuple[list[Fact], int]:
    """The facts a batch stores from checked proposals, and how many were duplicates
    (skipped). A SUPERSEDE names the related memory at the revision it was shown."""
    revision = {r.memory.memory_id: r.memory.revision for r in related}
    facts: list[Fact] = []
    duplicates = 0
    for proposal in proposals:
        if proposal.action == DUPLICATE:
            duplicates += 1
            continue
        supersedes: list[Supersession] = []
        if proposal.action == SUPERSEDE:
            target = proposal.related_memory_ids[0]
            supersedes.append(Supersession(target, revision[target]))
        else:
            assert proposal.action == ADD
        facts.append(Fact(proposal.content, proposal.sources, proposal.valid_from_time, supersedes))
    return facts, duplicates


def curated_metadata(user_id: str | None) -> dict[str, str]:
    """The metadata of a curated memory: its origin, and the conversation's user."""
    metadata = {ORIGIN_KEY: ORIGIN}
    if user_id:
        metadata[USER_KEY] = user_id
    return metadata


def related_filter(user_id: str | None) -> dict[str, str]:
    """Which stored memories a conversation's batch is shown (and may supersede): with a
    user, that user's; without, the namespace's."""
    return {USER_KEY: user_id} if user_id else {}


def window_start(now: datetime) -> datetime:
    """The clock hour (UTC) a budget charge falls in."""
    return now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def budget_retry_after(now: datetime) -> float:
    """Seconds until the next clock hour, when a spent hourly budget is whole again."""
    return max(1.0, (window_start(now) + timedelta(hours=1) - now).total_seconds())


# -- the errors ----------------------------------------------------------------------


def curation_queue_full(limit: int, retry_after_s: float) -> DomainError:
    """RESOURCE_EXHAUSTED: the namespace has its most waiting curation jobs."""
    return DomainError(
        Code.RESOURCE_EXHAUSTED,
        "CURATION_QUEUE_FULL",
        f"this namespace has {limit} curation jobs waiting, its limit; retry after the "
        "delay in RetryInfo",
        metadata={"limit": limit},
        retry_after_s=retry_after_s,
    )


def curation_budget_exhausted(kind: str, limit: int, retry_after_s: float) -> DomainError:
    """RESOURCE_EXHAUSTED: the namespace's curation spent its hourly `kind` (model_calls
    or tokens); its jobs wait for the next hour."""
    return DomainError(
        Code.RESOURCE_EXHAUSTED,
        "CURATION_BUDGET_EXHAUSTED",
        f"this namespace's curation used its {limit} {kind.replace('_', ' ')} of this hour; "
        "its jobs wait for the next hour",
        metadata={"kind": kind, "limit": limit},
        retry_after_s=retry_after_s,
    )


def curation_lease_lost() -> DomainError:
    """ABORTED: the job's lease was taken over (or the job erased) before its batch
    committed; the batch stored nothing."""
    return DomainError(
        Code.ABORTED, "CURATION_LEASE_LOST", "the curation job's lease was lost; nothing stored"
    )


def cursor_moved(current: int) -> DomainError:
    """ABORTED: another batch advanced the conversation's cursor first; this one stored
    nothing (the job goes on from the new cursor)."""
    return DomainError(
        Code.ABORTED,
        "CURATION_CURSOR_MOVED",
        "the conversation was curated further meanwhile; nothing stored",
        metadata={"curated_through": current},
    )
