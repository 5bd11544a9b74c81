"""MemoryService on the wire: protobuf <-> domain conversion only.

Errors are DomainErrors raised by the domain; the shared interceptor maps
them to status codes with ErrorInfo.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from runifold.memory.v1 import memory_service_pb2 as pb
from runifold.memory.v1 import memory_service_pb2_grpc as pb_grpc
from services.common import convert
from services.common.watch import servicer as watch_wire
from services.memory import metrics
from services.memory.curation.model import CurationJob
from services.memory.model import (
    ExternalSource,
    Memory,
    MemoryErasure,
    RevisionRecord,
    Source,
)
from services.memory.proposals.model import ADD, DUPLICATE, SUPERSEDE, Proposal
from services.memory.service import MemoryService
from services.memory.watch import model as events
from services.memory.watch.service import Feed
from services.memory.writes.inputs import SourceInput, SupersedeInput, ValidityInput

Context = Any  # grpc.aio.ServicerContext; only WatchMemories writes through it

_ACTIONS = {
    ADD: pb.PROPOSAL_ACTION_ADD,
    SUPERSEDE: pb.PROPOSAL_ACTION_SUPERSEDE,
    DUPLICATE: pb.PROPOSAL_ACTION_DUPLICATE,
}
_KINDS = {"write": pb.REVISION_KIND_WRITE, "delete": pb.REVISION_KIND_DELETE}
_MODES_IN = {
    pb.SEARCH_MODE_UNSPECIFIED: "",
    pb.SEARCH_MODE_DENSE: "dense",
    pb.SEARCH_MODE_LEXICAL: "lexical",
    pb.SEARCH_MODE_HYBRID: "hybrid",
}
_MODES_OUT = {name: value for value, name in _MODES_IN.items() if name}


def sources_to_proto(sources: Sequence[Source]) -> list[pb.MemorySource]:
    """The wire form of sources."""
    return [
        pb.MemorySource(external_uri=s.uri)
        if isinstance(s, ExternalSource)
        else pb.MemorySource(
            conversation_id=str(s.conversation_id),
            from_sequence=s.from_sequence,
            through_sequence=s.through_sequence,
            incarnation=s.incarnation,
        )
        for s in sources
    ]


def curation_job_to_proto(job: CurationJob) -> pb.CurationJob:
    """The wire form of a curation job (JobState's values are CurationJobState's)."""
    return pb.CurationJob(
        job_id=str(job.job_id),
        conversation_id=str(job.conversation_id),
        namespace=job.namespace,
        state=pb.CurationJobState.ValueType(int(job.state)),
        attempts=job.attempts,
        create_time=convert.timestamp(job.create_time),
        incarnation=job.incarnation,
        last_error=job.last_error,
    )


def erasure_to_proto(erasure: MemoryErasure) -> pb.MemoryErasure:
    """The wire form of an erasure's counts."""
    return pb.MemoryErasure(
        conversation_id=str(erasure.conversation_id),
        incarnation=erasure.incarnation,
        memories_deleted=erasure.memories_deleted,
        revisions_erased=erasure.revisions_erased,
        index_points=erasure.index_points,
        erase_time=convert.timestamp(erasure.erase_time),
        index_complete_time=convert.timestamp(erasure.index_complete_time),
    )


def _time(request: Any, field: str, reason: str) -> datetime | None:
    """An optional timestamp of a request (None when absent)."""
    if not request.HasField(field):
        return None
    stamp: Timestamp = getattr(request, field)
    return convert.datetime_from_request(stamp, field, reason)


def memory_to_proto(memory: Memory) -> pb.Memory:
    """The wire form of a memory."""
    return pb.Memory(
        memory_id=str(memory.memory_id),
        namespace=memory.namespace,
        content=memory.content,
        sources=sources_to_proto(memory.sources),
        metadata=dict(memory.metadata),
        revision=memory.revision,
        create_time=convert.timestamp(memory.create_time),
        update_time=convert.timestamp(memory.update_time),
        expire_time=convert.timestamp(memory.expire_time),
        embedding_model=memory.embedding_model,
        embedding_dimension=memory.embedding_dimension,
        valid_from_time=convert.timestamp(memory.valid_from_time or memory.create_time),
        valid_until_time=convert.timestamp(memory.valid_until_time),
        superseded_by=str(memory.superseded_by) if memory.superseded_by else "",
    )


def revision_to_proto(record: RevisionRecord) -> pb.MemoryRevision:
    """The wire form of one revision of a memory's history."""
    return pb.MemoryRevision(
        revision=record.revision,
        kind=_KINDS.get(record.kind, pb.REVISION_KIND_UNSPECIFIED),
        reason=record.reason,
        record_time=convert.timestamp(record.recorded_at),
        erased=record.erased,
        content=record.content or "",
        sources=sources_to_proto(record.sources),
        metadata=dict(record.metadata),
        expire_time=convert.timestamp(record.expire_time),
        valid_from_time=convert.timestamp(record.valid_from_time),
        valid_until_time=convert.timestamp(record.valid_until_time),
        superseded_by=str(record.superseded_by) if record.superseded_by else "",
    )


def proposal_to_proto(proposal: Proposal) -> pb.MemoryProposal:
    """The wire form of a proposal."""
    return pb.MemoryProposal(
        content=proposal.content,
        sources=sources_to_proto(proposal.sources),
        valid_from_time=convert.timestamp(proposal.valid_from_time),
        action=_ACTIONS[proposal.action],
        related_memory_ids=[str(m) for m in proposal.related_memory_ids],
        reason=proposal.reason,
    )


def watch_event_to_proto(event: events.WatchEvent) -> pb.WatchMemoriesResponse:
    """The wire form of one WatchMemories event."""
    if isinstance(event, events.Changed):
        return pb.WatchMemoriesResponse(
            change=pb.MemoryEvent(
                change_sequence=event.change_sequence,
                # The same numbers (events.ChangeKind mirrors MemoryEventKind).
                kind=pb.MemoryEventKind.ValueType(event.kind.value),
                memory_id=str(event.memory_id),
                revision=event.revision,
                memory=memory_to_proto(event.memory) if event.memory is not None else None,
                change_time=convert.timestamp(event.change_time),
            )
        )
    return pb.WatchMemoriesResponse(
        heartbeat=pb.MemoryHeartbeat(
            change_sequence=event.change_sequence, read_time=convert.timestamp(event.read_time)
        )
    )


class MemoryServicer(pb_grpc.MemoryServiceServicer):
    """gRPC adapter of the memory domain service."""

    def __init__(self, service: MemoryService, feed: Feed) -> None:
        self.service = service
        self.feed = feed

    async def UpsertMemory(
        self, request: pb.UpsertMemoryRequest, context: Context
    ) -> pb.UpsertMemoryResponse:
        validity = ValidityInput(
            _time(request, "valid_from_time", "INVALID_VALIDITY"),
            _time(request, "valid_until_time", "INVALID_VALIDITY"),
            [
                SupersedeInput(
                    s.memory_id,
                    s.expected_revision if s.HasField("expected_revision") else None,
                )
                for s in request.supersedes
            ],
        )
        result = await self.service.upsert(
            request.namespace,
            request.memory_id,
            request.content,
            [
                SourceInput(
                    s.conversation_id,
                    s.from_sequence,
                    s.through_sequence,
                    s.incarnation,
                    s.external_uri,
                )
                for s in request.sources
            ],
            dict(request.metadata),
            request.expected_revision if request.HasField("expected_revision") else None,
            convert.datetime_from_request(request.expire_time, "expire_time", "INVALID_EXPIRY")
            if request.HasField("expire_time")
            else None,
            convert.timedelta_from_request(request.ttl, "ttl", "INVALID_EXPIRY")
            if request.HasField("ttl")
            else None,
            request.request_id,
            validity,
        )
        return pb.UpsertMemoryResponse(
            memory=memory_to_proto(result.memory),
            created=result.created,
            superseded=[memory_to_proto(m) for m in result.superseded],
        )

    async def GetMemory(
        self, request: pb.GetMemoryRequest, context: Context
    ) -> pb.GetMemoryResponse:
        memory = await self.service.get(request.namespace, request.memory_id)
        return pb.GetMemoryResponse(memory=memory_to_proto(memory))

    async def ListMemories(
        self, request: pb.ListMemoriesRequest, context: Context
    ) -> pb.ListMemoriesResponse:
        page = await self.service.list_memories(
            request.namespace,
            request.page_size,
            request.page_token,
            request.conversation_id,
            _time(request, "as_of_time", "INVALID_VALIDITY"),
            request.ignore_validity,
            dict(request.metadata_filter),
        )
        return pb.ListMemoriesResponse(
            memories=[memory_to_proto(m) for m in page.memories],
            next_page_token=page.next_page_token,
        )

    async def SearchMemories(
        self, request: pb.SearchMemoriesRequest, context: Context
    ) -> pb.SearchMemoriesResponse:
        result = await self.service.search(
            request.namespace,
            request.query,
            request.limit,
            dict(request.metadata_filter),
            request.min_score,
            _time(request, "as_of_time", "INVALID_VALIDITY"),
            # An unknown number stays a number: the service refuses it.
            mode=_MODES_IN.get(request.mode, str(request.mode)),
        )
        return pb.SearchMemoriesResponse(
            results=[
                pb.ScoredMemory(
                    memory=memory_to_proto(hit.memory),
                    score=hit.score,
                    dense_score=hit.dense,
                    lexical_score=hit.lexical,
                )
                for hit in result.hits
            ],
            degraded=result.degraded,
            mode=_MODES_OUT.get(result.mode, pb.SEARCH_MODE_UNSPECIFIED),
        )

    async def DeleteMemory(
        self, request: pb.DeleteMemoryRequest, context: Context
    ) -> pb.DeleteMemoryResponse:
        deleted = await self.service.delete(
            request.namespace,
            request.memory_id,
            request.expected_revision if request.HasField("expected_revision") else None,
        )
        return pb.DeleteMemoryResponse(deleted=deleted)

    async def ForgetSource(
        self, request: pb.ForgetSourceRequest, context: Context
    ) -> pb.ForgetSourceResponse:
        forgotten = await self.service.forget_source(
            request.namespace,
            request.conversation_id,
            request.from_sequence,
            request.through_sequence,
            request.incarnation,
            request.external_uri,
        )
        return pb.ForgetSourceResponse(
            deleted_count=forgotten.deleted,
            erasure=erasure_to_proto(forgotten.erasure) if forgotten.erasure else None,
        )

    async def ListMemoryRevisions(
        self, request: pb.ListMemoryRevisionsRequest, context: Context
    ) -> pb.ListMemoryRevisionsResponse:
        page = await self.service.list_revisions(
            request.namespace, request.memory_id, request.page_size, request.page_token
        )
        return pb.ListMemoryRevisionsResponse(
            revisions=[revision_to_proto(r) for r in page.revisions],
            next_page_token=page.next_page_token,
        )

    async def ProposeMemories(
        self, request: pb.ProposeMemoriesRequest, context: Context
    ) -> pb.ProposeMemoriesResponse:
        result = await self.service.propose(
            request.namespace,
            request.conversation_id,
            request.from_sequence,
            request.through_sequence,
            convert.budget_from_proto(request.budget),
            request.max_proposals,
            dict(request.metadata_filter),
        )
        return pb.ProposeMemoriesResponse(
            proposals=[proposal_to_proto(p) for p in result.proposals],
            usage=convert.usage_to_proto(result.usage),
            dropped_count=result.dropped,
            proposer=result.proposer,
        )

    async def RequestCuration(
        self, request: pb.RequestCurationRequest, context: Context
    ) -> pb.RequestCurationResponse:
        job, created = await self.service.request_curation(
            request.namespace, request.conversation_id
        )
        return pb.RequestCurationResponse(job=curation_job_to_proto(job), created=created)

    async def GetCurationBacklog(
        self, request: pb.GetCurationBacklogRequest, context: Context
    ) -> pb.GetCurationBacklogResponse:
        backlog = await self.service.curation_backlog(request.namespace)
        age = Duration()
        age.FromNanoseconds(int(backlog.oldest_pending_age_s * 1e9))
        return pb.GetCurationBacklogResponse(
            depth=backlog.depth,
            oldest_pending_age=age,
            failed_count=backlog.failed_count,
            running_count=backlog.running_count,
            model_calls_this_hour=backlog.model_calls_this_hour,
            tokens_this_hour=backlog.tokens_this_hour,
            facts_this_hour=backlog.facts_this_hour,
        )

    async def GetMemoryErasure(
        self, request: pb.GetMemoryErasureRequest, context: Context
    ) -> pb.GetMemoryErasureResponse:
        erasure = await self.service.erasure(
            request.namespace, request.conversation_id, request.incarnation
        )
        return pb.GetMemoryErasureResponse(erasure=erasure_to_proto(erasure))

    # A coroutine that writes through the context (grpc.aio serves both forms), so that
    # each write can time out; the stubs know only the generator form.
    async def WatchMemories(  # type: ignore[override]
        self, request: pb.WatchMemoriesRequest, context: Context
    ) -> None:
        stream = self.feed.watch(
            request.namespace,
            request.after_change_sequence,
            watch_wire.heartbeat_s(request),
            # What the stream holds is given back when the call has ended: a cut stream's
            # last event stays in the transport until then.
            until_done=lambda release: context.add_done_callback(lambda _: release()),
        )
        await watch_wire.write_stream(
            context,
            stream,
            watch_event_to_proto,
            self.feed.limits.send_timeout_s,
            events.watcher_too_slow,
            metrics.WATCH_STREAMS_CUT,
        )
