"""The records of the memory outbox: a pending index write, a batch claimed under a lease,
and the outbox's depth."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.memory.model import Key, Memory


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
class OutboxClaim:
    """A batch of outbox rows claimed by one indexer under `token` until its lease ends.

    `current` and `deleted` are the state of the memories the batch names, read
    after the claim in one snapshot: each is at least as new as the writes that
    queued the rows.
    """

    token: uuid.UUID
    entries: Sequence[OutboxEntry]
    # Live memories.
    current: Mapping[Key, Memory]
    # Memories gone (deleted, expired): the revision of their deletion.
    deleted: Mapping[Key, int]

    @property
    def seqs(self) -> list[int]:
        """The outbox rows of the batch."""
        return [e.seq for e in self.entries]
