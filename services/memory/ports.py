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
