"""TranscriptService as the memory service reads it: over gRPC, through a Peer (never its
tables)."""

from __future__ import annotations

import uuid

from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common import stubs
from services.common.errors import Code, DomainError
from services.common.peers import Peer
from services.memory.model import SourceConversation


class TranscriptSources:
    """SourceChecker that asks TranscriptService.GetConversation."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.stub = stubs.transcript(peer.channel)

    async def conversation(
        self, namespace: str, conversation_id: uuid.UUID
    ) -> SourceConversation | None:
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
        found = response.conversation
        return SourceConversation(found.last_sequence, found.incarnation)
