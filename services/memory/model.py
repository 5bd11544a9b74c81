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
    invalid_argument,
    not_found,
)


@dataclass(frozen=True, slots=True)
class MemorySource:
    """An inclusive range of a conversation's transcript that a memory came from."""

    conversation_id: uuid.UUID
    from_sequence: int
    through_sequence: int


@dataclass(frozen=True, slots=True)
class Memory:
    """The current revision of a curated fact."""

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


@dataclass(frozen=True, slots=True)
class SourceConversation:
    """A source conversation as TranscriptService reports it."""

    last_sequence: int
    incarnation: int


@dataclass(frozen=True, slots=True)
class ScoredMemory:
    """A search hit: the current revision and its similarity to the query."""

    memory: Memory
    score: float


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Hits, best first, and whether they came from the full-text fallback."""

    hits: Sequence[ScoredMemory]
    degraded: bool


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
    reason: str  # "create", "update", "delete", "forget_source", "expired"
    recorded_at: datetime
    content: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)


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
