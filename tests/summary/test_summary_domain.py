"""Summary domain rules on the in-memory stores: commits, passes, budgets, output checks
(the job queue's workers: jobs/test_jobs_domain.py; the offline digest:
summarizers/test_offline.py)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from services.common.channels import deadline_var
from services.common.domain import Budget, Role, Usage
from services.common.errors import Code, DomainError
from services.summary.store import SummaryStore
from services.summary.summarizers.prompt import SummaryOutput, SummaryPrompt
from tests.summary.cases import SummaryStoreCases
from tests.summary.double import InMemorySummaryStore
from tests.summary.support import (
    LocalTranscripts,
    Scripted,
    assistant,
    chat,
    make_service,
    new_conversation,
    reason,
    tool,
    user,
)


class TestSummaryStoreInMemory(SummaryStoreCases):
    @pytest.fixture
    def store(self) -> SummaryStore:
        return InMemorySummaryStore(history_limit=3)


# -- CommitSummary -------------------------------------------------------------------


async def test_commit_checks_the_transcript(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    service = make_service(store, transcripts)
    cid = await new_conversation(
        transcripts, namespace, [user("q"), assistant("", "c1"), tool("c1"), assistant("done")]
    )
    bad = {
        "through 0": ("text", 0, None, "INVALID_SEQUENCE"),
        "beyond": ("text", 5, None, "SEQUENCE_OUT_OF_RANGE"),
        "splits a tool call": ("text", 2, None, "SPLITS_TOOL_CALL"),
        "empty": ("  ", 1, None, "INVALID_SUMMARY_TEXT"),
        "nul": ("a\x00b", 1, None, "INVALID_SUMMARY_TEXT"),
        "oversize": ("x" * (64 * 1024 + 1), 1, None, "SUMMARY_TOO_LARGE"),
        "negative expected": ("text", 1, -1, "INVALID_SEQUENCE"),
    }
    for case, (text, through, expected, why) in bad.items():
        with pytest.raises(DomainError) as error:
            await service.commit_summary(namespace, cid, text, through, expected)
        assert reason(error) == (Code.INVALID_ARGUMENT, why), case
    assert await service.get_summary(namespace, cid) is None

    committed = await service.commit_summary(namespace, cid, "covered 3", 3, 0)
    assert committed.summary.through_sequence == 3
    with pytest.raises(DomainError) as not_newer:
        await service.commit_summary(namespace, cid, "again", 3, None)
    assert reason(not_newer) == (Code.FAILED_PRECONDITION, "SUMMARY_NOT_NEWER")
    with pytest.raises(DomainError) as missing:
        await service.commit_summary(namespace, str(uuid.uuid4()), "x", 1, None)
    assert reason(missing) == (Code.NOT_FOUND, "CONVERSATION_NOT_FOUND")
    with pytest.raises(DomainError) as elsewhere:
        await service.get_summary("another-namespace", cid)
    assert reason(elsewhere) == (Code.NOT_FOUND, "CONVERSATION_NOT_FOUND")


async def test_a_deleted_and_recreated_conversation_never_sees_the_old_summary(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    """Whatever its length: the old summary is of another incarnation of the id."""
    service = make_service(store, transcripts)
    cid = await new_conversation(transcripts, namespace, chat(4))
    await service.commit_summary(namespace, cid, "s", 2, None)
    await transcripts.service.delete_conversation(namespace, cid)
    with pytest.raises(DomainError) as error:
        await service.get_summary(namespace, cid)
    assert error.value.code is Code.NOT_FOUND
    await transcripts.service.create_conversation(namespace, cid, {})
    await transcripts.service.append(namespace, cid, None, chat(40), "")
    assert await service.get_summary(namespace, cid) is None
    committed = await service.commit_summary(namespace, cid, "new", 1, 0)
    assert committed.summary.revision == 1


# -- Summarize -------------------------------------------------------------------------


async def test_passes_stop_at_the_limit_and_report_the_exact_backlog(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    scripted = Scripted()
    service = make_service(store, transcripts, scripted)
    cid = await new_conversation(transcripts, namespace, chat(100))
    # 100 entries, window 10: 90 outside it; batch 8, 3 passes -> 24 summarized, 66 left.
    result = await service.summarize(namespace, cid, 10, 8, 3, Budget())
    assert (result.passes, result.backlog) == (3, 66)
    assert result.summary is not None and result.summary.through_sequence == 24
    assert result.usage == Usage(300, 30, 3)
    assert [c[1][0] for c in scripted.calls] == [1, 9, 17]
    assert scripted.calls[1][0] == "summary through 8"  # previous summary handed on
    # 66 left = 8 full batches and 2: nine passes finish it.
    result = await service.summarize(namespace, cid, 10, 8, 64, Budget())
    assert (result.passes, result.backlog) == (9, 0)
    assert result.summary is not None and result.summary.through_sequence == 90
    # Nothing to do: no model call.
    calls = len(scripted.calls)
    result = await service.summarize(namespace, cid, 10, 8, 0, Budget())
    assert (result.passes, result.backlog, len(scripted.calls)) == (0, 0, calls)


async def test_a_pass_that_loses_to_a_background_job_is_not_counted(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    """A turn's one pass (AUTO, max_summary_passes 1) races with a job ahead that commits
    first, through 18 of the 19 entries outside a window of 1: the turn's pass is dropped
    and the entry the job left is summarized in the same call, not left as a
    SUMMARY_BACKLOG (issue 29: the jobs ahead run beside AUTO turns)."""
    cid = await new_conversation(transcripts, namespace, chat(20))

    class JobCommitsFirst(Scripted):
        async def summarize(self, prompt: SummaryPrompt, *, timeout: float) -> SummaryOutput:
            output = await super().summarize(prompt, timeout=timeout)
            if len(self.calls) == 1:
                await service.commit_summary(namespace, cid, "the job ahead", 18, None)
            return output

    scripted = JobCommitsFirst()
    service = make_service(store, transcripts, scripted)
    result = await service.summarize(namespace, cid, 1, 64, 1, Budget())
    assert (result.passes, result.backlog) == (1, 0)
    assert result.summary is not None and result.summary.through_sequence == 19
    assert [c[1] for c in scripted.calls] == [list(range(1, 20)), [19]]
    assert scripted.calls[1][0] == "the job ahead"
    assert result.usage == Usage(200, 20, 2)  # both calls charged


async def test_a_pass_never_ends_between_a_tool_call_and_its_results(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    service = make_service(store, transcripts, Scripted())
    messages = [user("q1"), assistant("", "a", "b"), tool("a"), tool("b"), assistant("r1")] * 6
    cid = await new_conversation(transcripts, namespace, messages)
    result = await service.summarize(namespace, cid, 3, 3, 64, Budget())
    assert result.backlog == 0
    roles = {i + 1: m.role for i, m in enumerate(messages)}
    committed = [s.through_sequence for s in await store.summary_history(namespace, uuid.UUID(cid))]
    assert result.summary is not None
    committed.append(result.summary.through_sequence)
    assert len(committed) > 5
    for through in committed:
        assert roles.get(through + 1) != Role.TOOL, through


async def test_bad_summarize_requests_are_invalid_argument(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    service = make_service(store, transcripts, Scripted())
    cid = await new_conversation(transcripts, namespace, chat(10))
    cases = {
        (0, 8, 1): "INVALID_WINDOW",
        (4097, 8, 1): "INVALID_WINDOW",
        (4, 0, 1): "INVALID_SUMMARY_BATCH",
        (4, 4097, 1): "INVALID_SUMMARY_BATCH",
        (4, 8, -1): "INVALID_MAX_SUMMARY_PASSES",
        (4, 8, 65): "INVALID_MAX_SUMMARY_PASSES",
    }
    for (window, batch, passes), why in cases.items():
        with pytest.raises(DomainError) as error:
            await service.summarize(namespace, cid, window, batch, passes, Budget())
        assert reason(error) == (Code.INVALID_ARGUMENT, why)
    assert await store.get_summary(namespace, uuid.UUID(cid)) is None


async def test_budget_stops_passes_after_the_completed_ones(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    scripted = Scripted(usage=Usage(50, 40, 1))
    service = make_service(store, transcripts, scripted)
    cid = await new_conversation(transcripts, namespace, chat(60))
    with pytest.raises(DomainError) as calls:
        await service.summarize(namespace, cid, 4, 8, 5, Budget(max_model_calls=2))
    assert reason(calls) == (Code.RESOURCE_EXHAUSTED, "BUDGET_EXHAUSTED")
    assert calls.value.metadata["dimension"] == "max_model_calls"
    assert calls.value.metadata["passes"] == "2"
    assert calls.value.metadata["usage_output_tokens"] == "80"
    current = await store.get_summary(namespace, uuid.UUID(cid))
    assert current is not None and current.through_sequence == 16

    with pytest.raises(DomainError) as output:
        await service.summarize(namespace, cid, 4, 8, 5, Budget(max_output_tokens=100))
    assert output.value.metadata["dimension"] == "max_output_tokens"
    assert scripted.calls[-1][2] == 20  # the last call was capped to what was left

    # The estimate of the next call (10 a entry, 8 entries) does not fit in 79 tokens.
    with pytest.raises(DomainError) as prompt:
        await service.summarize(namespace, cid, 4, 8, 5, Budget(max_input_tokens=79))
    assert prompt.value.metadata["dimension"] == "max_input_tokens"
    assert prompt.value.metadata["passes"] == "0"


async def test_summarizer_output_that_may_not_be_committed_is_refused(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    cid = await new_conversation(transcripts, namespace, chat(20))
    for text, problem in (("   ", "empty"), ("y" * 2000, "too_large")):

        class Bad(Scripted):
            async def summarize(
                self, prompt: SummaryPrompt, *, timeout: float, text: str = text
            ) -> SummaryOutput:
                return SummaryOutput(text, Usage(1, 1, 1))

        service = make_service(store, transcripts, Bad(), max_summary_bytes=1024)
        with pytest.raises(DomainError) as error:
            await service.summarize(namespace, cid, 4, 8, 3, Budget())
        assert reason(error) == (Code.FAILED_PRECONDITION, "SUMMARY_INVALID")
        assert error.value.metadata["problem"] == problem
        assert error.value.metadata["usage_model_calls"] == "1"
    assert await store.get_summary(namespace, uuid.UUID(cid)) is None


async def test_the_deadline_bounds_the_model_call(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    scripted = Scripted()
    scripted.delay = 30.0
    service = make_service(store, transcripts, scripted)
    cid = await new_conversation(transcripts, namespace, chat(20))

    async def call(deadline: float) -> DomainError:
        deadline_var.set(deadline)
        with pytest.raises(DomainError) as error:
            await service.summarize(namespace, cid, 4, 8, 3, Budget())
        return error.value

    late = await asyncio.create_task(call(time.monotonic() + 0.2))
    assert (late.code, late.reason) == (Code.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED")
    gone = await asyncio.create_task(call(time.monotonic() - 1))
    assert gone.code is Code.DEADLINE_EXCEEDED
    assert len(scripted.calls) == 1  # a spent deadline makes no call
    assert await store.get_summary(namespace, uuid.UUID(cid)) is None


async def test_a_conversation_created_again_under_its_id_starts_without_a_summary(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    service = make_service(store, transcripts, Scripted())
    cid = await new_conversation(transcripts, namespace, chat(20))
    await service.summarize(namespace, cid, 4, 8, 2, Budget())
    await transcripts.service.delete_conversation(namespace, cid)
    await transcripts.service.create_conversation(namespace, cid, {})
    await transcripts.service.append(namespace, cid, None, chat(12), "")
    # The old summary covers 16 entries; the new transcript has 12.
    result = await service.summarize(namespace, cid, 4, 4, 8, Budget())
    assert result.summary is not None and result.summary.through_sequence == 8
    assert (result.passes, result.summary.revision) == (2, 2)  # a fresh start, not 3 and 4
    await transcripts.service.delete_conversation(namespace, cid)
    await transcripts.service.create_conversation(namespace, cid, {})
    await transcripts.service.append(namespace, cid, None, chat(2), "")
    assert await service.get_summary(namespace, cid) is None


async def test_a_retracted_entry_is_covered_but_never_summarized(namespace: str) -> None:
    """The summary's range stays contiguous over a retracted entry; its text never
    reaches the summarizer."""
    transcripts = LocalTranscripts()
    messages = [user("keep this"), assistant("forget THIS-SECRET"), *chat(8, start=3)]
    cid = await new_conversation(transcripts, namespace, messages)
    version = (await transcripts.service.get_conversation(namespace, cid)).version
    await transcripts.service.append(namespace, cid, version, [], "pop", retract=[2])
    service = make_service(InMemorySummaryStore(), transcripts)
    result = await service.summarize(namespace, cid, 2, 8, 3, Budget())
    assert result.summary is not None and result.summary.through_sequence == 8
    assert "keep this" in result.summary.text
    assert "THIS-SECRET" not in result.summary.text
