"""What the memory service needs from TranscriptService (gRPC adapter in peers.py)."""

from __future__ import annotations

import uuid
from typing import Protocol

from services.memory.model import SourceConversation


class SourceChecker(Protocol):
    """Tells how far a conversation's transcript goes, and which incarnation it is."""

    async def conversation(
        self, namespace: str, conversation_id: uuid.UUID
    ) -> SourceConversation | None:
        """The conversation's last sequence and incarnation, or None when it is not in
        this namespace."""
