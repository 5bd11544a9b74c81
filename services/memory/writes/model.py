"""The records of a memory write and the errors that refuse one."""

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
from services.memory.model import Memory, Source


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
    sources: Sequence[Source]
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


# -- the errors of the writes --------------------------------------------------------


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
