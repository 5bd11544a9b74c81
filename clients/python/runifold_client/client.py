"""Python clients of the Runifold services: `AsyncClient` (grpc.aio) and `Client` (blocking).

Both speak to one address (the all-in-one server, or a gateway in front of
the services), give every call a deadline, and make writes safe to retry:
`run_conversation` sends a `turn_id`, `append` and `remember` a `request_id`,
`create_conversation` a conversation id (made for you when you pass none), so
a retry after a lost answer returns the first result instead of writing
twice. Retries are gRPC's own (a service-config `retryPolicy`: UNAVAILABLE
only, exponential backoff, within the call's deadline), on every method but
Summarize, whose passes would spend model calls again.
"""

from __future__ import annotations

import enum
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.agent.v1 import agent_service_pb2_grpc as agent_grpc
from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.memory.v1 import memory_service_pb2_grpc as memory_grpc
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.summary.v1 import summary_service_pb2_grpc as summary_grpc
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold.transcript.v1 import transcript_service_pb2_grpc as transcript_grpc
from runifold_client.errors import Outcome, from_rpc_error
from runifold_client.policy import (
    Budget,
    ConversationContextPolicy,
    InputLike,
    Tool,
    messages,
)

DEFAULT_TARGET = "127.0.0.1:50051"
Response = TypeVar("Response")

# The one method a retry is not safe for: its passes would spend model calls again.
_NOT_RETRIED = {("runifold.summary.v1.SummaryService", "Summarize")}
_SERVICES = (
    agent_pb.DESCRIPTOR.services_by_name["AgentService"],
    transcript_pb.DESCRIPTOR.services_by_name["TranscriptService"],
    summary_pb.DESCRIPTOR.services_by_name["SummaryService"],
    memory_pb.DESCRIPTOR.services_by_name["MemoryService"],
)


class ConcurrencyMode(enum.IntEnum):
    """How a turn shares its conversation with other turns (runifold.agent.v1.ConcurrencyMode).

    RACE: turns run side by side, the first to commit wins (the others get TurnConflict).
    REJECT: a turn that finds another running fails at once with ConversationBusy.
    ENQUEUE: a turn waits for the turns ahead of it, then runs on what they committed.
    """

    RACE = agent_pb.CONCURRENCY_MODE_RACE
    REJECT = agent_pb.CONCURRENCY_MODE_REJECT
    ENQUEUE = agent_pb.CONCURRENCY_MODE_ENQUEUE


def channel_options(max_attempts: int) -> list[tuple[str, Any]]:
    """gRPC channel options: its retry policy for every method but Summarize.

    gRPC retries only UNAVAILABLE (the call never reached a server, or a store was
    down), at most `max_attempts` (2..5) attempts in all, within the call's deadline.
    """
    if max_attempts < 2:
        return [("grpc.enable_retries", 0)]
    names = [
        {"service": service.full_name, "method": method.name}
        for service in _SERVICES
        for method in service.methods
        if (service.full_name, method.name) not in _NOT_RETRIED
    ]
    config = {
        "methodConfig": [
            {
                "name": names,
                "retryPolicy": {
                    "maxAttempts": min(max_attempts, 5),
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
    return [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))]


def new_conversation_id() -> str:
    """A UUIDv7 (RFC 9562): time-ordered like the ids the server makes, and made here so
    that a retried CreateConversation names the same conversation."""
    millis = time.time_ns() // 1_000_000
    value = (millis & (2**48 - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return str(uuid.UUID(int=value))


@dataclass(frozen=True)
class TurnResult:
    """A committed turn."""

    conversation_id: str
    version: int
    first_sequence: int
    last_sequence: int
    outcome: Outcome
    tool_calls: list[common_pb2.ToolCall] = field(default_factory=list)
    context: agent_pb.ContextReport | None = None
    replayed: bool = False
    created: bool = False

    @property
    def text(self) -> str:
        """The model's answer text."""
        return self.outcome.text

    @classmethod
    def from_proto(cls, pb: agent_pb.RunConversationResponse) -> TurnResult:
        return cls(
            conversation_id=pb.conversation_id,
            version=pb.conversation_version,
            first_sequence=pb.first_sequence,
            last_sequence=pb.last_sequence,
            outcome=Outcome.from_proto(pb.outcome),
            tool_calls=list(pb.tool_calls),
            context=pb.context if pb.HasField("context") else None,
            replayed=pb.replayed,
            created=pb.created,
        )


TurnRequest = TypeVar(
    "TurnRequest", agent_pb.RunConversationRequest, agent_pb.StreamConversationRequest
)


def _turn_request(
    kind: type[TurnRequest],
    input: InputLike,
    conversation_id: str,
    namespace: str,
    turn_id: str | None,
    policy: ConversationContextPolicy | None,
    budget: Budget | None,
    system_instructions: str,
    create_if_missing: bool,
    tools: Sequence[Tool],
    concurrency: ConcurrencyMode = ConcurrencyMode.RACE,
) -> TurnRequest:
    """A turn's request; RunConversation and StreamConversation take the same fields."""
    return kind(
        conversation_id=conversation_id,
        namespace=namespace,
        input=messages(input),
        turn_id=turn_id or str(uuid.uuid4()),
        policy=(policy or ConversationContextPolicy()).to_proto(),
        budget=(budget or Budget()).to_proto(),
        system_instructions=system_instructions,
        create_if_missing=create_if_missing,
        tools=[tool.to_proto() for tool in tools],
        concurrency=int(concurrency),  # type: ignore[arg-type]
    )


def _metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


# -- requests, built once for both clients --------------------------------------------


def _create(
    namespace: str, conversation_id: str, labels: Mapping[str, str] | None
) -> transcript_pb.CreateConversationRequest:
    return transcript_pb.CreateConversationRequest(
        namespace=namespace, conversation_id=conversation_id or new_conversation_id(), labels=labels
    )


def _get(namespace: str, conversation_id: str) -> transcript_pb.GetConversationRequest:
    return transcript_pb.GetConversationRequest(
        namespace=namespace, conversation_id=conversation_id
    )


def _append(
    namespace: str,
    conversation_id: str,
    input: InputLike,
    expected_version: int | None,
    request_id: str | None,
) -> transcript_pb.AppendEntriesRequest:
    request = transcript_pb.AppendEntriesRequest(
        namespace=namespace,
        conversation_id=conversation_id,
        messages=messages(input),
        request_id=request_id or str(uuid.uuid4()),
    )
    if expected_version is not None:
        request.expected_version = expected_version
    return request


def _page(
    namespace: str, conversation_id: str, after_sequence: int, token: str
) -> transcript_pb.ListEntriesRequest:
    return transcript_pb.ListEntriesRequest(
        namespace=namespace,
        conversation_id=conversation_id,
        after_sequence=after_sequence,
        page_size=500,
        page_token=token,
    )


def _delete(namespace: str, conversation_id: str) -> transcript_pb.DeleteConversationRequest:
    return transcript_pb.DeleteConversationRequest(
        namespace=namespace, conversation_id=conversation_id
    )


def _summary(namespace: str, conversation_id: str) -> summary_pb.GetSummaryRequest:
    return summary_pb.GetSummaryRequest(namespace=namespace, conversation_id=conversation_id)


def _summarize(
    namespace: str,
    conversation_id: str,
    window: int,
    summary_batch: int,
    max_summary_passes: int,
    budget: Budget | None,
) -> summary_pb.SummarizeRequest:
    return summary_pb.SummarizeRequest(
        namespace=namespace,
        conversation_id=conversation_id,
        window=window,
        summary_batch=summary_batch,
        max_summary_passes=max_summary_passes,
        budget=(budget or Budget()).to_proto(),
    )


def _remember(
    namespace: str,
    content: str,
    conversation_id: str,
    from_sequence: int,
    through_sequence: int,
    metadata: Mapping[str, str] | None,
    request_id: str | None = None,
) -> memory_pb.UpsertMemoryRequest:
    return memory_pb.UpsertMemoryRequest(
        namespace=namespace,
        request_id=request_id or str(uuid.uuid4()),
        content=content,
        sources=[
            memory_pb.MemorySource(
                conversation_id=conversation_id,
                from_sequence=from_sequence,
                through_sequence=through_sequence,
            )
        ],
        metadata=metadata,
    )


def _search(namespace: str, query: str, limit: int) -> memory_pb.SearchMemoriesRequest:
    return memory_pb.SearchMemoriesRequest(namespace=namespace, query=query, limit=limit)


def _forget(
    namespace: str, conversation_id: str, from_sequence: int, through_sequence: int
) -> memory_pb.ForgetSourceRequest:
    return memory_pb.ForgetSourceRequest(
        namespace=namespace,
        conversation_id=conversation_id,
        from_sequence=from_sequence,
        through_sequence=through_sequence,
    )


def _propose(
    namespace: str,
    conversation_id: str,
    from_sequence: int,
    through_sequence: int,
    max_proposals: int,
    budget: Budget | None,
) -> memory_pb.ProposeMemoriesRequest:
    return memory_pb.ProposeMemoriesRequest(
        namespace=namespace,
        conversation_id=conversation_id,
        from_sequence=from_sequence,
        through_sequence=through_sequence,
        max_proposals=max_proposals,
        budget=(budget or Budget()).to_proto(),
    )


def _confirm(
    namespace: str, proposal: memory_pb.MemoryProposal, request_id: str | None
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
        sources=proposal.sources,
        valid_from_time=proposal.valid_from_time,
        supersedes=supersedes,
    )


def _revisions(namespace: str, memory_id: str, token: str) -> memory_pb.ListMemoryRevisionsRequest:
    return memory_pb.ListMemoryRevisionsRequest(
        namespace=namespace, memory_id=memory_id, page_token=token
    )


def _erase(namespace: str, conversation_id: str) -> agent_pb.EraseConversationRequest:
    return agent_pb.EraseConversationRequest(conversation_id=conversation_id, namespace=namespace)


class AsyncClient:
    """asyncio client of every Runifold service.

    >>> async with AsyncClient("127.0.0.1:50051") as client:
    ...     result = await client.run_conversation(
    ...         "What did we decide?", conversation_id=cid, namespace="tenant-42",
    ...         policy=ConversationContextPolicy(window=16).with_semantic_memory(8))
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        namespace: str = "",
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float = 60.0,
        max_attempts: int = 3,
    ) -> None:
        self.namespace = namespace
        self.timeout = timeout
        self.max_attempts = max_attempts
        self._metadata = _metadata(token)
        options = channel_options(max_attempts)
        self.channel = (
            grpc.aio.secure_channel(target, credentials, options=options)
            if credentials is not None
            else grpc.aio.insecure_channel(target, options=options)
        )
        self.transcripts = transcript_grpc.TranscriptServiceStub(self.channel)
        self.summaries = summary_grpc.SummaryServiceStub(self.channel)
        self.memories = memory_grpc.MemoryServiceStub(self.channel)
        self.agent = agent_grpc.AgentServiceStub(self.channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()

    def _ns(self, namespace: str | None) -> str:
        return self.namespace if namespace is None else namespace

    async def _call(
        self,
        method: Callable[..., Awaitable[Response]],
        request: Any,
        timeout: float | None = None,
    ) -> Response:
        try:
            return await method(request, timeout=timeout or self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None

    # -- turns ---------------------------------------------------------------

    async def run_conversation(
        self,
        input: InputLike,
        *,
        conversation_id: str = "",
        namespace: str | None = None,
        turn_id: str | None = None,
        policy: ConversationContextPolicy | None = None,
        budget: Budget | None = None,
        system_instructions: str = "",
        create_if_missing: bool = True,
        tools: Sequence[Tool] = (),
        concurrency: ConcurrencyMode = ConcurrencyMode.RACE,
        timeout: float | None = None,
    ) -> TurnResult:
        """Run one agent turn; raises TurnConflict, SummaryRequired, ... on failure."""
        request = _turn_request(
            agent_pb.RunConversationRequest,
            input,
            conversation_id,
            self._ns(namespace),
            turn_id,
            policy,
            budget,
            system_instructions,
            create_if_missing,
            tools,
            concurrency,
        )
        reply = await self._call(self.agent.RunConversation, request, timeout)
        return TurnResult.from_proto(reply)

    async def stream_conversation(
        self,
        input: InputLike,
        *,
        conversation_id: str = "",
        namespace: str | None = None,
        turn_id: str | None = None,
        policy: ConversationContextPolicy | None = None,
        budget: Budget | None = None,
        system_instructions: str = "",
        create_if_missing: bool = True,
        tools: Sequence[Tool] = (),
        concurrency: ConcurrencyMode = ConcurrencyMode.RACE,
        timeout: float | None = None,
    ) -> AsyncIterator[agent_pb.StreamConversationResponse]:
        """The same turn as a stream of events (progress, text deltas, then the result)."""
        request = _turn_request(
            agent_pb.StreamConversationRequest,
            input,
            conversation_id,
            self._ns(namespace),
            turn_id,
            policy,
            budget,
            system_instructions,
            create_if_missing,
            tools,
            concurrency,
        )
        call = self.agent.StreamConversation(
            request, timeout=timeout or self.timeout, metadata=self._metadata
        )
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None

    async def erase_conversation(
        self, conversation_id: str, *, namespace: str | None = None
    ) -> agent_pb.EraseConversationResponse:
        """Erase a conversation everywhere (entries, summaries, jobs, derived memories)."""
        return await self._call(
            self.agent.EraseConversation,
            _erase(self._ns(namespace), conversation_id),
        )

    # -- transcripts -----------------------------------------------------------

    async def create_conversation(
        self,
        *,
        namespace: str | None = None,
        conversation_id: str = "",
        labels: Mapping[str, str] | None = None,
    ) -> transcript_pb.Conversation:
        """Create (or get, when it exists) a conversation."""
        reply = await self._call(
            self.transcripts.CreateConversation,
            _create(self._ns(namespace), conversation_id, labels),
        )
        return reply.conversation

    async def get_conversation(
        self, conversation_id: str, *, namespace: str | None = None
    ) -> transcript_pb.Conversation:
        """A conversation's version and counters."""
        reply = await self._call(
            self.transcripts.GetConversation,
            _get(self._ns(namespace), conversation_id),
        )
        return reply.conversation

    async def append(
        self,
        conversation_id: str,
        input: InputLike,
        *,
        namespace: str | None = None,
        expected_version: int | None = None,
        request_id: str | None = None,
    ) -> transcript_pb.AppendEntriesResponse:
        """Append messages (compare-and-swap when expected_version is given)."""
        return await self._call(
            self.transcripts.AppendEntries,
            _append(self._ns(namespace), conversation_id, input, expected_version, request_id),
        )

    async def entries(
        self, conversation_id: str, *, namespace: str | None = None, after_sequence: int = 0
    ) -> AsyncIterator[common_pb2.Entry]:
        """Every entry after a sequence, page by page."""
        token = ""
        while True:
            reply = await self._call(
                self.transcripts.ListEntries,
                _page(self._ns(namespace), conversation_id, after_sequence, token),
            )
            for entry in reply.entries:
                yield entry
            token = reply.next_page_token
            if not token:
                return

    async def delete_conversation(
        self, conversation_id: str, *, namespace: str | None = None
    ) -> transcript_pb.DeleteConversationResponse:
        """Erase a transcript (only the transcript: see erase_conversation)."""
        return await self._call(
            self.transcripts.DeleteConversation,
            _delete(self._ns(namespace), conversation_id),
        )

    # -- summaries -----------------------------------------------------------------

    async def get_summary(
        self, conversation_id: str, *, namespace: str | None = None
    ) -> summary_pb.Summary | None:
        """The current summary, or None."""
        reply = await self._call(
            self.summaries.GetSummary,
            _summary(self._ns(namespace), conversation_id),
        )
        return reply.summary if reply.HasField("summary") else None

    async def summarize(
        self,
        conversation_id: str,
        *,
        namespace: str | None = None,
        window: int = 16,
        summary_batch: int = 64,
        max_summary_passes: int = 1,
        budget: Budget | None = None,
    ) -> summary_pb.SummarizeResponse:
        """Run the summarizer now."""
        return await self._call(
            self.summaries.Summarize,
            _summarize(
                self._ns(namespace),
                conversation_id,
                window,
                summary_batch,
                max_summary_passes,
                budget,
            ),
        )

    async def backlog(self, *, namespace: str | None = None) -> summary_pb.GetBacklogResponse:
        """The summary job queue of a namespace."""
        return await self._call(
            self.summaries.GetBacklog, summary_pb.GetBacklogRequest(namespace=self._ns(namespace))
        )

    # -- memories --------------------------------------------------------------------

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
        """Curate a fact from a transcript range (idempotent by `request_id`, made for you
        when you pass none, so that a retry stores the fact once)."""
        reply = await self._call(
            self.memories.UpsertMemory,
            _remember(
                self._ns(namespace),
                content,
                conversation_id,
                from_sequence,
                through_sequence,
                metadata,
                request_id,
            ),
        )
        return reply.memory

    async def search_memories(
        self, query: str, *, namespace: str | None = None, limit: int = 8
    ) -> memory_pb.SearchMemoriesResponse:
        """Semantic search inside one namespace."""
        return await self._call(
            self.memories.SearchMemories,
            _search(self._ns(namespace), query, limit),
        )

    async def forget_source(
        self,
        conversation_id: str,
        *,
        namespace: str | None = None,
        from_sequence: int = 0,
        through_sequence: int = 0,
    ) -> int:
        """Delete every memory derived from a conversation (or a range of it)."""
        reply = await self._call(
            self.memories.ForgetSource,
            _forget(self._ns(namespace), conversation_id, from_sequence, through_sequence),
        )
        return int(reply.deleted_count)

    async def propose_memories(
        self,
        conversation_id: str,
        *,
        from_sequence: int,
        through_sequence: int,
        namespace: str | None = None,
        max_proposals: int = 0,
        budget: Budget | None = None,
    ) -> memory_pb.ProposeMemoriesResponse:
        """Proposals of memories from a transcript range; nothing is stored until you
        confirm one (`confirm_proposal`)."""
        return await self._call(
            self.memories.ProposeMemories,
            _propose(
                self._ns(namespace),
                conversation_id,
                from_sequence,
                through_sequence,
                max_proposals,
                budget,
            ),
        )

    async def confirm_proposal(
        self,
        proposal: memory_pb.MemoryProposal,
        *,
        namespace: str | None = None,
        request_id: str | None = None,
    ) -> memory_pb.UpsertMemoryResponse:
        """Store a proposal: UpsertMemory with its content, sources and valid time (and,
        for a SUPERSEDE, superseding its memory). ValueError for a DUPLICATE."""
        return await self._call(
            self.memories.UpsertMemory, _confirm(self._ns(namespace), proposal, request_id)
        )

    async def memory_revisions(
        self, memory_id: str, *, namespace: str | None = None
    ) -> AsyncIterator[memory_pb.MemoryRevision]:
        """Every revision of a memory, oldest first, page by page."""
        token = ""
        while True:
            reply = await self._call(
                self.memories.ListMemoryRevisions, _revisions(self._ns(namespace), memory_id, token)
            )
            for revision in reply.revisions:
                yield revision
            token = reply.next_page_token
            if not token:
                return


class Client:
    """Blocking client with the same methods as AsyncClient (grpc's sync stack).

    >>> client = Client("127.0.0.1:50051", namespace="tenant-42")
    >>> result = client.run_conversation("What did we decide?", conversation_id=cid,
    ...     policy=ConversationContextPolicy(window=16).with_semantic_memory(8))
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        namespace: str = "",
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float = 60.0,
        max_attempts: int = 3,
        channel: grpc.Channel | None = None,
    ) -> None:
        self.namespace = namespace
        self.timeout = timeout
        self.max_attempts = max_attempts
        self._metadata = _metadata(token)
        if channel is None:
            options = channel_options(max_attempts)
            channel = (
                grpc.secure_channel(target, credentials, options=options)
                if credentials is not None
                else grpc.insecure_channel(target, options=options)
            )
        self.channel = channel
        self.transcripts = transcript_grpc.TranscriptServiceStub(channel)
        self.summaries = summary_grpc.SummaryServiceStub(channel)
        self.memories = memory_grpc.MemoryServiceStub(channel)
        self.agent = agent_grpc.AgentServiceStub(channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()

    def _ns(self, namespace: str | None) -> str:
        return self.namespace if namespace is None else namespace

    def _call(
        self, method: Callable[..., Response], request: Any, timeout: float | None = None
    ) -> Response:
        try:
            return method(request, timeout=timeout or self.timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def run_conversation(
        self,
        input: InputLike,
        *,
        conversation_id: str = "",
        namespace: str | None = None,
        turn_id: str | None = None,
        policy: ConversationContextPolicy | None = None,
        budget: Budget | None = None,
        system_instructions: str = "",
        create_if_missing: bool = True,
        tools: Sequence[Tool] = (),
        concurrency: ConcurrencyMode = ConcurrencyMode.RACE,
        timeout: float | None = None,
    ) -> TurnResult:
        """Run one agent turn; raises TurnConflict, SummaryRequired, ... on failure."""
        request = _turn_request(
            agent_pb.RunConversationRequest,
            input,
            conversation_id,
            self._ns(namespace),
            turn_id,
            policy,
            budget,
            system_instructions,
            create_if_missing,
            tools,
            concurrency,
        )
        return TurnResult.from_proto(self._call(self.agent.RunConversation, request, timeout))

    def stream_conversation(
        self,
        input: InputLike,
        *,
        conversation_id: str = "",
        namespace: str | None = None,
        turn_id: str | None = None,
        policy: ConversationContextPolicy | None = None,
        budget: Budget | None = None,
        system_instructions: str = "",
        create_if_missing: bool = True,
        tools: Sequence[Tool] = (),
        concurrency: ConcurrencyMode = ConcurrencyMode.RACE,
        timeout: float | None = None,
    ) -> Iterator[agent_pb.StreamConversationResponse]:
        """The same turn as a stream of events."""
        request = _turn_request(
            agent_pb.StreamConversationRequest,
            input,
            conversation_id,
            self._ns(namespace),
            turn_id,
            policy,
            budget,
            system_instructions,
            create_if_missing,
            tools,
            concurrency,
        )
        try:
            yield from self.agent.StreamConversation(
                request, timeout=timeout or self.timeout, metadata=self._metadata
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def create_conversation(
        self,
        *,
        namespace: str | None = None,
        conversation_id: str = "",
        labels: Mapping[str, str] | None = None,
    ) -> transcript_pb.Conversation:
        """Create (or get, when it exists) a conversation."""
        return self._call(
            self.transcripts.CreateConversation,
            _create(self._ns(namespace), conversation_id, labels),
        ).conversation

    def get_conversation(
        self, conversation_id: str, *, namespace: str | None = None
    ) -> transcript_pb.Conversation:
        """A conversation's version and counters."""
        return self._call(
            self.transcripts.GetConversation,
            _get(self._ns(namespace), conversation_id),
        ).conversation

    def append(
        self,
        conversation_id: str,
        input: InputLike,
        *,
        namespace: str | None = None,
        expected_version: int | None = None,
        request_id: str | None = None,
    ) -> transcript_pb.AppendEntriesResponse:
        """Append messages (compare-and-swap when expected_version is given)."""
        return self._call(
            self.transcripts.AppendEntries,
            _append(self._ns(namespace), conversation_id, input, expected_version, request_id),
        )

    def entries(
        self, conversation_id: str, *, namespace: str | None = None, after_sequence: int = 0
    ) -> Iterator[common_pb2.Entry]:
        """Every entry after a sequence, page by page."""
        token = ""
        while True:
            reply = self._call(
                self.transcripts.ListEntries,
                _page(self._ns(namespace), conversation_id, after_sequence, token),
            )
            yield from reply.entries
            token = reply.next_page_token
            if not token:
                return

    def delete_conversation(
        self, conversation_id: str, *, namespace: str | None = None
    ) -> transcript_pb.DeleteConversationResponse:
        """Erase a transcript (only the transcript: see erase_conversation)."""
        return self._call(
            self.transcripts.DeleteConversation,
            _delete(self._ns(namespace), conversation_id),
        )

    def backlog(self, *, namespace: str | None = None) -> summary_pb.GetBacklogResponse:
        """The summary job queue of a namespace."""
        return self._call(
            self.summaries.GetBacklog, summary_pb.GetBacklogRequest(namespace=self._ns(namespace))
        )

    def get_summary(
        self, conversation_id: str, *, namespace: str | None = None
    ) -> summary_pb.Summary | None:
        """The current summary, or None."""
        reply = self._call(
            self.summaries.GetSummary,
            _summary(self._ns(namespace), conversation_id),
        )
        return reply.summary if reply.HasField("summary") else None

    def summarize(
        self,
        conversation_id: str,
        *,
        namespace: str | None = None,
        window: int = 16,
        summary_batch: int = 64,
        max_summary_passes: int = 1,
        budget: Budget | None = None,
    ) -> summary_pb.SummarizeResponse:
        """Run the summarizer now."""
        return self._call(
            self.summaries.Summarize,
            _summarize(
                self._ns(namespace),
                conversation_id,
                window,
                summary_batch,
                max_summary_passes,
                budget,
            ),
        )

    def remember(
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
        """Curate a fact from a transcript range (idempotent by `request_id`, made for you
        when you pass none, so that a retry stores the fact once)."""
        return self._call(
            self.memories.UpsertMemory,
            _remember(
                self._ns(namespace),
                content,
                conversation_id,
                from_sequence,
                through_sequence,
                metadata,
            ),
        ).memory

    def search_memories(
        self, query: str, *, namespace: str | None = None, limit: int = 8
    ) -> memory_pb.SearchMemoriesResponse:
        """Semantic search inside one namespace."""
        return self._call(
            self.memories.SearchMemories,
            _search(self._ns(namespace), query, limit),
        )

    def forget_source(
        self,
        conversation_id: str,
        *,
        namespace: str | None = None,
        from_sequence: int = 0,
        through_sequence: int = 0,
    ) -> int:
        """Delete every memory derived from a conversation (or a range of it)."""
        reply = self._call(
            self.memories.ForgetSource,
            _forget(self._ns(namespace), conversation_id, from_sequence, through_sequence),
        )
        return int(reply.deleted_count)

    def propose_memories(
        self,
        conversation_id: str,
        *,
        from_sequence: int,
        through_sequence: int,
        namespace: str | None = None,
        max_proposals: int = 0,
        budget: Budget | None = None,
    ) -> memory_pb.ProposeMemoriesResponse:
        """Proposals of memories from a transcript range; nothing is stored until you
        confirm one (`confirm_proposal`)."""
        return self._call(
            self.memories.ProposeMemories,
            _propose(
                self._ns(namespace),
                conversation_id,
                from_sequence,
                through_sequence,
                max_proposals,
                budget,
            ),
        )

    def confirm_proposal(
        self,
        proposal: memory_pb.MemoryProposal,
        *,
        namespace: str | None = None,
        request_id: str | None = None,
    ) -> memory_pb.UpsertMemoryResponse:
        """Store a proposal: UpsertMemory with its content, sources and valid time (and,
        for a SUPERSEDE, superseding its memory). ValueError for a DUPLICATE."""
        return self._call(
            self.memories.UpsertMemory, _confirm(self._ns(namespace), proposal, request_id)
        )

    def memory_revisions(
        self, memory_id: str, *, namespace: str | None = None
    ) -> Iterator[memory_pb.MemoryRevision]:
        """Every revision of a memory, oldest first, page by page."""
        token = ""
        while True:
            reply = self._call(
                self.memories.ListMemoryRevisions, _revisions(self._ns(namespace), memory_id, token)
            )
            yield from reply.revisions
            token = reply.next_page_token
            if not token:
                return

    def erase_conversation(
        self, conversation_id: str, *, namespace: str | None = None
    ) -> agent_pb.EraseConversationResponse:
        """Erase a conversation everywhere (entries, summaries, jobs, derived memories)."""
        return self._call(
            self.agent.EraseConversation,
            _erase(self._ns(namespace), conversation_id),
        )
