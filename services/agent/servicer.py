"""AgentService on the wire: protobuf <-> domain conversion only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from runifold.agent.v1 import agent_service_pb2 as pb
from runifold.agent.v1 import agent_service_pb2_grpc as pb_grpc
from runifold.common.v1 import common_pb2
from services.agent import erasure
from services.agent.model import (
    ContextReport,
    ModelOutputInvalid,
    Outcome,
    Progress,
    Receipt,
    TextDelta,
    Turn,
    TurnNotCommitted,
    TurnResult,
)
from services.agent.service import AgentService
from services.agent.turn import inputs
from services.common import convert

Context = Any

TurnRequest = pb.RunConversationRequest | pb.StreamConversationRequest


def outcome_to_proto(outcome: Outcome) -> pb.TurnOutcome:
    """The wire form of a turn's outcome."""
    return pb.TurnOutcome(
        output=[convert.message_to_proto(m) for m in outcome.output],
        usage=convert.usage_to_proto(outcome.usage),
    )


def _context(report: ContextReport) -> pb.ContextReport:
    return pb.ContextReport(
        summary_through_sequence=report.summary_through_sequence,
        memory_ids=list(report.memory_ids),
        window_first_sequence=report.window_first_sequence,
        window_last_sequence=report.window_last_sequence,
        summary_passes=report.summary_passes,
        memory_degraded=report.memory_degraded,
    )


def receipt_to_proto(receipt: Receipt) -> pb.ErasureReceipt:
    """The wire form of an erasure receipt (its counts by name, as fields)."""
    counts = receipt.counts
    return pb.ErasureReceipt(
        receipt_id=receipt.receipt_id,
        conversation_id=receipt.conversation_id,
        namespace=receipt.namespace,
        incarnation=receipt.incarnation,
        create_time=convert.timestamp(receipt.create_time),
        complete_time=convert.timestamp(receipt.complete_time),
        remaining=list(receipt.remaining),
        entries=counts.get(erasure.ENTRIES, 0),
        appends=counts.get(erasure.APPENDS, 0),
        summaries=counts.get(erasure.SUMMARIES, 0),
        summary_jobs=counts.get(erasure.SUMMARY_JOBS, 0),
        curation_jobs=counts.get(erasure.CURATION_JOBS, 0),
        memories=counts.get(erasure.MEMORIES, 0),
        memory_revisions=counts.get(erasure.MEMORY_REVISIONS, 0),
        index_points=counts.get(erasure.INDEX_POINTS, 0),
        forks=counts.get(erasure.FORKS, 0),
        checkpoints=counts.get(erasure.CHECKPOINTS, 0),
    )


def result_to_proto(result: TurnResult) -> pb.RunConversationResponse:
    """The wire form of a committed turn."""
    return pb.RunConversationResponse(
        conversation_id=result.conversation_id,
        conversation_version=result.conversation_version,
        first_sequence=result.first_sequence,
        last_sequence=result.last_sequence,
        outcome=outcome_to_proto(result.outcome),
        tool_calls=[
            common_pb2.ToolCall(id=c.id, name=c.name, arguments_json=c.arguments_json)
            for c in result.tool_calls
        ],
        context=_context(result.context),
        replayed=result.replayed,
        created=result.created,
    )


class AgentServicer(pb_grpc.AgentServiceServicer):
    """gRPC adapter of the orchestrator."""

    def __init__(self, service: AgentService) -> None:
        self.service = service

    def _turn(self, request: TurnRequest) -> Turn:
        # The counts before the conversion: an oversized turn costs no more than this.
        inputs.check_counts(len(request.input), len(request.tools), self.service.config)
        policy = request.policy
        return Turn(
            namespace=request.namespace,
            conversation_id=request.conversation_id,
            input=convert.messages_from_proto(request.input, "input"),
            turn_id=request.turn_id,
            policy=self.service.policy(
                policy.window,
                policy.summary_batch,
                policy.memory_limit,
                int(policy.summary_mode),
                policy.max_summary_passes,
                int(policy.curation),
                request.namespace,
            ),
            budget=self.service.budget(convert.budget_from_proto(request.budget)),
            system_instructions=request.system_instructions,
            create_if_missing=request.create_if_missing,
            tools=convert.tools_from_proto(request.tools),
            concurrency=self.service.concurrency(int(request.concurrency)),
        )

    @staticmethod
    def _with_detail(
        error: TurnNotCommitted | ModelOutputInvalid,
    ) -> TurnNotCommitted | ModelOutputInvalid:
        """The completed outcome as the error's detail (TurnConflict or ModelOutputInvalid)."""
        if isinstance(error, ModelOutputInvalid):
            error.details = (
                pb.ModelOutputInvalid(
                    outcome=outcome_to_proto(error.outcome), violations=list(error.violations)
                ),
            )
        else:
            error.details = (
                pb.TurnConflict(
                    outcome=outcome_to_proto(error.outcome),
                    current_version=error.current_version,
                    expected_version=error.expected_version,
                ),
            )
        return error

    async def RunConversation(
        self, request: pb.RunConversationRequest, context: Context
    ) -> pb.RunConversationResponse:
        try:
            result = await self.service.run(self._turn(request))
        except (TurnNotCommitted, ModelOutputInvalid) as error:
            raise self._with_detail(error) from None
        return result_to_proto(result)

    async def StreamConversation(
        self, request: pb.StreamConversationRequest, context: Context
    ) -> AsyncIterator[pb.StreamConversationResponse]:
        try:
            async for event in self.service.events(self._turn(request), stream=True):
                if isinstance(event, Progress):
                    yield pb.StreamConversationResponse(
                        progress=pb.TurnProgress(stage=int(event.stage))  # type: ignore[arg-type]
                    )
                elif isinstance(event, TextDelta):
                    yield pb.StreamConversationResponse(text_delta=pb.TextDelta(text=event.text))
                else:
                    yield pb.StreamConversationResponse(result=result_to_proto(event))
        except (TurnNotCommitted, ModelOutputInvalid) as error:
            raise self._with_detail(error) from None

    async def EraseConversation(
        self, request: pb.EraseConversationRequest, context: Context
    ) -> pb.EraseConversationResponse:
        erased = await self.service.erase(request.namespace, request.conversation_id)
        return pb.EraseConversationResponse(
            complete=erased.complete,
            memories_deleted=erased.memories_deleted,
            entries_deleted=erased.entries_deleted,
            summaries_erased=erased.summaries_erased,
            summaries_deleted=erased.summaries_deleted,
            remaining=list(erased.remaining),
            receipt=receipt_to_proto(erased.receipt) if erased.receipt else None,
        )

    async def GetErasureReceipt(
        self, request: pb.GetErasureReceiptRequest, context: Context
    ) -> pb.GetErasureReceiptResponse:
        found = await self.service.receipt(
            request.namespace, request.receipt_id, request.conversation_id
        )
        return pb.GetErasureReceiptResponse(receipt=receipt_to_proto(found))
