"""Source validation through TranscriptService's gRPC API (never its tables)."""

from __future__ import annotations

import uuid
from typing import Protocol

from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common import stubs
from services.common.errors import Code, DomainError
from services.common.peers import Peer


class SourceChecker(Protocol):
    """Tells how far a conversation's transcript goes."""

    async def last_sequence(self, namespace: str, conversation_id: uuid.UUID) -> int | None:
        """The conversation's last sequence, or None when it is not in this namespace."""


class TranscriptSources:
    """SourceChecker that asks TranscriptService.GetConversation."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.stub = stubs.transcript(peer.channel)

    async def last_sequence(self, namespace: str, conversation_id: uuid.UUID) -> int | None:
        try:
            response = await self.peer.call(
                self.stub.GetConversation,
                transcript_pb.GetConversationRequest(
                    namespace=namespace, conversation_id=str(conversation_id)
                ),
            )
        except DomainError as error:
            if error.code is Code.NOT_FOUND:
                return None
            raise
        return int(response.conversation.last_sequence)
