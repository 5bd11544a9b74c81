"""Python clients of the Runifold services: `AsyncClient` (grpc.aio) and `Client` (blocking).

`AsyncClient` is the one implementation: every RPC of the four services is a
method of it. `Client` runs an `AsyncClient` on an event loop of its own, in a
background thread, and turns each method into a blocking call (each
async iterator into an iterator); it adds no logic of its own.

Both speak to one address (the all-in-one server, or a gateway in front of
the services), give every call a deadline, and make writes safe to retry:
`run_conversation` sends a `turn_id`, `append` and the memory writes a
`request_id`, `create_conversation` a conversation id (made for you when you
pass none), so a retry after a lost answer returns the first result instead
of writing twice. Retries are gRPC's own (a service-config `retryPolicy`:
UNAVAILABLE only, exponential backoff, within the call's deadline), on every
method but Summarize and ProposeMemories, which would spend model calls again.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import json
import os
import random
import threading
import time
import uuid
import weakref
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.agent.v1 import agent_service_pb2_grpc as agent_grpc
from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.memory.v1 import memory_service_pb2_grpc as memory_grpc
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.summary.v1 import summary_service_pb2_grpc as summary_grpc
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold.transcript.v1 import transcript_service_pb2_grpc as transcript_grpc
from runifold_client.errors import Outcome, RunifoldError, from_rpc_error
from runifold_client.policy import (
    Budget,
    ConversationContextPolicy,
    InputLike,
    Tool,
    messages,
)

DEFAULT_TARGET = "127.0.0.1:50051"
# Page size of the listing iterators (the servers allow at most 1000).
PAGE_SIZE = 500
Response = TypeVar("Response")
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

# The methods a retry would spend model calls again for (nothing is stored twice either way).
_NOT_RETRIED = {
    ("runifold.summary.v1.SummaryService", "Summarize"),
    ("runifold.memory.v1.MemoryService", "ProposeMemories"),
}
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


class TurnLeaseMode(enum.IntEnum):
    """How a turn lease shares the conversation (runifold.transcript.v1.TurnLeaseMode).

    SHARED: other turns may run; the first to append wins.
    EXCLUSIVE: the only running turn (ConversationBusy while another runs or waits).
    QUEUED: exclusive, waiting in line for the turns ahead of it.
    """

    SHARED = transcript_pb.TURN_LEASE_MODE_SHARED
    EXCLUSIVE = transcript_pb.TURN_LEASE_MODE_EXCLUSIVE
    QUEUED = transcript_pb.TURN_LEASE_MODE_QUEUED


def channel_options(max_attempts: int) -> list[tuple[str, Any]]:
    """gRPC channel options: its retry policy for every method but Summarize and ProposeMemories.

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

    def to_proto(self) -> agent_pb.RunConversationResponse:
        """The RunConversationResponse this result came from."""
        usage = self.outcome.usage
        return agent_pb.RunConversationResponse(
            conversation_id=self.conversation_id,
            conversation_version=self.version,
            first_sequence=self.first_sequence,
            last_sequence=self.last_sequence,
            outcome=agent_pb.TurnOutcome(
                output=self.outcome.messages,
                usage=common_pb2.Usage(
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    model_calls=usage.model_calls,
                ),
            ),
            tool_calls=self.tool_calls,
            context=self.context,
            replayed=self.replayed,
            created=self.created,
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
    concurrency: ConcurrencyMode,
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


def _resumable(error: RunifoldError) -> bool:
    """A WatchConversation that ended so can be watched again from where it was."""
    return error.code == grpc.StatusCode.UNAVAILABLE or (
        error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.reason == "WATCHER_TOO_SLOW"
    )


def _backoff_s(attempt: int, max_s: float) -> float:
    """The wait before watching again: 0.1 s doubling up to `max_s`, jittered."""
    return float(min(max_s, 0.1 * 2 ** min(attempt, 16)) * random.uniform(0.5, 1.0))


def _duration(seconds: float | timedelta | None) -> duration_pb2.Duration | None:
    if seconds is None:
        return None
    value = duration_pb2.Duration()
    value.FromTimedelta(seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds))
    return value


def _timestamp(moment: datetime | None) -> timestamp_pb2.Timestamp | None:
    if moment is None:
        return None
    value = timestamp_pb2.Timestamp()
    value.FromDatetime(moment)
    return value


def _metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def source(
    conversation_id: str, from_sequence: int, through_sequence: int, incarnation: int = 0
) -> memory_pb.MemorySource:
    """A transcript range a memory comes from (both ends inclusive, 1-based). With the
    conversation's `incarnation` (Conversation.incarnation when you read the range), a
    write is refused once that incarnation is erased, even if the id was made again; 0:
    whatever incarnation is current when the write checks its sources."""
    return memory_pb.MemorySource(
        conversation_id=conversation_id,
        from_sequence=from_sequence,
        through_sequence=through_sequence,
        incarnation=incarnation,
    )


def _propose(
    namespace: str,
    conversation_id: str,
    from_sequence: int,
    through_sequence: int,
    max_proposals: int,
    budget: Budget | None,
    metadata_filter: Mapping[str, str] | None = None,
) -> memory_pb.ProposeMemoriesRequest:
    return memory_pb.ProposeMemoriesRequest(
        namespace=namespace,
        conversation_id=conversation_id,
        from_sequence=from_sequence,
        through_sequence=through_sequence,
        max_proposals=max_proposals,
        budget=(budget or Budget()).to_proto(),
        metadata_filter=metadata_filter,
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


def _revisions(namespace: str, memory_id: str, token: str) -> memory_pb.ListMemoryRevisionsRequest:
    return memory_pb.ListMemoryRevisionsRequest(
        namespace=namespace, memory_id=memory_id, page_token=token
    )


class _LoopChannel:
    """A channel of one event loop, and the stubs on it."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.transcripts = transcript_grpc.TranscriptServiceStub(channel)
        self.summaries = summary_grpc.SummaryServiceStub(channel)
        self.memories = memory_grpc.MemoryServiceStub(channel)
        self.agent = agent_grpc.AgentServiceStub(channel)


class AsyncClient:
    """asyncio client of every Runifold service.

    >>> async with AsyncClient("127.0.0.1:50051", namespace="tenant-42") as client:
    ...     result = await client.run_conversation(
    ...         "What did we decide?", conversation_id=cid,
    ...         policy=ConversationContextPolicy(window=16).with_semantic_memory(8))

    `namespace` is the default of every call (each method takes `namespace=` too);
    `token` is sent as a bearer token; `timeout` (seconds) is each call's deadline
    unless the call says otherwise; `max_attempts` bounds gRPC's retries of UNAVAILABLE.
    It may be made outside any event loop and used from several (a channel per loop,
    opened on the loop's first call): threads, `asyncio.run` after `asyncio.run`.
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
        self.target = target
        self.namespace = namespace
        self.timeout = timeout
        self.max_attempts = max_attempts
        self._metadata = _metadata(token)
        self._credentials = credentials
        self._options = channel_options(max_attempts)
        # One channel per event loop, made on the loop's first call: a grpc.aio channel
        # belongs to the loop it was made on, and one client (a framework session built
        # outside any loop, say) is used from several: Runner.run_sync, threads, one
        # asyncio.run after another.
        self._lock = threading.Lock()
        self._channels: dict[asyncio.AbstractEventLoop, _LoopChannel] = {}
        self._closed = False

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _here(self) -> _LoopChannel:
        """The channel (and stubs) of the running loop, made on its first call."""
        loop = asyncio.get_running_loop()
        found = self._channels.get(loop)
        if found is not None:
            return found
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            found = self._channels.get(loop)
            if found is None:
                # A closed loop's channel can never run again: let it go.
                for gone in [other for other in self._channels if other.is_closed()]:
                    del self._channels[gone]
                channel = (
                    grpc.aio.secure_channel(self.target, self._credentials, options=self._options)
                    if self._credentials is not None
                    else grpc.aio.insecure_channel(self.target, options=self._options)
                )
                found = self._channels[loop] = _LoopChannel(channel)
            return found

    @property
    def channel(self) -> grpc.aio.Channel:
        """The channel of the running event loop."""
        return self._here().channel

    @property
    def transcripts(self) -> transcript_grpc.TranscriptServiceAsyncStub:
        return self._here().transcripts

    @property
    def summaries(self) -> summary_grpc.SummaryServiceAsyncStub:
        return self._here().summaries

    @property
    def memories(self) -> memory_grpc.MemoryServiceAsyncStub:
        return self._here().memories

    @property
    def agent(self) -> agent_grpc.AgentServiceAsyncStub:
        return self._here().agent

    async def close(self) -> None:
        """Close the channels: this loop's (awaited), each other running loop's on that
        loop; a channel of a closed loop is let go. A closed client makes no calls."""
        with self._lock:
            self._closed = True
            channels, self._channels = self._channels, {}
        here = asyncio.get_running_loop()
        for loop, open_channel in channels.items():
            if loop is here:
                await open_channel.channel.close()
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(open_channel.channel.close(), loop)

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

    # -- turns (AgentService) ----------------------------------------------------------

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
        """Run one agent turn; raises TurnConflict, SummaryRequired, ... on failure.

        A `turn_id` is made for you when you pass none: a retry of the same call
        (gRPC's, or yours with the same id) returns the first outcome.
        """
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
            agent_pb.EraseConversationRequest(
                conversation_id=conversation_id, namespace=self._ns(namespace)
            ),
        )

    # -- transcripts (TranscriptService) -------------------------------------------------

    async def create_conversation(
        self,
        *,
        namespace: str | None = None,
        conversation_id: str = "",
        labels: Mapping[str, str] | None = None,
        user_id: str = "",
        state: transcript_pb.StateDelta | None = None,
    ) -> transcript_pb.Conversation:
        """Create (or get, when it exists) a conversation; its id is made here (a UUIDv7)
        when you pass none, so that a retry names the same conversation. `user_id` and
        the initial `state` apply only when this call creates it."""
        reply = await self.create_conversation_reply(
            namespace=namespace,
            conversation_id=conversation_id,
            labels=labels,
            user_id=user_id,
            state=state,
        )
        return reply.conversation

    async def create_conversation_reply(
        self,
        *,
        namespace: str | None = None,
        conversation_id: str = "",
        labels: Mapping[str, str] | None = None,
        user_id: str = "",
        state: transcript_pb.StateDelta | None = None,
    ) -> transcript_pb.CreateConversationResponse:
        """create_conversation's whole reply: the conversation and whether this call made it."""
        return await self._call(
            self.transcripts.CreateConversation,
            transcript_pb.CreateConversationRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id or new_conversation_id(),
                labels=labels,
                user_id=user_id,
                state=state,
            ),
        )

    async def get_state(
        self, user_ids: Sequence[str] = (), *, namespace: str | None = None
    ) -> transcript_pb.GetStateResponse:
        """The namespace's state and these users' (at most 100), without a conversation."""
        return await self._call(
            self.transcripts.GetState,
            transcript_pb.GetStateRequest(namespace=self._ns(namespace), user_ids=user_ids),
        )

    async def get_conversation(
        self, conversation_id: str, *, namespace: str | None = None
    ) -> transcript_pb.Conversation:
        """A conversation's version and counters."""
        reply = await self._call(
            self.transcripts.GetConversation,
            transcript_pb.GetConversationRequest(
                namespace=self._ns(namespace), conversation_id=conversation_id
            ),
        )
        return reply.conversation

    async def list_conversations(
        self,
        *,
        namespace: str | None = None,
        page_size: int = PAGE_SIZE,
        user_id: str = "",
        with_state: bool = False,
    ) -> AsyncIterator[transcript_pb.Conversation]:
        """Every conversation of a namespace (only a user's, with `user_id`), in id order
        (oldest first), page by page; with their state when asked (at most 50 a page)."""
        token = ""
        view = (
            transcript_pb.CONVERSATION_VIEW_FULL
            if with_state
            else transcript_pb.CONVERSATION_VIEW_BASIC
        )
        while True:
            reply = await self._call(
                self.transcripts.ListConversations,
                transcript_pb.ListConversationsRequest(
                    namespace=self._ns(namespace),
                    page_size=page_size,
                    page_token=token,
                    user_id=user_id,
                    view=view,
                ),
            )
            for conversation in reply.conversations:
                yield conversation
            token = reply.next_page_token
            if not token:
                return

    async def append(
        self,
        conversation_id: str,
        input: InputLike,
        *,
        namespace: str | None = None,
        expected_version: int | None = None,
        request_id: str | None = None,
        usage: common_pb2.Usage | None = None,
        fencing_token: int | None = None,
        state_delta: transcript_pb.StateDelta | None = None,
        retract_sequences: Sequence[int] = (),
    ) -> transcript_pb.AppendEntriesResponse:
        """Append messages (compare-and-swap when expected_version is given; idempotent
        by `request_id`, made for you when you pass none), with state changes and
        retractions committed in the same write (`input` may then be empty)."""
        request = transcript_pb.AppendEntriesRequest(
            namespace=self._ns(namespace),
            conversation_id=conversation_id,
            messages=messages(input),
            request_id=request_id or str(uuid.uuid4()),
            usage=usage,
            state_delta=state_delta,
            retract_sequences=retract_sequences,
        )
        if expected_version is not None:
            request.expected_version = expected_version
        if fencing_token is not None:
            request.fencing_token = fencing_token
        return await self._call(self.transcripts.AppendEntries, request)

    async def entries(
        self,
        conversation_id: str,
        *,
        namespace: str | None = None,
        after_sequence: int = 0,
        through_sequence: int = 0,
    ) -> AsyncIterator[common_pb2.Entry]:
        """Every entry after a sequence (up to `through_sequence`, 0: the end), page by page."""
        token = ""
        while True:
            reply = await self._call(
                self.transcripts.ListEntries,
                transcript_pb.ListEntriesRequest(
                    namespace=self._ns(namespace),
                    conversation_id=conversation_id,
                    after_sequence=after_sequence,
                    through_sequence=through_sequence,
                    page_size=PAGE_SIZE,
                    page_token=token,
                ),
            )
            for entry in reply.entries:
                yield entry
            token = reply.next_page_token
            if not token:
                return

    async def watch_conversation(
        self,
        conversation_id: str,
        *,
        namespace: str | None = None,
        after_sequence: int = 0,
        incarnation: int = 0,
        heartbeat_interval: float | timedelta | None = None,
        resume: bool = True,
        max_backoff: float = 5.0,
    ) -> AsyncIterator[transcript_pb.WatchConversationResponse]:
        """Follow a conversation (TranscriptService.WatchConversation): the entries after
        `after_sequence` (`appended` events, each entry once and in order), `retracted`
        for delivered entries a later write retracted, the turns that run on it
        (`turn_started`, `turn_finished`), `heartbeat`s while it is quiet, and a final
        `erased` (then the iteration ends). It has no deadline: stop iterating (or
        cancel) to leave.

        With `resume` (the default) a stream that breaks (UNAVAILABLE: a replica restarted
        or shut down, the network; RESOURCE_EXHAUSTED / WATCHER_TOO_SLOW: this reader fell
        behind) is watched again from the last sequence received and its incarnation, with
        backoff: nothing is missed and nothing repeats (a retraction the resumed stream
        reports again is dropped here). Turns still running are not
        reported started twice; a turn that finished while the stream was down is reported
        `turn_finished` with `TURN_FINISH_UNSPECIFIED` (how it ended is not known). Other
        errors are raised (NotFound, ResourceExhausted / WATCHER_LIMIT with its
        `retry_delay`, ...).
        """
        after, known = after_sequence, incarnation
        # The newest version an event showed: every retraction up to it was reported
        # (the server sends them before later entries), so a resumed stream's repeat of
        # one is dropped.
        version = 0
        running: set[str] = set()  # turns reported started and not finished
        announced: set[str] | None = None  # after a resume: the turns reported again
        attempt = 0
        while True:
            request = transcript_pb.WatchConversationRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                after_sequence=after,
                incarnation=known,
                heartbeat_interval=_duration(heartbeat_interval),
            )
            call = self.transcripts.WatchConversation(request, metadata=self._metadata)
            try:
                async for event in call:
                    kind = event.WhichOneof("event")
                    if kind == "appended":
                        if event.appended.entries:
                            after = event.appended.entries[-1].sequence
                        known = event.appended.incarnation or known
                        version = max(version, event.appended.version)
                    elif kind == "retracted":
                        if event.retracted.version <= version:
                            continue  # reported before the resume
                        version = event.retracted.version
                    elif kind == "turn_started":
                        turn_id = event.turn_started.turn_id
                        if announced is not None:
                            announced.add(turn_id)
                        if turn_id in running:
                            continue  # reported by the stream before the resume
                        running.add(turn_id)
                    elif kind == "turn_finished":
                        running.discard(event.turn_finished.turn_id)
                    elif kind == "heartbeat":
                        known = event.heartbeat.incarnation or known
                        version = max(version, event.heartbeat.version)
                        attempt = 0
                        if announced is not None:  # caught up after a resume
                            for turn_id in sorted(running - announced):
                                running.discard(turn_id)
                                yield transcript_pb.WatchConversationResponse(
                                    turn_finished=transcript_pb.TurnFinished(turn_id=turn_id)
                                )
                            announced = None
                    yield event
                    if kind == "erased":
                        return
                return
            except grpc.aio.AioRpcError as error:
                failure = from_rpc_error(error)
                if not (resume and _resumable(failure)):
                    raise failure from None
            finally:
                call.cancel()
            announced = set()
            await asyncio.sleep(_backoff_s(attempt, max_backoff))
            attempt += 1

    async def load_view(
        self,
        conversation_id: str,
        *,
        namespace: str | None = None,
        window: int = 16,
        summary_batch: int = 64,
        summarized_through: int = 0,
        request_id: str = "",
    ) -> transcript_pb.LoadViewResponse:
        """The bounded context of a turn: the recent window, the summary buffer, the backlog."""
        return await self._call(
            self.transcripts.LoadView,
            transcript_pb.LoadViewRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                window=window,
                summary_batch=summary_batch,
                summarized_through=summarized_through,
                request_id=request_id,
            ),
        )

    async def delete_conversation(
        self, conversation_id: str, *, namespace: str | None = None, incarnation: int = 0
    ) -> transcript_pb.DeleteConversationResponse:
        """Erase a transcript (only the transcript: see erase_conversation)."""
        return await self._call(
            self.transcripts.DeleteConversation,
            transcript_pb.DeleteConversationRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                incarnation=incarnation,
            ),
        )

    async def acquire_turn_lease(
        self,
        conversation_id: str,
        turn_id: str,
        *,
        namespace: str | None = None,
        mode: TurnLeaseMode = TurnLeaseMode.SHARED,
        ttl: float | timedelta | None = None,
        payload_hash: bytes = b"",
        create_if_missing: bool = False,
        timeout: float | None = None,
    ) -> transcript_pb.AcquireTurnLeaseResponse:
        """Take a turn lease before model work (`lease`), or learn that the turn already
        committed (`committed`) or ended (`ended`). `ttl` in seconds (server default 30)."""
        return await self._call(
            self.transcripts.AcquireTurnLease,
            transcript_pb.AcquireTurnLeaseRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                turn_id=turn_id,
                mode=int(mode),  # type: ignore[arg-type]
                ttl=_duration(ttl),
                payload_hash=payload_hash,
                create_if_missing=create_if_missing,
            ),
            timeout,
        )

    async def renew_turn_lease(
        self,
        conversation_id: str,
        turn_id: str,
        fencing_token: int,
        *,
        namespace: str | None = None,
        ttl: float | timedelta | None = None,
    ) -> transcript_pb.TurnLease:
        """Extend a lease still held (TurnLeaseLost otherwise)."""
        reply = await self._call(
            self.transcripts.RenewTurnLease,
            transcript_pb.RenewTurnLeaseRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                turn_id=turn_id,
                fencing_token=fencing_token,
                ttl=_duration(ttl),
            ),
        )
        return reply.lease

    async def release_turn_lease(
        self,
        conversation_id: str,
        turn_id: str,
        fencing_token: int,
        *,
        namespace: str | None = None,
        ended: transcript_pb.EndedTurn | None = None,
    ) -> bool:
        """End a turn that will not append (keeping its outcome when `ended` is given);
        False when the lease was no longer held."""
        reply = await self._call(
            self.transcripts.ReleaseTurnLease,
            transcript_pb.ReleaseTurnLeaseRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                turn_id=turn_id,
                fencing_token=fencing_token,
                ended=ended,
            ),
        )
        return reply.released

    # -- summaries (SummaryService) ------------------------------------------------------

    async def get_summary(
        self, conversation_id: str, *, namespace: str | None = None
    ) -> summary_pb.Summary | None:
        """The current summary, or None."""
        reply = await self._call(
            self.summaries.GetSummary,
            summary_pb.GetSummaryRequest(
                namespace=self._ns(namespace), conversation_id=conversation_id
            ),
        )
        return reply.summary if reply.HasField("summary") else None

    async def commit_summary(
        self,
        conversation_id: str,
        text: str,
        through_sequence: int,
        *,
        namespace: str | None = None,
        expected_through_sequence: int | None = None,
    ) -> summary_pb.Summary:
        """Commit a summary of 1..through_sequence (monotonic; compare-and-swap on
        `expected_through_sequence` when given)."""
        request = summary_pb.CommitSummaryRequest(
            namespace=self._ns(namespace),
            conversation_id=conversation_id,
            text=text,
            through_sequence=through_sequence,
        )
        if expected_through_sequence is not None:
            request.expected_through_sequence = expected_through_sequence
        reply = await self._call(self.summaries.CommitSummary, request)
        return reply.summary

    async def summarize(
        self,
        conversation_id: str,
        *,
        namespace: str | None = None,
        window: int = 16,
        summary_batch: int = 64,
        max_summary_passes: int = 1,
        budget: Budget | None = None,
        timeout: float | None = None,
    ) -> summary_pb.SummarizeResponse:
        """Run the summarizer now (never retried: its passes would spend model calls again)."""
        return await self._call(
            self.summaries.Summarize,
            summary_pb.SummarizeRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                window=window,
                summary_batch=summary_batch,
                max_summary_passes=max_summary_passes,
                budget=(budget or Budget()).to_proto(),
            ),
            timeout,
        )

    async def request_summary(
        self,
        conversation_id: str,
        *,
        namespace: str | None = None,
        window: int = 16,
        summary_batch: int = 64,
    ) -> summary_pb.RequestSummaryResponse:
        """Enqueue background summarization (one pending job per conversation)."""
        return await self._call(
            self.summaries.RequestSummary,
            summary_pb.RequestSummaryRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                window=window,
                summary_batch=summary_batch,
            ),
        )

    async def backlog(self, *, namespace: str | None = None) -> summary_pb.GetBacklogResponse:
        """The summary job queue of a namespace."""
        return await self._call(
            self.summaries.GetBacklog, summary_pb.GetBacklogRequest(namespace=self._ns(namespace))
        )

    async def erase_summaries(
        self, conversation_id: str, *, namespace: str | None = None, incarnation: int = 0
    ) -> int:
        """Erase every summary and summary job of a conversation; the rows erased."""
        reply = await self._call(
            self.summaries.EraseSummaries,
            summary_pb.EraseSummariesRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                incarnation=incarnation,
            ),
        )
        return int(reply.erased)

    # -- memories (MemoryService) --------------------------------------------------------

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
            ttl=_duration(ttl),
            expire_time=_timestamp(expire_time),
            valid_from_time=_timestamp(valid_from),
            valid_until_time=_timestamp(valid_until),
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
    ) -> AsyncIterator[memory_pb.Memory]:
        """Every memory of a namespace (only those from one conversation when given)."""
        token = ""
        while True:
            reply = await self._call(
                self.memories.ListMemories,
                memory_pb.ListMemoriesRequest(
                    namespace=self._ns(namespace),
                    conversation_id=conversation_id,
                    page_size=page_size,
                    page_token=token,
                ),
            )
            for memory in reply.memories:
                yield memory
            token = reply.next_page_token
            if not token:
                return

    async def search_memories(
        self,
        query: str,
        *,
        namespace: str | None = None,
        limit: int = 8,
        metadata_filter: Mapping[str, str] | None = None,
        min_score: float = 0.0,
        mode: str = "",
    ) -> memory_pb.SearchMemoriesResponse:
        """Search inside one namespace (`limit` 1..256). `mode`: "dense" (the embedding
        model's cosine), "lexical" (BM25 over the words), "hybrid" (both fused), or ""
        (the server's default)."""
        modes = {
            "": memory_pb.SEARCH_MODE_UNSPECIFIED,
            "dense": memory_pb.SEARCH_MODE_DENSE,
            "lexical": memory_pb.SEARCH_MODE_LEXICAL,
            "hybrid": memory_pb.SEARCH_MODE_HYBRID,
        }
        if mode not in modes:
            raise ValueError(f"mode must be one of {', '.join(repr(m) for m in modes)}")
        return await self._call(
            self.memories.SearchMemories,
            memory_pb.SearchMemoriesRequest(
                namespace=self._ns(namespace),
                query=query,
                limit=limit,
                metadata_filter=metadata_filter,
                min_score=min_score,
                mode=modes[mode],
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
        conversation_id: str,
        *,
        namespace: str | None = None,
        from_sequence: int = 0,
        through_sequence: int = 0,
        incarnation: int = 0,
    ) -> int:
        """Delete every memory derived from a conversation (or a range of it); the count."""
        reply = await self._call(
            self.memories.ForgetSource,
            memory_pb.ForgetSourceRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                from_sequence=from_sequence,
                through_sequence=through_sequence,
                incarnation=incarnation,
            ),
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
        metadata_filter: Mapping[str, str] | None = None,
    ) -> memory_pb.ProposeMemoriesResponse:
        """Proposals of memories from a transcript range; nothing is stored until you
        confirm one (`confirm_proposal`). `metadata_filter`: only stored memories with
        these pairs are matched (and shown to the proposer). Each source names the
        conversation's incarnation: NotFound (CONVERSATION_ERASED) when the conversation
        was erased while the proposals were made."""
        return await self._call(
            self.memories.ProposeMemories,
            _propose(
                self._ns(namespace),
                conversation_id,
                from_sequence,
                through_sequence,
                max_proposals,
                budget,
                metadata_filter,
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


# -- the blocking client: the methods above, run on a loop of its own ---------------------


def _blocking(
    method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Client, P], R]:
    """The blocking form of an AsyncClient coroutine method."""

    @functools.wraps(method)
    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._run(method(self.aio, *args, **kwargs))

    return call


def _iterating(
    method: Callable[Concatenate[AsyncClient, P], AsyncIterator[T]],
) -> Callable[Concatenate[Client, P], Iterator[T]]:
    """The blocking form of an AsyncClient async-iterator method."""

    @functools.wraps(method)
    def call(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._iterate(method(self.aio, *args, **kwargs))

    return call


def _shutdown(loop: asyncio.AbstractEventLoop, thread: threading.Thread, aio: AsyncClient) -> None:
    """Close the channel, stop the loop and its thread (close(), or a forgotten client)."""
    if loop.is_closed():
        return
    if loop.is_running():
        asyncio.run_coroutine_threadsafe(aio.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
    loop.close()


class Client:
    """Blocking client with the methods of AsyncClient (and the same arguments).

    >>> client = Client("127.0.0.1:50051", namespace="tenant-42")
    >>> result = client.run_conversation("What did we decide?", conversation_id=cid,
    ...     policy=ConversationContextPolicy(window=16).with_semantic_memory(8))

    It owns an AsyncClient (`aio`) on an event loop in a background thread: calls from
    several threads share one channel, and a Client works inside an async program too.
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
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="runifold-client", daemon=True
        )
        self._thread.start()

        self.aio = AsyncClient(  # used only on the client's own loop
            target,
            namespace=namespace,
            token=token,
            credentials=credentials,
            timeout=timeout,
            max_attempts=max_attempts,
        )
        self._finalizer = weakref.finalize(self, _shutdown, self._loop, self._thread, self.aio)

    @property
    def namespace(self) -> str:
        """The default namespace of every call."""
        return self.aio.namespace

    @namespace.setter
    def namespace(self, value: str) -> None:
        self.aio.namespace = value

    @property
    def target(self) -> str:
        return self.aio.target

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel and stop the client's thread."""
        self._finalizer()

    def _run(self, coroutine: Coroutine[Any, Any, R]) -> R:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        async def step() -> tuple[bool, T | None]:
            try:
                return True, await anext(items)
            except StopAsyncIteration:
                return False, None

        async def close() -> None:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()

        try:
            while True:
                more, item = self._run(step())
                if not more:
                    return
                yield item  # type: ignore[misc]
        finally:
            if not self._loop.is_closed():
                self._run(close())

    run_conversation = _blocking(AsyncClient.run_conversation)
    stream_conversation = _iterating(AsyncClient.stream_conversation)
    erase_conversation = _blocking(AsyncClient.erase_conversation)
    create_conversation = _blocking(AsyncClient.create_conversation)
    create_conversation_reply = _blocking(AsyncClient.create_conversation_reply)
    get_state = _blocking(AsyncClient.get_state)
    get_conversation = _blocking(AsyncClient.get_conversation)
    list_conversations = _iterating(AsyncClient.list_conversations)
    append = _blocking(AsyncClient.append)
    entries = _iterating(AsyncClient.entries)
    watch_conversation = _iterating(AsyncClient.watch_conversation)
    load_view = _blocking(AsyncClient.load_view)
    delete_conversation = _blocking(AsyncClient.delete_conversation)
    acquire_turn_lease = _blocking(AsyncClient.acquire_turn_lease)
    renew_turn_lease = _blocking(AsyncClient.renew_turn_lease)
    release_turn_lease = _blocking(AsyncClient.release_turn_lease)
    get_summary = _blocking(AsyncClient.get_summary)
    commit_summary = _blocking(AsyncClient.commit_summary)
    summarize = _blocking(AsyncClient.summarize)
    request_summary = _blocking(AsyncClient.request_summary)
    backlog = _blocking(AsyncClient.backlog)
    erase_summaries = _blocking(AsyncClient.erase_summaries)
    upsert_memory = _blocking(AsyncClient.upsert_memory)
    remember = _blocking(AsyncClient.remember)
    get_memory = _blocking(AsyncClient.get_memory)
    list_memories = _iterating(AsyncClient.list_memories)
    search_memories = _blocking(AsyncClient.search_memories)
    delete_memory = _blocking(AsyncClient.delete_memory)
    forget_source = _blocking(AsyncClient.forget_source)
    propose_memories = _blocking(AsyncClient.propose_memories)
    confirm_proposal = _blocking(AsyncClient.confirm_proposal)
    memory_revisions = _iterating(AsyncClient.memory_revisions)
