"""MemoryService's calls: curated memories (written, read, listed, searched, deleted,
forgotten with their source), their revisions, proposals to confirm, and the change feed
of a namespace's memories."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime, timedelta

import grpc

from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold_client.client.connection import PAGE_SIZE, Connection, duration, timestamp
from runifold_client.client.watch import backoff_s, resumable
from runifold_client.errors import from_rpc_error
from runifold_client.policy import Budget

# search_memories' `mode` and what it asks the server for.
_SEARCH_MODES = {
    "": memory_pb.SEARCH_MODE_UNSPECIFIED,
    "dense": memory_pb.SEARCH_MODE_DENSE,
    "lexical": memory_pb.SEARCH_MODE_LEXICAL,
    "hybrid": memory_pb.SEARCH_MODE_HYBRID,
}


def source(
    conversation_id: str = "",
    from_sequence: int = 0,
    through_sequence: int = 0,
    incarnation: int = 0,
    *,
    external_uri: str = "",
) -> memory_pb.MemorySource:
    """A transcript range a memory comes from (both ends inclusive, 1-based). With the
    conversation's `incarnation` (Conversation.incarnation when you read the range), a
    write is refused once that incarnation is erased, even if the id was made again; 0:
    whatever incarnation is current when the write checks its sources.

    Or, with `external_uri` alone, a source outside a Runifold transcript (an MCP
    client's note, a LangGraph store item, a document): an absolute URI such as
    "mcp://notes/42", kept exactly as given; forget_source(external_uri=...) deletes
    what names it."""
    if external_uri:
        if conversation_id or from_sequence or through_sequence or incarnation:
            raise ValueError("a source is a transcript range or an external URI, not both")
        return memory_pb.MemorySource(external_uri=external_uri)
    return memory_pb.MemorySource(
        conversation_id=conversation_id,
        from_sequence=from_sequence,
        through_sequence=through_sequence,
        incarnation=incarnation,
    )


def _confirm(
    namespace: str,
    proposal: memory_pb.MemoryProposal,
    request_id: str | None,
    metadata: Mapping[str, str] | None = None,
) -> memory_pb.UpsertMemoryRequest:
    """The UpsertMemory that stores a proposal (a SUPERSEDE supersedes its memory)."""
    if proposal.action == memory_pb.PROPOSAL_ACTION_DUPLICATE:
        raise ValueError("a DUPLICATE proposal is already stored: there is nothing to confirm")
    supersedes = (
        [memory_pb.SupersededMemory(memory_id=proposal.related_memory_ids[0])]
        if proposal.action == memory_pb.PROPOSAL_ACTION_SUPERSEDE
        else []
    )
    return memory_pb.UpsertMemoryRequest(
        namespace=namespace,
        request_id=request_id or str(uuid.uuid4()),
        content=proposal.content,
        # Unchanged: each names the incarnation it was read from.
        sources=proposal.sources,
        valid_from_time=proposal.valid_from_time,
        supersedes=supersedes,
        metadata=metadata,
    )


class MemoryCalls(Connection):
    """The methods of MemoryService."""

    async def upsert_memory(
        self,
        content: str,
        *,
        sources: Sequence[memory_pb.MemorySource],
        namespace: str | None = None,
        memory_id: str = "",
        expected_revision: int | None = None,
        metadata: Mapping[str, str] | None = None,
        ttl: float | timedelta | None = None,
        expire_time: datetime | None = None,
        request_id: str | None = None,
        valid_from: datetime | None = None,
        valid_until: datetime | None = None,
        supersedes: Sequence[str | memory_pb.SupersededMemory] = (),
    ) -> memory_pb.UpsertMemoryResponse:
        """Create a memory (no `expected_revision`) or replace it by compare-and-swap
        (RevisionConflict). Idempotent by `request_id`, made for you when you pass none.

        `valid_from` / `valid_until`: when the fact became (stops being) true; the
        default is the create time of its earliest source entry, open-ended.
        `supersedes`: memories this one replaces as of its `valid_from` (ids, or
        SupersededMemory with an expected revision), in the same transaction."""
        request = memory_pb.UpsertMemoryRequest(
            namespace=self._ns(namespace),
            memory_id=memory_id,
            request_id=request_id or str(uuid.uuid4()),
            content=content,
            sources=sources,
            metadata=metadata,
            ttl=duration(ttl),
            expire_time=timestamp(expire_time),
            valid_from_time=timestamp(valid_from),
            valid_until_time=timestamp(valid_until),
            supersedes=[
                memory_pb.SupersededMemory(memory_id=s) if isinstance(s, str) else s
                for s in supersedes
            ],
        )
        if expected_revision is not None:
            request.expected_revision = expected_revision
        return await self._call(self.memories.UpsertMemory, request)

    async def remember(
        self,
        content: str,
        *,
        conversation_id: str,
        from_sequence: int,
        through_sequence: int,
        namespace: str | None = None,
        metadata: Mapping[str, str] | None = None,
        request_id: str | None = None,
    ) -> memory_pb.Memory:
        """Curate a fact from one transcript range (idempotent by `request_id`, made for you
        when you pass none, so that a retry stores the fact once)."""
        reply = await self.upsert_memory(
            content,
            sources=[source(conversation_id, from_sequence, through_sequence)],
            namespace=namespace,
            metadata=metadata,
            request_id=request_id,
        )
        return reply.memory

    async def get_memory(self, memory_id: str, *, namespace: str | None = None) -> memory_pb.Memory:
        """One memory."""
        reply = await self._call(
            self.memories.GetMemory,
            memory_pb.GetMemoryRequest(namespace=self._ns(namespace), memory_id=memory_id),
        )
        return reply.memory

    async def list_memories(
        self,
        *,
        namespace: str | None = None,
        conversation_id: str = "",
        page_size: int = PAGE_SIZE,
        metadata_filter: Mapping[str, str] | None = None,
    ) -> AsyncIterator[memory_pb.Memory]:
        """Every memory of a namespace (only those from one conversation when given, only
        those whose metadata holds every pair of `metadata_filter` when given)."""
        pages = self._pages(
            lambda token: self._call(
                self.memories.ListMemories,
                memory_pb.ListMemoriesRequest(
                    namespace=self._ns(namespace),
                    conversation_id=conversation_id,
                    page_size=page_size,
                    page_token=token,
                    metadata_filter=metadata_filter,
                ),
            ),
            lambda page: page.memories,
        )
        async for item in pages:
            yield item

    async def search_memories(
        self,
        query: str,
        *,
        namespace: str | None = None,
        limit: int = 8,
        metadata_filter: Mapping[str, str] | None = None,
        min_score: float = 0.0,
        mode: str = "",
        as_of: datetime | None = None,
    ) -> memory_pb.SearchMemoriesResponse:
        """Search inside one namespace (`limit` 1..256). `mode`: "dense" (the embedding
        model's cosine), "lexical" (BM25 over the words), "hybrid" (both fused), or ""
        (the server's default). `as_of`: only memories valid at that time (default: now)."""
        if mode not in _SEARCH_MODES:
            raise ValueError(f"mode must be one of {', '.join(repr(m) for m in _SEARCH_MODES)}")
        return await self._call(
            self.memories.SearchMemories,
            memory_pb.SearchMemoriesRequest(
                namespace=self._ns(namespace),
                query=query,
                limit=limit,
                metadata_filter=metadata_filter,
                min_score=min_score,
                mode=_SEARCH_MODES[mode],
                as_of_time=timestamp(as_of),
            ),
        )

    async def delete_memory(
        self,
        memory_id: str,
        *,
        namespace: str | None = None,
        expected_revision: int | None = None,
    ) -> bool:
        """Delete a memory (compare-and-swap on its revision when given); False when it
        was already gone."""
        request = memory_pb.DeleteMemoryRequest(namespace=self._ns(namespace), memory_id=memory_id)
        if expected_revision is not None:
            request.expected_revision = expected_revision
        reply = await self._call(self.memories.DeleteMemory, request)
        return reply.deleted

    async def forget_source(
        self,
        conversation_id: str = "",
        *,
        namespace: str | None = None,
        from_sequence: int = 0,
        through_sequence: int = 0,
        incarnation: int = 0,
        external_uri: str = "",
    ) -> int:
        """Delete every memory derived from a conversation (or a range of it), or with
        `external_uri` instead, every memory one of whose sources is that URI (exactly);
        the count. A memory with several sources goes when any one is forgotten."""
        reply = await self._call(
            self.memories.ForgetSource,
            memory_pb.ForgetSourceRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                from_sequence=from_sequence,
                through_sequence=through_sequence,
                incarnation=incarnation,
                external_uri=external_uri,
            ),
        )
        return int(reply.deleted_count)

    async def memory_erasure(
        self, conversation_id: str, incarnation: int, *, namespace: str | None = None
    ) -> memory_pb.MemoryErasure:
        """What the erasure of one incarnation of a conversation erased in MemoryService
        (counts), and `index_complete_time` once the vector index caught up with it."""
        reply = await self._call(
            self.memories.GetMemoryErasure,
            memory_pb.GetMemoryErasureRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                incarnation=incarnation,
            ),
        )
        return reply.erasure

    async def propose_memories(
        self,
        conversation_id: str,
        *,
        from_sequence: int,
        through_sequence: int,
        namespace: str | None = None,
        max_proposals: int = 0,
        budget: Budget | None = None,
        metadata_filter: Mapping[str, str] | None = None,
    ) -> memory_pb.ProposeMemoriesResponse:
        """Proposals of memories from a transcript range; nothing is stored until you
        confirm one (`confirm_proposal`). `metadata_filter`: only stored memories with
        these pairs are matched (and shown to the proposer). Each source names the
        conversation's incarnation: NotFound (CONVERSATION_ERASED) when the conversation
        was erased while the proposals were made."""
        return await self._call(
            self.memories.ProposeMemories,
            memory_pb.ProposeMemoriesRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                from_sequence=from_sequence,
                through_sequence=through_sequence,
                max_proposals=max_proposals,
                budget=(budget or Budget()).to_proto(),
                metadata_filter=metadata_filter,
            ),
        )

    async def confirm_proposal(
        self,
        proposal: memory_pb.MemoryProposal,
        *,
        namespace: str | None = None,
        request_id: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> memory_pb.UpsertMemoryResponse:
        """Store a proposal: UpsertMemory with its content, sources and valid time (and,
        for a SUPERSEDE, superseding its memory). ValueError for a DUPLICATE. The sources
        go unchanged, with the incarnation they name: NotFound (SOURCE_NOT_FOUND) once the
        conversation was erased, even if its id was made again since."""
        return await self._call(
            self.memories.UpsertMemory,
            _confirm(self._ns(namespace), proposal, request_id, metadata),
        )

    async def request_curation(
        self, conversation_id: str, *, namespace: str | None = None
    ) -> memory_pb.RequestCurationResponse:
        """Queue the automatic curation of a conversation: a background job stores the facts
        of the entries after its `curated_through`, each with its exact source range
        (duplicates skipped, changed facts superseded). One waiting job per conversation:
        a repeat returns it (`created` False). ResourceExhausted (CURATION_QUEUE_FULL)
        when the namespace has its most jobs waiting."""
        return await self._call(
            self.memories.RequestCuration,
            memory_pb.RequestCurationRequest(
                namespace=self._ns(namespace), conversation_id=conversation_id
            ),
        )

    async def curation_backlog(
        self, *, namespace: str | None = None
    ) -> memory_pb.GetCurationBacklogResponse:
        """The namespace's curation queue (depth, oldest age, parked and running jobs) and
        what its curation spent this hour (model calls, tokens, memories stored)."""
        return await self._call(
            self.memories.GetCurationBacklog,
            memory_pb.GetCurationBacklogRequest(namespace=self._ns(namespace)),
        )

    async def memory_revisions(
        self, memory_id: str, *, namespace: str | None = None
    ) -> AsyncIterator[memory_pb.MemoryRevision]:
        """Every revision of a memory, oldest first, page by page."""
        pages = self._pages(
            lambda token: self._call(
                self.memories.ListMemoryRevisions,
                memory_pb.ListMemoryRevisionsRequest(
                    namespace=self._ns(namespace), memory_id=memory_id, page_token=token
                ),
            ),
            lambda page: page.revisions,
        )
        async for item in pages:
            yield item

    async def watch_memories(
        self,
        *,
        namespace: str | None = None,
        after_change_sequence: int = 0,
        heartbeat_interval: float | timedelta | None = None,
        resume: bool = True,
        max_backoff: float = 5.0,
    ) -> AsyncIterator[memory_pb.WatchMemoriesResponse]:
        """Follow the memories of a namespace (MemoryService.WatchMemories): every change
        after `after_change_sequence` (`change` events: created, updated, superseded,
        deleted, expired, erased), each once and in the order the changes committed, then
        the changes as they commit, with `heartbeat`s while it is quiet. It has no
        deadline: stop iterating (or cancel) to leave.

        With `resume` (the default) a stream that breaks (UNAVAILABLE: a replica restarted
        or shut down, the network; RESOURCE_EXHAUSTED / WATCHER_TOO_SLOW: this reader fell
        behind) is watched again from the last change sequence received, with backoff:
        nothing is missed and nothing repeats. Other errors are raised (ResourceExhausted /
        WATCHER_LIMIT with its `retry_delay`, InvalidArgument / SEQUENCE_OUT_OF_RANGE for a
        sequence the namespace never reached, ...).
        """
        after, attempt = after_change_sequence, 0
        while True:
            request = memory_pb.WatchMemoriesRequest(
                namespace=self._ns(namespace),
                after_change_sequence=after,
                heartbeat_interval=duration(heartbeat_interval),
            )
            call = self.memories.WatchMemories(request, metadata=self._metadata)
            try:
                async for event in call:
                    if event.WhichOneof("event") == "change":
                        after = event.change.change_sequence
                    else:
                        after = max(after, event.heartbeat.change_sequence)
                        attempt = 0
                    yield event
                return
            except grpc.aio.AioRpcError as error:
                failure = from_rpc_error(error)
                if not (resume and resumable(failure)):
                    raise failure from None
            finally:
                call.cancel()
            await asyncio.sleep(backoff_s(attempt, max_backoff))
            attempt += 1
