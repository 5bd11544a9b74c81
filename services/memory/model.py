"""Domain records of the memory service."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime


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
class Backlog:
    """Depth of the outbox and the age of its oldest row (seconds)."""

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
