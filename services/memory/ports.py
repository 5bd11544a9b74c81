"""What the memory service needs from TranscriptService (gRPC adapter in remote.py)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Protocol

from services.common.domain import Entry
from services.memory.model import SourceConversation


class SourceChecker(Protocol):
    """Tells how far a conversation's transcript goes, and which incarnation it is; reads
    its entries (for a memory's default valid time, and for ProposeMemories)."""

    async def conversation(
        self, namespace: str, conversation_id: uuid.UUID
    ) -> SourceConversation | None:
        """The conversation's last sequence and incarnation, or None when it is not in
        this namespace."""

    async def entries(
        self, namespace: str, conversation_id: uuid.UUID, from_sequence: int, through_sequence: int
    ) -> Sequence[Entry]:
        """The entries from `from_sequence` through `through_sequence` (inclusive), in
        order; empty when the conversation is not in this namespace."""

    async def mark_curated(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int, curated_through: int
    ) -> None:
        """Record that curation read this incarnation through `curated_through`
        (Conversation.curated_through: monotonic). NOT_FOUND when the conversation, or
        that incarnation of it, is gone."""

    async def retracted(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        after_version: int,
        through_sequence: int,
    ) -> list[int]:
        """The sequences (through `through_sequence`) that writes after `after_version`
        retracted; empty when the conversation is not in this namespace."""
