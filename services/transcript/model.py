"""Domain records of the transcript service."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from services.common.domain import Entry, Message, Usage

# Above every sequence a transcript can reach (and below int64 overflow when a
# batch is added to it): the open upper bound of a range in SQL.
SEQUENCE_CEILING = 2**62


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation and its counters."""

    conversation_id: uuid.UUID
    namespace: str
    version: int
    last_sequence: int
    create_time: datetime
    update_time: datetime
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NewAppend:
    """An append as the store receives it (already validated)."""

    namespace: str
    conversation_id: uuid.UUID
    expected_version: int | None
    messages: Sequence[Message]
    request_id: str | None
    payload_hash: bytes
    usage: Usage
    encoded: str  # canonical JSON of `messages` (domain.canonical_json)


@dataclass(frozen=True, slots=True)
class AppendRecord:
    """A committed append: what one version of a conversation added."""

    version: int
    first_sequence: int
    last_sequence: int
    usage: Usage
    commit_time: datetime
    payload_hash: bytes | None = None


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The result of AppendEntries, first time or replayed."""

    record: AppendRecord
    replayed: bool


@dataclass(frozen=True, slots=True)
class ViewRead:
    """What the store reads for a view in one round trip (see TranscriptStore.read_view)."""

    version: int
    last_sequence: int
    entries: Sequence[Entry]
    prior_append: AppendRecord | None


@dataclass(frozen=True, slots=True)
class View:
    """The bounded context of a turn, consistent with `version`."""

    version: int
    last_sequence: int
    window: Sequence[Entry]
    summary_buffer: Sequence[Entry]
    summary_backlog: int
    prior_append: AppendRecord | None
