"""SummaryService on the wire: protobuf <-> domain conversion only.

Errors are DomainErrors raised by the domain; the shared interceptor maps
them to status codes with ErrorInfo.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.duration_pb2 import Duration

from runifold.summary.v1 import summary_service_pb2 as pb
from runifold.summary.v1 import summary_service_pb2_grpc as pb_grpc
from services.common import convert
from services.summary.jobs.model import Job
from services.summary.model import Summary
from services.summary.service import SummaryService

Context = Any  # grpc.aio.ServicerContext; unused by these handlers


def summary_to_proto(summary: Summary) -> pb.Summary:
    """The wire form of a summary."""
    return pb.Summary(
        conversation_id=str(summary.conversation_id),
        namespace=summary.namespace,
        text=summary.text,
        through_sequence=summary.through_sequence,
        create_time=convert.timestamp(summary.create_time),
        revision=summary.revision,
    )


def job_to_proto(job: Job) -> pb.SummaryJob:
    """The wire form of a job."""
    return pb.SummaryJob(
        job_id=str(job.job_id),
        conversation_id=str(job.conversation_id),
        namespace=job.namespace,
        state=int(job.state),  # type: ignore[arg-type]
        attempts=job.attempts,
        create_time=convert.timestamp(job.create_time),
    )


class SummaryServicer(pb_grpc.SummaryServiceServicer):
    """gRPC adapter of the summary domain service."""

    def __init__(self, service: SummaryService) -> None:
        self.service = service

    async def GetSummary(
        self, request: pb.GetSummaryRequest, context: Context
    ) -> pb.GetSummaryResponse:
        summary = await self.service.get_summary(request.namespace, request.conversation_id)
        return pb.GetSummaryResponse(summary=summary_to_proto(summary) if summary else None)

    async def CommitSummary(
        self, request: pb.CommitSummaryRequest, context: Context
    ) -> pb.CommitSummaryResponse:
        result = await self.service.commit_summary(
            request.namespace,
            request.conversation_id,
            request.text,
            request.through_sequence,
            request.expected_through_sequence
            if request.HasField("expected_through_sequence")
            else None,
        )
        return pb.CommitSummaryResponse(summary=summary_to_proto(result.summary))

    async def Summarize(
        self, request: pb.SummarizeRequest, context: Context
    ) -> pb.SummarizeResponse:
        result = await self.service.summarize(
            request.namespace,
            request.conversation_id,
            request.window,
            request.summary_batch,
            request.max_summary_passes,
            convert.budget_from_proto(request.budget),
        )
        return pb.SummarizeResponse(
            summary=summary_to_proto(result.summary) if result.summary else None,
            passes=result.passes,
            backlog=result.backlog,
            usage=convert.usage_to_proto(result.usage),
        )

    async def RequestSummary(
        self, request: pb.RequestSummaryRequest, context: Context
    ) -> pb.RequestSummaryResponse:
        job, created = await self.service.request_summary(
            request.namespace, request.conversation_id, request.window, request.summary_batch
        )
        return pb.RequestSummaryResponse(job=job_to_proto(job), created=created)

    async def GetBacklog(
        self, request: pb.GetBacklogRequest, context: Context
    ) -> pb.GetBacklogResponse:
        backlog = await self.service.get_backlog(request.namespace)
        age = Duration()
        age.FromNanoseconds(int(backlog.oldest_pending_age_s * 1e9))
        return pb.GetBacklogResponse(
            depth=backlog.depth,
            oldest_pending_age=age,
            failed_count=backlog.failed_count,
            running_count=backlog.running_count,
        )

    async def EraseSummaries(
        self, request: pb.EraseSummariesRequest, context: Context
    ) -> pb.EraseSummariesResponse:
        erased = await self.service.erase(
            request.namespace, request.conversation_id, request.incarnation
        )
        return pb.EraseSummariesResponse(
            erased=erased.rows, summaries_erased=erased.summaries, jobs_erased=erased.jobs
        )
