"""Behaviour of the summary store and domain, run against every SummaryStore.

tests/unit runs these cases on the in-memory store, tests/integration on
PostgreSQL: both stores must give the domain the same guarantees. The
transcript side is the real TranscriptService domain on its in-memory store,
reached through `LocalTranscripts` (the end-to-end tests use gRPC instead).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import replace

import pytest

from services.common.domain import Entry, Message, Role, ToolCall
from services.common.errors import Code, DomainError
from services.common.pagination import PageTokens
from services.summary.config import SummaryConfig
from services.summary.jobs.model import JobState, NewJob
from services.summary.model import ConversationState, NewSummary, TranscriptView
from services.summary.service import SummaryService
from services.summary.store import SummaryStore
from services.summary.summarizers.offline import OfflineSummarizer
from services.summary.summarizers.prompt import Summarizer
from services.transcript.config import TranscriptLimits
from services.transcript.service import TranscriptService
from tests.transcript.double import InMemoryTranscriptStore


class LocalTranscripts:
    """The Transcripts port over an in-process TranscriptService (unit tests only)."""

    def __init__(self, service: TranscriptService | None = None) -> None:
        self.service = service or TranscriptService(
            InMemoryTranscriptStore(), TranscriptLimits(), PageTokens(b"secret-for-tests-0123")
        )

    async def conversation(self, namespace: str, conversation_id: uuid.UUID) -> ConversationState:
        conversation = await self.service.get_conversation(namespace, str(conversation_id))
        return ConversationState(conversation.last_sequence, conversation.incarnation)

    async def entry_after(
        self, namespace: str, conversation_id: uuid.UUID, sequence: int
    ) -> Entry | None:
        page = await self.service.list_entries(namespace, str(conversation_id), sequence, 0, 1, "")
        return page.entries[0] if page.entries else None

    async def load_view(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        window: int,
        summary_batch: int,
        summarized_through: int,
    ) -> TranscriptView:
        view = await self.service.load_view(
            namespace, str(conversation_id), window, summary_batch, summarized_through
        )
        return TranscriptView(view.summary_buffer, view.summary_backlog, view.incarnation)


def user(text: str) -> Message:
    return Message(Role.USER, text)


def assistant(text: str, *calls: str) -> Message:
    return Message(
        Role.ASSISTANT, text, tool_calls=tuple(ToolCall(c, "lookup", '{"q": 1}') for c in calls)
    )


def tool(call_id: str, text: str = "result") -> Message:
    return Message(Role.TOOL, text, tool_call_id=call_id)


def chat(count: int, start: int = 1) -> list[Message]:
    """`count` alternating user and assistant messages."""
    return [
        user(f"question {i}") if i % 2 else assistant(f"answer {i}")
        for i in range(start, start + count)
    ]


async def new_conversation(
    transcripts: LocalTranscripts, namespace: str, messages: Sequence[Message] = ()
) -> str:
    conversation, _ = await transcripts.service.create_conversation(namespace, "", {})
    cid = str(conversation.conversation_id)
    for offset in range(0, len(messages), 256):
        await transcripts.service.append(namespace, cid, None, messages[offset : offset + 256], "")
    return cid


def make_service(
    store: SummaryStore,
    transcripts: LocalTranscripts | None = None,
    summarizer: Summarizer | None = None,
    config: SummaryConfig | None = None,
    **overrides: object,
) -> SummaryService:
    return SummaryService(
        store,
        transcripts or LocalTranscripts(),
        summarizer or OfflineSummarizer(),
        replace(config or SummaryConfig(), **overrides),  # type: ignore[arg-type]
    )


def new_job(namespace: str, cid: uuid.UUID, window: int = 4, batch: int = 8) -> NewJob:
    return NewJob(uuid.uuid4(), namespace, cid, window, batch)


class SummaryStoreCases:
    """Subclasses provide a `store` fixture (a SummaryStore with history_limit 3)."""

    async def test_commits_only_move_forward(self, store: SummaryStore, namespace: str) -> None:
        cid = uuid.uuid4()
        first = await store.commit_summary(NewSummary(namespace, cid, "one", 4, None))
        assert first.written and first.summary.revision == 1
        second = await store.commit_summary(NewSummary(namespace, cid, "two", 9, 4))
        assert second.summary.revision == 2 and second.summary.through_sequence == 9
        with pytest.raises(DomainError) as stale:
            await store.commit_summary(NewSummary(namespace, cid, "older", 6, None))
        assert stale.value.reason == "SUMMARY_NOT_NEWER"
        assert stale.value.code is Code.FAILED_PRECONDITION
        with pytest.raises(DomainError) as conflict:
            await store.commit_summary(NewSummary(namespace, cid, "three", 12, 4))
        assert conflict.value.code is Code.ABORTED
        assert conflict.value.reason == "SUMMARY_CONFLICT"
        assert conflict.value.metadata["current_through_sequence"] == "9"
        replay = await store.commit_summary(NewSummary(namespace, cid, "two", 9, 4))
        assert not replay.written and replay.summary.revision == 2
        current = await store.get_summary(namespace, cid)
        assert current is not None and (current.text, current.through_sequence) == ("two", 9)
        assert await store.get_summary("another-namespace", cid) is None

    async def test_history_keeps_the_newest_replaced_summaries(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()
        for through in range(1, 7):
            await store.commit_summary(NewSummary(namespace, cid, f"s{through}", through, None))
        history = await store.summary_history(namespace, cid)
        assert [(s.revision, s.text) for s in history] == [(3, "s3"), (4, "s4"), (5, "s5")]

    async def test_racing_commits_never_regress(self, store: SummaryStore, namespace: str) -> None:
        cid = uuid.uuid4()
        throughs = list(range(1, 41))

        async def commit(through: int) -> None:
            try:
                await store.commit_summary(NewSummary(namespace, cid, f"s{through}", through, None))
            except DomainError as error:
                assert error.reason == "SUMMARY_NOT_NEWER"

        await asyncio.gather(*(commit(t) for t in reversed(throughs)))
        current = await store.get_summary(namespace, cid)
        assert current is not None and current.through_sequence == 40
        revisions = [*await store.summary_history(namespace, cid), current]
        assert [s.revision for s in revisions] == sorted(s.revision for s in revisions)
        sequence = [s.through_sequence for s in revisions]
        assert sequence == sorted(set(sequence))

    async def test_racing_compare_and_swap_has_one_winner(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()

        async def commit(i: int) -> bool:
            try:
                await store.commit_summary(NewSummary(namespace, cid, f"w{i}", 10 + i, 0))
                return True
            except DomainError as error:
                assert error.reason == "SUMMARY_CONFLICT"
                return False

        wins = await asyncio.gather(*(commit(i) for i in range(16)))
        assert sum(wins) == 1
        current = await store.get_summary(namespace, cid)
        assert current is not None and current.revision == 1

    async def test_enqueue_keeps_one_active_job_per_conversation(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()
        results = await asyncio.gather(*(store.enqueue(new_job(namespace, cid)) for _ in range(8)))
        assert sum(created for _, created in results) == 1
        assert len({job.job_id for job, _ in results}) == 1
        assert (await store.backlog(namespace)).depth == 1

    async def test_claim_complete_and_a_request_while_running(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()
        job, _ = await store.enqueue(new_job(namespace, cid))
        claimed = await store.claim("w1", 30)
        assert claimed is not None and claimed.job_id == job.job_id
        assert claimed.state is JobState.RUNNING and claimed.attempts == 1
        assert claimed.claimed_by == "w1" and claimed.lease_token is not None
        assert await store.claim("w2", 30) is None
        backlog = await store.backlog(namespace)
        assert (backlog.depth, backlog.running_count) == (1, 1)
        again, created = await store.enqueue(new_job(namespace, cid))
        assert not created and again.job_id == job.job_id
        assert await store.complete(job.job_id, claimed.lease_token, requeue=False) is (
            JobState.PENDING
        )
        reclaimed = await store.claim("w2", 30)
        assert reclaimed is not None and reclaimed.job_id == job.job_id
        assert reclaimed.lease_token is not None
        assert await store.complete(job.job_id, reclaimed.lease_token, requeue=False) is (
            JobState.DONE
        )
        assert (await store.backlog(namespace)).depth == 0
        _, created = await store.enqueue(new_job(namespace, cid))
        assert created

    async def test_a_stale_lease_cannot_change_the_job(
        self, store: SummaryStore, namespace: str
    ) -> None:
        job, _ = await store.enqueue(new_job(namespace, uuid.uuid4()))
        claimed = await store.claim("w1", 0.01)
        assert claimed is not None and claimed.lease_token is not None
        await asyncio.sleep(0.05)  # let the lease lapse (a duration, not a condition)
        taken = await store.claim("w2", 30)
        assert taken is not None and taken.job_id == job.job_id
        assert taken.failures == 1 and taken.last_error == "LEASE_EXPIRED"
        assert taken.attempts == 2
        assert not await store.extend_lease(job.job_id, claimed.lease_token, 30)
        assert await store.complete(job.job_id, claimed.lease_token, requeue=False) is None
        assert taken.lease_token is not None
        assert await store.extend_lease(job.job_id, taken.lease_token, 30)

    async def test_failures_retry_later_then_park(
        self, store: SummaryStore, namespace: str
    ) -> None:
        job, _ = await store.enqueue(new_job(namespace, uuid.uuid4()))
        claimed = await store.claim("w1", 30)
        assert claimed is not None and claimed.lease_token is not None
        state = await store.fail(
            job.job_id,
            claimed.lease_token,
            "MODEL_FAILED",
            counted=True,
            park=False,
            retry_in_s=3600,
        )
        assert state is JobState.PENDING
        assert await store.claim("w1", 30) is None  # not due for an hour
        stored = await store.get_job(job.job_id)
        assert stored is not None and (stored.failures, stored.last_error) == (1, "MODEL_FAILED")
        assert (await store.backlog(namespace)).depth == 1

        other, _ = await store.enqueue(new_job(namespace, uuid.uuid4()))
        claimed = await store.claim("w1", 30)
        assert claimed is not None and claimed.job_id == other.job_id
        assert claimed.lease_token is not None
        state = await store.fail(
            other.job_id,
            claimed.lease_token,
            "SUMMARY_INVALID",
            counted=True,
            park=True,
            retry_in_s=0,
        )
        assert state is JobState.FAILED
        backlog = await store.backlog(namespace)
        assert (backlog.depth, backlog.failed_count) == (1, 1)
        assert await store.prune_jobs(3600) == 0

    async def test_release_gives_the_job_back_uncounted(
        self, store: SummaryStore, namespace: str
    ) -> None:
        job, _ = await store.enqueue(new_job(namespace, uuid.uuid4()))
        claimed = await store.claim("w1", 30)
        assert claimed is not None and claimed.lease_token is not None
        assert await store.release(job.job_id, claimed.lease_token)
        again = await store.claim("w2", 30)
        assert again is not None and again.job_id == job.job_id and again.attempts == 1

    async def test_an_erased_incarnation_refuses_commits_and_jobs(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()
        await store.commit_summary(NewSummary(namespace, cid, "a", 1, None, incarnation=7))
        assert await store.erase_conversation(namespace, cid, 7) == 1
        with pytest.raises(DomainError) as commit:
            await store.commit_summary(NewSummary(namespace, cid, "late", 2, 0, incarnation=7))
        assert (commit.value.code, commit.value.reason) == (Code.NOT_FOUND, "CONVERSATION_ERASED")
        with pytest.raises(DomainError) as job:
            await store.enqueue(replace(new_job(namespace, cid), incarnation=7))
        assert job.value.reason == "CONVERSATION_ERASED"
        assert await store.get_summary(namespace, cid) is None
        # The id made again (another incarnation) is a conversation like any other.
        made = await store.commit_summary(NewSummary(namespace, cid, "new", 1, 0, incarnation=8))
        assert made.summary.incarnation == 8 and made.summary.revision == 1
        _, created = await store.enqueue(replace(new_job(namespace, cid), incarnation=8))
        assert created

    async def test_a_summary_of_an_earlier_incarnation_is_replaced_not_extended(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()
        await store.commit_summary(NewSummary(namespace, cid, "old a", 5, None, incarnation=1))
        await store.commit_summary(NewSummary(namespace, cid, "old b", 9, None, incarnation=1))
        # Shorter than the old one, with a compare-and-swap on "no summary": accepted.
        fresh = await store.commit_summary(NewSummary(namespace, cid, "new", 2, 0, incarnation=2))
        assert (fresh.summary.through_sequence, fresh.summary.revision) == (2, 1)
        assert await store.summary_history(namespace, cid) == []

    async def test_purge_erases_summaries_history_and_jobs(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()
        await store.commit_summary(NewSummary(namespace, cid, "a", 1, None))
        await store.commit_summary(NewSummary(namespace, cid, "b", 2, None))
        await store.enqueue(new_job(namespace, cid))
        await store.erase_conversation(namespace, cid, 0)
        assert await store.get_summary(namespace, cid) is None
        assert await store.summary_history(namespace, cid) == []
        assert (await store.backlog(namespace)).depth == 0
