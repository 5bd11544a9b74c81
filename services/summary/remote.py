"""TranscriptService as the summary service reads it: over gRPC, through a Peer.

SummaryService never reads the transcript tables: every entry and counter it
sees comes from TranscriptService's API (GetConversation, ListEntries,
LoadView), under the propagated deadline, with the peer's errors mapped
(services.common.channels).
"""

from __future__ import annotations

import uuid

from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import convert, stubs
from services.common.channels import Peer
from services.common.domain import Entry
from services.summary.model import ConversationState, TranscriptView


class GrpcTranscripts:
    """The Transcripts port of the summary domain, over TranscriptService's gRPC API."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.stub = stubs.transcript(peer.channel)

    async def conversation(self, namespace: str, conversation_id: uuid.UUID) -> ConversationState:
        response = await self.peer.call(
            self.stub.GetConversation,
            pb.GetConversationRequest(conversation_id=str(conversation_id), namespace=namespace),
        )
        conversation = response.conversation
        origin = conversation.fork_origin if conversation.HasField("fork_origin") else None
        return ConversationState(
            conversation.last_sequence,
            conversation.incarnation,
            uuid.UUID(origin.conversation_id) if origin is not None else None,
            origin.through_sequence if origin is not None else 0,
        )

    async def entry_after(
        self, namespace: str, conversation_id: uuid.UUID, sequence: int
    ) -> Entry | None:
        response = await self.peer.call(
            self.stub.ListEntries,
            pb.ListEntriesRequest(
                conversation_id=str(conversation_id),
                namespace=namespace,
                after_sequence=sequence,
                page_size=1,
            ),
        )
        return convert.entry_from_proto(response.entries[0]) if response.entries else None

    async def load_view(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        window: int,
        summary_batch: int,
        summarized_through: int,
    ) -> TranscriptView:
        response = await self.peer.call(
            self.stub.LoadView,
            pb.LoadViewRequest(
                conversation_id=str(conversation_id),
                namespace=namespace,
                window=window,
                summary_batch=summary_batch,
                summarized_through=summarized_through,
            ),
        )
        return TranscriptView(
            [convert.entry_from_proto(e) for e in response.summary_buffer],
            response.summary_backlog,
            response.incarnation,
        )
