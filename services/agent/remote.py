"""The orchestrator's ports, implemented over gRPC (proto <-> domain only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, timedelta

from google.protobuf.duration_pb2 import Duration

from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.agent.model import (
    AppendState,
    EndedState,
    LeaseState,
    MemoryErasure,
    PriorAppend,
    Recall,
    Recalled,
    Receipt,
    Summarized,
    SummaryErasure,
    SummaryState,
    TranscriptDeletion,
    ViewState,
)
from services.common import convert, stubs
from services.common.channels import Peer
from services.common.domain import Budget, Entry, Message, Usage
from services.common.errors import DomainError, VersionConflict
from services.common.pagination import MAX_PAGE_SIZE


def _receipt(receipt: transcript_pb.ErasureReceipt) -> Receipt:
    return Receipt(
        receipt_id=receipt.receipt_id,
        namespace=receipt.namespace,
        conversation_id=receipt.conversation_id,
        incarnation=receipt.incarnation,
        counts=dict(receipt.counts),
        remaining=list(receipt.remaining),
        create_time=receipt.create_time.ToDatetime(UTC),
        complete_time=receipt.complete_time.ToDatetime(UTC)
        if receipt.HasField("complete_time")
        else None,
    )


def _memory_erasure(deleted: int, erasure: memory_pb.MemoryErasure | None) -> MemoryErasure:
    if erasure is None:  # no tombstone (incarnation 0): this call's deletions only
        return MemoryErasure(deleted, deleted, 0, deleted, False)
    return MemoryErasure(
        deleted,
        erasure.memories_deleted,
        erasure.revisions_erased,
        erasure.index_points,
        erasure.HasField("index_complete_time"),
    )


def _duration(seconds: float) -> Duration:
    value = Duration()
    value.FromTimedelta(timedelta(seconds=seconds))
    return value


def _prior(record: transcript_pb.AppendRecord) -> PriorAppend:
    return PriorAppend(
        record.version,
        record.first_sequence,
        record.last_sequence,
        convert.usage_from_proto(record.usage),
    )


def _summary(pb: summary_pb.Summary | None) -> SummaryState:
    if pb is None:
        return SummaryState()
    return SummaryState(pb.text, pb.through_sequence)


class GrpcTranscripts:
    """Transcripts port over TranscriptService."""

    def __init__(self, peer: Peer, *, wait_s: float = 600.0) -> None:
        self.peer = peer
        self.stub = stubs.transcript(peer.channel)
        self.wait_s = wait_s

    async def create_conversation(self, namespace: str, conversation_id: str) -> tuple[str, bool]:
        reply = await self.peer.call(
            self.stub.CreateConversation,
            transcript_pb.CreateConversationRequest(
                namespace=namespace, conversation_id=conversation_id
            ),
        )
        return reply.conversation.conversation_id, reply.created

    async def load_view(
        self,
        namespace: str,
        conversation_id: str,
        window: int,
        summary_batch: int,
        summarized_through: int,
        request_id: str,
    ) -> ViewState:
        reply = await self.peer.call(
            self.stub.LoadView,
            transcript_pb.LoadViewRequest(
                namespace=namespace,
                conversation_id=conversation_id,
                window=window,
                summary_batch=summary_batch,
                summarized_through=summarized_through,
                request_id=request_id,
            ),
        )
        prior = _prior(reply.prior_append) if reply.HasField("prior_append") else None
        return ViewState(
            version=reply.version,
            window=[convert.entry_from_proto(e) for e in reply.window],
            summary_buffer=[convert.entry_from_proto(e) for e in reply.summary_buffer],
            summary_backlog=reply.summary_backlog,
            prior_append=prior,
        )

    async def append(
        self,
        namespace: str,
        conversation_id: str,
        expected_version: int,
        messages: Sequence[Message],
        request_id: str,
        usage: Usage,
        fencing_token: int | None = None,
    ) -> AppendState:
        try:
            reply = await self.peer.call(
                self.stub.AppendEntries,
                transcript_pb.AppendEntriesRequest(
                    namespace=namespace,
                    conversation_id=conversation_id,
                    expected_version=expected_version,
                    messages=[convert.message_to_proto(m) for m in messages],
                    request_id=request_id,
                    usage=convert.usage_to_proto(usage),
                    fencing_token=fencing_token,
                ),
            )
        except DomainError as error:
            if error.reason == "VERSION_CONFLICT":
                current = int(error.metadata.get("current_version", "0"))
                raise VersionConflict(current, expected_version) from None
            raise
        return AppendState(reply.version, reply.first_sequence, reply.last_sequence, reply.replayed)

    async def acquire_lease(
        self,
        namespace: str,
        conversation_id: str,
        turn_id: str,
        mode: int,
        ttl_s: float,
        payload_hash: bytes,
        create_if_missing: bool,
    ) -> LeaseState | PriorAppend | EndedState:
        reply = await self.peer.call(
            self.stub.AcquireTurnLease,
            transcript_pb.AcquireTurnLeaseRequest(
                namespace=namespace,
                conversation_id=conversation_id,
                turn_id=turn_id,
                mode=mode,  # type: ignore[arg-type]
                ttl=_duration(ttl_s),
                payload_hash=payload_hash,
                create_if_missing=create_if_missing,
            ),
            # A queued turn waits within the caller's deadline, not a peer timeout.
            seconds=self.wait_s,
        )
        if reply.HasField("committed"):
            return _prior(reply.committed)
        if reply.HasField("ended"):
            ended = reply.ended
            return EndedState(
                tuple(convert.messages_from_proto(ended.output, "ended.output")),
                convert.usage_from_proto(ended.usage),
                ended.reason,
                dict(ended.metadata),
            )
        return LeaseState(reply.lease.fencing_token, reply.lease.created)

    async def renew_lease(
        self,
        namespace: str,
        conversation_id: str,
        turn_id: str,
        fencing_token: int,
        ttl_s: float,
        calling_model: bool = False,
    ) -> None:
        await self.peer.call(
            self.stub.RenewTurnLease,
            transcript_pb.RenewTurnLeaseRequest(
                namespace=namespace,
                conversation_id=conversation_id,
                turn_id=turn_id,
                fencing_token=fencing_token,
                ttl=_duration(ttl_s),
                calling_model=calling_model,
            ),
        )

    async def release_lease(
        self,
        namespace: str,
        conversation_id: str,
        turn_id: str,
        fencing_token: int,
        ended: EndedState | None,
        model_call_failed: bool = False,
    ) -> bool:
        reply = await self.peer.call(
            self.stub.ReleaseTurnLease,
            transcript_pb.ReleaseTurnLeaseRequest(
                namespace=namespace,
                conversation_id=conversation_id,
                turn_id=turn_id,
                fencing_token=fencing_token,
                model_call_failed=model_call_failed,
                ended=transcript_pb.EndedTurn(
                    output=[convert.message_to_proto(m) for m in ended.output],
                    usage=convert.usage_to_proto(ended.usage),
                    reason=ended.reason,
                    metadata=dict(ended.metadata),
                )
                if ended is not None
                else None,
            ),
        )
        return reply.released

    async def entries(
        self, namespace: str, conversation_id: str, first: int, last: int
    ) -> list[Entry]:
        found: list[Entry] = []
        token = ""
        while True:
            reply = await self.peer.call(
                self.stub.ListEntries,
                transcript_pb.ListEntriesRequest(
                    namespace=namespace,
                    conversation_id=conversation_id,
                    after_sequence=first - 1,
                    through_sequence=last,
                    page_size=1000,
                    page_token=token,
                ),
            )
            found.extend(convert.entry_from_proto(e) for e in reply.entries)
            token = reply.next_page_token
            if not token:
                return found

    async def incarnation(self, namespace: str, conversation_id: str) -> int | None:
        try:
            reply = await self.peer.call(
                self.stub.GetConversation,
                transcript_pb.GetConversationRequest(
                    namespace=namespace, conversation_id=conversation_id
                ),
            )
        except DomainError as error:
            if error.reason == "CONVERSATION_NOT_FOUND":
                return None
            raise
        return int(reply.conversation.incarnation)

    async def forks(self, namespace: str, conversation_id: str) -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        token = ""
        while True:
            reply = await self.peer.call(
                self.stub.ListForks,
                transcript_pb.ListForksRequest(
                    namespace=namespace,
                    conversation_id=conversation_id,
                    page_size=MAX_PAGE_SIZE,
                    page_token=token,
                ),
            )
            found.extend((fork.conversation_id, int(fork.incarnation)) for fork in reply.forks)
            token = reply.next_page_token
            if not token:
                return found

    async def delete_conversation(
        self,
        namespace: str,
        conversation_id: str,
        incarnation: int,
        counts: Mapping[str, int] | None = None,
        remaining: Sequence[str] = (),
        erased_forks: Sequence[tuple[str, int]] | None = None,
    ) -> TranscriptDeletion:
        reply = await self.peer.call(
            self.stub.DeleteConversation,
            transcript_pb.DeleteConversationRequest(
                namespace=namespace,
                conversation_id=conversation_id,
                incarnation=incarnation,
                receipt=transcript_pb.ErasureProgress(counts=counts, remaining=remaining)
                if counts is not None
                else None,
                erased_forks=transcript_pb.ErasedForks(
                    forks=[
                        transcript_pb.ForkRef(conversation_id=fork_id, incarnation=fork_incarnation)
                        for fork_id, fork_incarnation in erased_forks
                    ]
                )
                if erased_forks is not None
                else None,
            ),
        )
        return TranscriptDeletion(
            int(reply.entries_deleted),
            int(reply.appends_deleted),
            _receipt(reply.receipt) if reply.HasField("receipt") else None,
        )

    async def record_receipt(
        self,
        namespace: str,
        conversation_id: str,
        incarnation: int,
        counts: Mapping[str, int],
        remaining: Sequence[str],
    ) -> Receipt | None:
        try:
            reply = await self.peer.call(
                self.stub.RecordErasureReceipt,
                transcript_pb.RecordErasureReceiptRequest(
                    namespace=namespace,
                    conversation_id=conversation_id,
                    incarnation=incarnation,
                    progress=transcript_pb.ErasureProgress(counts=counts, remaining=remaining),
                ),
            )
        except DomainError as error:
            if error.reason == "CONVERSATION_NOT_FOUND":
                return None
            raise
        return _receipt(reply.receipt)

    async def get_receipt(
        self, namespace: str, receipt_id: str, conversation_id: str = ""
    ) -> Receipt | None:
        try:
            reply = await self.peer.call(
                self.stub.GetErasureReceipt,
                transcript_pb.GetErasureReceiptRequest(
                    namespace=namespace, receipt_id=receipt_id, conversation_id=conversation_id
                ),
            )
        except DomainError as error:
            if error.reason == "ERASURE_RECEIPT_NOT_FOUND":
                return None
            raise
        return _receipt(reply.receipt)


class GrpcSummaries:
    """Summaries port over SummaryService."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.stub = stubs.summary(peer.channel)

    async def get(self, namespace: str, conversation_id: str) -> SummaryState:
        reply = await self.peer.call(
            self.stub.GetSummary,
            summary_pb.GetSummaryRequest(namespace=namespace, conversation_id=conversation_id),
        )
        return _summary(reply.summary if reply.HasField("summary") else None)

    async def summarize(
        self,
        namespace: str,
        conversation_id: str,
        window: int,
        summary_batch: int,
        max_passes: int,
        budget: Budget,
    ) -> Summarized:
        reply = await self.peer.call(
            self.stub.Summarize,
            summary_pb.SummarizeRequest(
                namespace=namespace,
                conversation_id=conversation_id,
                window=window,
                summary_batch=summary_batch,
                max_summary_passes=max_passes,
                budget=common_pb2.Budget(
                    max_output_tokens=budget.max_output_tokens,
                    max_model_calls=budget.max_model_calls,
                    max_input_tokens=budget.max_input_tokens,
                ),
            ),
        )
        return Summarized(
            summary=_summary(reply.summary if reply.HasField("summary") else None),
            passes=reply.passes,
            usage=convert.usage_from_proto(reply.usage),
        )

    async def request(
        self, namespace: str, conversation_id: str, window: int, summary_batch: int
    ) -> str:
        reply = await self.peer.call(
            self.stub.RequestSummary,
            summary_pb.RequestSummaryRequest(
                namespace=namespace,
                conversation_id=conversation_id,
                window=window,
                summary_batch=summary_batch,
            ),
        )
        return reply.job.job_id

    async def erase(self, namespace: str, conversation_id: str, incarnation: int) -> SummaryErasure:
        reply = await self.peer.call(
            self.stub.EraseSummaries,
            summary_pb.EraseSummariesRequest(
                namespace=namespace, conversation_id=conversation_id, incarnation=incarnation
            ),
        )
        return SummaryErasure(int(reply.erased), reply.summaries_erased, reply.jobs_erased)


class GrpcMemories:
    """Memories port over MemoryService."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.stub = stubs.memory(peer.channel)

    async def search(self, namespace: str, query: str, limit: int) -> Recall:
        reply = await self.peer.call(
            self.stub.SearchMemories,
            memory_pb.SearchMemoriesRequest(namespace=namespace, query=query, limit=limit),
        )
        return Recall(
            memories=[
                Recalled(hit.memory.memory_id, hit.memory.content, hit.score)
                for hit in reply.results
            ],
            degraded=reply.degraded,
        )

    async def forget_conversation(
        self, namespace: str, conversation_id: str, incarnation: int
    ) -> MemoryErasure:
        reply = await self.peer.call(
            self.stub.ForgetSource,
            memory_pb.ForgetSourceRequest(
                namespace=namespace, conversation_id=conversation_id, incarnation=incarnation
            ),
        )
        return _memory_erasure(
            int(reply.deleted_count), reply.erasure if reply.HasField("erasure") else None
        )

    async def erasure(
        self, namespace: str, conversation_id: str, incarnation: int
    ) -> MemoryErasure | None:
        try:
            reply = await self.peer.call(
                self.stub.GetMemoryErasure,
                memory_pb.GetMemoryErasureRequest(
                    namespace=namespace, conversation_id=conversation_id, incarnation=incarnation
                ),
            )
        except DomainError as error:
            if error.reason == "ERASURE_NOT_FOUND":
                return None
            raise
        return _memory_erasure(0, reply.erasure)

    async def request_curation(self, namespace: str, conversation_id: str) -> None:
        await self.peer.call(
            self.stub.RequestCuration,
            memory_pb.RequestCurationRequest(namespace=namespace, conversation_id=conversation_id),
        )
