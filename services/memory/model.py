"""Domain records of the memory service that every feature shares: a memory, its sources and
its history, its key and id, and the errors more than one feature raises. Each feature's own
records are in its folder (writes/, search/, proposals/, outbox/, index/)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from services.common import validation
from services.common.errors import DomainError, invalid_argument, not_found

# (namespace, memory id): what names one memory, in the store and in the index.
Key = tuple[str, uuid.UUID]


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
class ExternalSource:
    """A source outside a Runifold transcript (an MCP client's note, a LangGraph store item,
    an imported document), named by an absolute URI, kept and compared exactly as sent.
    Nothing checks it beyond its form; ForgetSource by the URI deletes what names it."""

    uri: str


# Where a memory came from: a range of a transcript, or a URI outside one.
Source = MemorySource | ExternalSource


@dataclass(frozen=True, slots=True)
class MemoryErasure:
    """What the erasure of one incarnation of a conversation erased here, over all its
    ForgetSource calls (its tombstone keeps the counts; never content): memories deleted,
    revisions whose content was erased, index points to remove (one per memory), and when
    the index had caught up (every index write the erasure queued applied)."""

    conversation_id: uuid.UUID
    incarnation: int
    memories_deleted: int
    revisions_erased: int
    index_points: int
    erase_time: datetime
    index_complete_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What one ForgetSource did: the memories it deleted, and with an incarnation, the
    erasure of that incarnation so far."""

    deleted: int
    erasure: MemoryErasure | None = None


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
    sources: Sequence[Source]
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
class SourceConversation:
    """A source conversation as TranscriptService reports it."""

    last_sequence: int
    incarnation: int
    # Its version (committed writes), how far curation read it (MarkCurated), its user.
    version: int = 0
    curated_through: int = 0
    user_id: str | None = None


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
    sources: Sequence[Source] = ()
    expire_time: datetime | None = None
    valid_from_time: datetime | None = None
    valid_until_time: datetime | None = None
    superseded_by: uuid.UUID | None = None

    @property
    def erased(self) -> bool:
        """The memory was deleted (or this is its tombstone): nothing of the fact remains."""
        return self.content is None


# -- the errors of more than one feature ---------------------------------------------


def memory_not_found() -> DomainError:
    """The one NOT_FOUND of this service; the same whether it never existed or is elsewhere."""
    return not_found("MEMORY_NOT_FOUND", "memory not found")


def invalid_validity(
    message: str = "valid_until_time must be after valid_from_time",
    field: str = "valid_until_time",
) -> DomainError:
    """INVALID_ARGUMENT: a validity that ends before it starts, or a bad valid time."""
    return invalid_argument("INVALID_VALIDITY", message, field=field)


def erasure_not_found() -> DomainError:
    """NOT_FOUND: no erasure of that incarnation of the conversation is kept here."""
    return not_found("ERASURE_NOT_FOUND", "no erasure of this conversation incarnation is kept")


def memory_id(value: str, field: str = "memory_id") -> uuid.UUID:
    """A memory id: a UUID in canonical text form."""
    return validation.uuid_id(value, field, "INVALID_MEMORY_ID")
