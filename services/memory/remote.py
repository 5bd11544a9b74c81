"""TranscriptService as the memory service reads it: over gRPC, through a Peer (never its
tables)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common import convert, stubs
from services.common.channels import Peer
from services.common.domain import Entry
from services.common.errors import Code, DomainError
from services.memory.model import SourceConversation

# ListEntries' largest page.
_PAGE = 1000


class TranscriptSources:
    """SourceChecker that asks TranscriptService.GetConversation and ListEntries."""

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
        return SourceConversation(
            found.last_sequence,
            found.incarnation,
            found.version,
            found.curated_through,
            found.user_id or None,
        )

    async def entries(
        self, namespace: str, conversation_id: uuid.UUID, from_sequence: int, through_sequence: int
    ) -> Sequence[Entry]:
        found: list[Entry] = []
        after = from_sequence - 1
        while after < through_sequence:
            try:
                response = await self.peer.call(
                    self.stub.ListEntries,
                    transcript_pb.ListEntriesRequest(
                        namespace=namespace,
                        conversation_id=str(conversation_id),
                        after_sequence=after,
                        through_sequence=through_sequence,
                        page_size=min(_PAGE, through_sequence - after),
                    ),
                )
            except DomainError as error:
                if error.code is Code.NOT_FOUND:
                    return []
                raise
            if not response.entries:
                break
            found += [convert.entry_from_proto(e) for e in response.entries]
            after = found[-1].sequence
        return found

    async def mark_curated(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int, curated_through: int
    ) -> None:
        await self.peer.call(
            self.stub.MarkCurated,
            transcript_pb.MarkCuratedRequest(
                namespace=namespace,
                conversation_id=str(conversation_id),
                incarnation=incarnation,
                curated_through=curated_through,
            ),
        )

    async def retracted(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        after_version: int,
        through_sequence: int,
    ) -> list[int]:
        found: list[int] = []
        token = ""
        while True:
            try:
                response = await self.peer.call(
                    self.stub.ListEntries,
                    transcript_pb.ListEntriesRequest(
                        namespace=namespace,
                        conversation_id=str(conversation_id),
                        through_sequence=through_sequence,
                        retracted_after_version=after_version,
                        page_size=_PAGE,
                        page_token=token,
                    ),
                )
            except DomainError as error:
                if error.code is Code.NOT_FOUND:
                    return []
                raise
            found += [e.sequence for e in response.entries]
            token = response.next_page_token
            if not token:
                return found
