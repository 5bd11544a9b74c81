"""What the summary service reads from TranscriptService (gRPC adapter in remote.py)."""

from __future__ import annotations

import uuid
from typing import Protocol

from services.common.domain import Entry
from services.summary.model import ConversationState, TranscriptView


class Transcripts(Protocol):
    """What the summary service reads from TranscriptService (its API, never its tables).

    Each method raises NOT_FOUND / CONVERSATION_NOT_FOUND when the conversation
    is not in the namespace."""

    async def conversation(self, namespace: str, conversation_id: uuid.UUID) -> ConversationState:
        """The conversation's last sequence (0 when empty) and incarnation."""

    async def entry_after(
        self, namespace: str, conversation_id: uuid.UUID, sequence: int
    ) -> Entry | None:
        """The entry at `sequence + 1`, if there is one."""

    async def load_view(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        window: int,
        summary_batch: int,
        summarized_through: int,
    ) -> TranscriptView:
        """LoadView: the summary buffer after `summarized_through`, the backlog behind it,
        and the incarnation it was read from."""
