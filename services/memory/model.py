"""Domain records of the memory service."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from services.common.errors import (
    DomainError,
    aborted,
    already_exists,
    failed_precondition,
    invalid_argument,
    not_found,
)


@dataclass(frozen=True, slots=True)
class MemorySource:
    """An inclusive range of a conversation's transcript that a memory came from.

    `incarnation`: the incarnation of the conversation the range was read from (a
    proposal's), which a write must still find current; 0 when not stated (a write
    then takes whatever incarnation its source check finds). Not stored: a memory's
    sources as read back say 0."""

    conversation_id: uuid.UUID
    from_sequence: int
    through_sequence: int
    incarnation: int = 0


@dataclass(frozen=True, slots=True)
class Memory:
    """The current revision of a curated fact.

    Two times: `valid_from_time` / `valid_until_time` say when the fact holds in
    the world (valid time); `create_time` / `update_time` when the store learned
    it (revision time). A superseded memory has its validity closed and names its
    successor in `superseded_by`.
    """

    namespace: str
    memory_id: uuid.UUID
    content: str
    sources: Sequence[MemorySource]
    metadata: Mapping[str, str]
    revision: int
    create_time: datetime
    update_time: datetime
    expire_time: datetime | None
    embedding_model: str = ""
    embedding_dimension: int = 0
    valid_from_time: datetime | None = None
    valid_until_time: datetime | None = None
    superseded_by: uuid.UUID | None = None

    def valid_at(self, when: datetime) -> bool:
        """Whether the fact holds at `when` (valid time)."""
        start = self.valid_from_time or self.create_time
        return start <= when and (self.valid_until_time is None or when < self.valid_until_time)


@dataclass(frozen=True, slots=True)
class Supersession:
    """A memory that a write supersedes, optionally at an expected revision."""

    memory_id: uuid.UUID
    expected_revision: int | None = None


@dataclass(frozen=True, slots=True)
class MemoryWrite:
    """An upsert as the store receives it (already validated).

    `expected_revision` None means create: the store refuses an id that is
    live in the namespace.
    """

    namespace: str
    memory_id: uuid.UUID
    content: str
    sources: Sequence[MemorySource]
    metadata: Mapping[str, str]
    expected_revision: int | None
    expire_time: datetime | None
    embedding_model: str
    embedding_dimension: int
    # The incarnation of each source conversation, as the source check saw it: the
    # store refuses the write if an erasure has fenced one of them since.
    source_incarnations: Mapping[uuid.UUID, int] = field(default_factory=dict)
    # AIP-155: the request id and a digest of the request, recorded with the write.
    request_id: str | None = None
    payload_hash: bytes = b""
    # Valid time. None: on a create, the store's default (now; the service passes the
    # create time of the earliest source entry); on an update, unchanged.
    valid_from_time: datetime | None = None
    # None: open on a create, unchanged on an update.
    valid_until_time: datetime | None = None
    # The memories this one supersedes (validity closed at its valid_from_time).
    supersedes: Sequence[Supersession] = ()


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a write stored: the memory, whether it created it, and the memories it
    superseded (at their new revision)."""

    memory: Memory
    created: bool
    superseded: Sequence[Memory] = ()


@dataclass(frozen=True, slots=True)
class SourceConversation:
    """A source conversation as TranscriptService reports it."""

    last_sequence: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class ScoredMemory:
    """A search hit: the current revision, the score it was ranked by, and its parts
    (the cosine, the BM25 score) where the mode has them."""

    memory: Memory
    score: float
    dense: float | None = None
    lexical: float | None = None


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Hits, best first, and whether they came from the full-text fallback."""

    hits: Sequence[ScoredMemory]
    degraded: bool
    # "dense", "lexical" or "hybrid"; "" when degraded.
    mode: str = ""


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One pending index write: the memory to bring in line with PostgreSQL."""

    seq: int
    namespace: str
    memory_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class OutboxDepth:
    """The memory outbox: index writes waiting (rows), and the age of the oldest (seconds)."""

    depth: int
    oldest_age_s: float


@dataclass(frozen=True, slots=True)
class RevisionRecord:
    """One row of a memory's history; tombstones and erased rows carry no content."""

    revision: int
    kind: str  # "write" or "delete"
    # "create", "update", "superseded", "reopened", "delete", "forget_source", "expired"
    reason: str
    recorded_at: datetime
    content: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    sources: Sequence[MemorySource] = ()
    expire_time: datetime | None = None
    valid_from_time: datetime | None = None
    valid_until_time: datetime | None = None
    superseded_by: uuid.UUID | None = None

    @property
    def erased(self) -> bool:
        """The memory was deleted (or this is its tombstone): nothing of the fact remains."""
        return self.content is None


# -- the errors of the memory domain ------------------------------------------------


def request_id_reused() -> DomainError:
    """INVALID_ARGUMENT: the request id was used for another UpsertMemory request."""
    return invalid_argument(
        "REQUEST_ID_REUSED",
        "request_id was already used with a different request",
        field="request_id",
    )


def source_not_found(index: int | None = None) -> DomainError:
    """NOT_FOUND: a source conversation is not in this namespace, or was erased after its
    check (the write is refused)."""
    if index is None:
        return not_found(
            "SOURCE_NOT_FOUND",
            "a source conversation was erased; nothing derived from it is stored",
        )
    return not_found(
        "SOURCE_NOT_FOUND", f"the conversation of sources[{index}] does not exist in this namespace"
    )


def source_erased(index: int) -> DomainError:
    """NOT_FOUND: a source names an incarnation of its conversation that is not the current
    one (erased, or erased and created again under the same id): the write is refused."""
    return not_found(
        "SOURCE_NOT_FOUND",
        f"the conversation of sources[{index}] was erased: the incarnation it names is "
        "not the conversation's",
        field=f"sources[{index}].incarnation",
    )


def conversation_erased() -> DomainError:
    """NOT_FOUND: the conversation was erased (or erased and created again under the same
    id) while ProposeMemories read it: nothing read from it is proposed."""
    return not_found(
        "CONVERSATION_ERASED",
        "the conversation was erased while its proposals were made; nothing is proposed",
    )


def conversation_not_found() -> DomainError:
    """NOT_FOUND: the conversation to read is not in this namespace (TranscriptService's
    reason, the same whether it never existed or is elsewhere)."""
    return not_found("CONVERSATION_NOT_FOUND", "conversation not found")


def memory_not_found() -> DomainError:
    """The one NOT_FOUND of this service; the same whether it never existed or is elsewhere."""
    return not_found("MEMORY_NOT_FOUND", "memory not found")


def revision_conflict(current: int, expected: int) -> DomainError:
    """ABORTED: the compare-and-swap lost; `current_revision` tells the caller where it is."""
    return aborted(
        "REVISION_CONFLICT",
        f"memory is at revision {current}, not {expected}",
        current_revision=current,
        expected_revision=expected,
    )


def memory_exists() -> DomainError:
    """ALREADY_EXISTS: a create (no expected_revision) named a live memory."""
    return already_exists(
        "MEMORY_ALREADY_EXISTS",
        "a memory with this id exists; send expected_revision to replace it",
    )


def supersession_cycle(index: int) -> DomainError:
    """INVALID_ARGUMENT: superseding this memory would make a cycle of supersessions."""
    return invalid_argument(
        "SUPERSESSION_CYCLE",
        f"supersedes[{index}] is this memory or one that it (through its successors) "
        "superseded: a supersession cannot make a cycle",
        field=f"supersedes[{index}].memory_id",
    )


def superseded_not_found(index: int) -> DomainError:
    """NOT_FOUND: a superseded memory is not live in this namespace (or not at all)."""
    return not_found(
        "MEMORY_NOT_FOUND",
        f"the memory of supersedes[{index}] was not found",
        field=f"supersedes[{index}].memory_id",
    )


def superseded_conflict(index: int, current: int, expected: int) -> DomainError:
    """ABORTED: a superseded memory is not at the revision the caller expected."""
    return aborted(
        "REVISION_CONFLICT",
        f"the memory of supersedes[{index}] is at revision {current}, not {expected}",
        current_revision=current,
        expected_revision=expected,
        field=f"supersedes[{index}].expected_revision",
    )


def validity_ended(index: int, superseded_by: uuid.UUID | None) -> DomainError:
    """FAILED_PRECONDITION: only an open fact can be superseded."""
    return failed_precondition(
        "VALIDITY_ENDED",
        f"the memory of supersedes[{index}] has already ended"
        + (" (superseded)" if superseded_by else ""),
        superseded_by=str(superseded_by) if superseded_by else "",
        field=f"supersedes[{index}].memory_id",
    )


def supersedes_later_fact(index: int) -> DomainError:
    """FAILED_PRECONDITION: a memory can only supersede one that became valid before it."""
    return failed_precondition(
        "SUPERSEDES_LATER_FACT",
        f"the memory of supersedes[{index}] became valid at or after this memory's valid_from_time",
        field=f"supersedes[{index}].memory_id",
    )
