"""SummaryService's calls: the current summary, committing one, summarizing now or in the
background, the job queue, and erasing a conversation's summaries."""

from __future__ import annotations

from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold_client.client.connection import Connection
from runifold_client.policy import Budget


class SummaryCalls(Connection):
    """The methods of SummaryService."""

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
