"""AgentService's calls: a turn (whole, or streamed) and erasing a conversation everywhere."""

from __future__ import annotations

import enum
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import grpc

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.common.v1 import common_pb2
from runifold_client.client.connection import Connection
from runifold_client.errors import Outcome
from runifold_client.policy import Budget, ConversationContextPolicy, InputLike, Tool, messages


class ConcurrencyMode(enum.IntEnum):
    """How a turn shares its conversation with other turns (runifold.agent.v1.ConcurrencyMode).

    RACE: turns run side by side, the first to commit wins (the others get TurnConflict).
    REJECT: a turn that finds another running fails at once with ConversationBusy.
    ENQUEUE: a turn waits for the turns ahead of it, then runs on what they committed.
    """

    RACE = agent_pb.CONCURRENCY_MODE_RACE
    REJECT = agent_pb.CONCURRENCY_MODE_REJECT
    ENQUEUE = agent_pb.CONCURRENCY_MODE_ENQUEUE


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


class AgentCalls(Connection):
    """The methods of AgentService."""

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
        (gRPC's, or yours with the same id) returns the first outcome. The default
        policy (`ConversationContextPolicy()`) summarizes within the turn when the
        server's background queue has not kept the summary ahead, so a chat loop never
        meets SummaryRequired; a policy `with_summary_required()` gets it instead.
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
            raise self._failure(error) from None

    async def erase_conversation(
        self, conversation_id: str, *, namespace: str | None = None
    ) -> agent_pb.EraseConversationResponse:
        """Erase a conversation everywhere (entries, summaries, jobs, derived memories);
        the response's `receipt` says what was erased in each store (counts, no content)."""
        return await self._call(
            self.agent.EraseConversation,
            agent_pb.EraseConversationRequest(
                conversation_id=conversation_id, namespace=self._ns(namespace)
            ),
        )

    async def erasure_receipt(
        self, receipt_id: str = "", *, conversation_id: str = "", namespace: str | None = None
    ) -> agent_pb.ErasureReceipt:
        """The receipt of an erasure, by its id (or the latest of `conversation_id`):
        counts per store, and `complete_time` once the vector index caught up too."""
        reply = await self._call(
            self.agent.GetErasureReceipt,
            agent_pb.GetErasureReceiptRequest(
                namespace=self._ns(namespace),
                receipt_id=receipt_id,
                conversation_id=conversation_id,
            ),
        )
        return reply.receipt
