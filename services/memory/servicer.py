"""MemoryService on the wire: protobuf <-> domain conversion only.

Errors are DomainErrors raised by the domain; the shared interceptor maps
them to status codes with ErrorInfo.
"""

from __future__ import annotations

from typing import Any

from runifold.memory.v1 import memory_service_pb2 as pb
from runifold.memory.v1 import memory_service_pb2_grpc as pb_grpc
from services.common import convert
from services.memory.inputs import SourceInput
from services.memory.model import Memory
from services.memory.service import MemoryService

Context = Any  # grpc.aio.ServicerContext; unused by these handlers


def memory_to_proto(memory: Memory) -> pb.Memory:
    """The wire form of a memory."""
    return pb.Memory(
        memory_id=str(memory.memory_id),
        namespace=memory.namespace,
        content=memory.content,
        sources=[
            pb.MemorySource(
                conversation_id=str(s.conversation_id),
                from_sequence=s.from_sequence,
                through_sequence=s.through_sequence,
            )
            for s in memory.sources
        ],
        metadata=dict(memory.metadata),
        revision=memory.revision,
        create_time=convert.timestamp(memory.create_time),
        update_time=convert.timestamp(memory.update_time),
        expire_time=convert.timestamp(memory.expire_time),
        embedding_model=memory.embedding_model,
        embedding_dimension=memory.embedding_dimension,
    )


class MemoryServicer(pb_grpc.MemoryServiceServicer):
    """gRPC adapter of the memory domain service."""

    def __init__(self, service: MemoryService) -> None:
        self.service = service

    async def UpsertMemory(
        self, request: pb.UpsertMemoryRequest, context: Context
    ) -> pb.UpsertMemoryResponse:
        memory, created = await self.service.upsert(
            request.namespace,
            request.memory_id,
            request.content,
            [
                SourceInput(s.conversation_id, s.from_sequence, s.through_sequence)
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
        )
        return pb.UpsertMemoryResponse(memory=memory_to_proto(memory), created=created)

    async def GetMemory(
        self, request: pb.GetMemoryRequest, context: Context
    ) -> pb.GetMemoryResponse:
        memory = await self.service.get(request.namespace, request.memory_id)
        return pb.GetMemoryResponse(memory=memory_to_proto(memory))

    async def ListMemories(
        self, request: pb.ListMemoriesRequest, context: Context
    ) -> pb.ListMemoriesResponse:
        page = await self.service.list_memories(
            request.namespace, request.page_size, request.page_token, request.conversation_id
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
        )
        return pb.SearchMemoriesResponse(
            results=[
                pb.ScoredMemory(memory=memory_to_proto(hit.memory), score=hit.score)
                for hit in result.hits
            ],
            degraded=result.degraded,
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
        count = await self.service.forget_source(
            request.namespace,
            request.conversation_id,
            request.from_sequence,
            request.through_sequence,
            request.incarnation,
        )
        return pb.ForgetSourceResponse(deleted_count=count)
