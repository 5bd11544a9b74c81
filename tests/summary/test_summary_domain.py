"""Summary domain rules on the in-memory stores: commits, passes, budgets, output checks,
the offline digest, and the queue workers' decisions."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Sequence

import pytest

from services.common.channels import deadline_var
from services.common.domain import Budget, Entry, Role, Usage
from services.common.errors import Code, DomainError
from services.llm.model import ModelTimeout, ModelUnavailable
from services.summary import metrics
from services.summary.config import SummaryConfig
from services.summary.jobs.model import JobState
from services.summary.jobs.worker import SummaryWorkers
from services.summary.store import SummaryStore
from services.summary.summarizers.offline import OfflineSummarizer, offline_digest
from services.summary.summarizers.prompt import SummaryOutput, SummaryPrompt
from tests.summary.cases import (
    LocalTranscripts,
    SummaryStoreCases,
    assistant,
    chat,
    make_service,
    new_conversation,
    tool,
    user,
)
from tests.summary.double import InMemorySummaryStore


class TestSummaryStoreInMemory(SummaryStoreCases):
    @pytest.fixture
    def store(self) -> SummaryStore:
        return InMemorySummaryStore(history_limit=3)


class Scripted:
    """A summarizer whose answers the test decides; records what it was given."""

    provider = "scripted"

    def __init__(self, text: str = "summary", usage: Usage | None = None) -> None:
        self.text = text
        self.usage = usage or Usage(100, 10, 1)
        self.calls: list[tuple[str | None, list[int], int]] = []
        self.error: Exception | None = None
        self.delay = 0.0

    def prepare(
        self, previous: str | None, entries: Sequence[Entry], *, max_output_tokens: int
    ) -> SummaryPrompt:
        return SummaryPrompt(previous, entries, max_output_tokens, "", "", 10 * len(entries))

    async def summarize(self, prompt: SummaryPrompt, *, timeout: float) -> SummaryOutput:
        entries = prompt.entries
        self.calls.append(
            (prompt.previous, [e.sequence for e in entries], prompt.max_output_tokens)
        )
        if self.delay:
            try:
                await asyncio.wait_for(asyncio.Event().wait(), min(self.delay, timeout))
            except TimeoutError:
                raise ModelTimeout() from None
        if self.error is not None:
            raise self.error
        return SummaryOutput(f"{self.text} through {entries[-1].sequence}", self.usage)


def reason(error: pytest.ExceptionInfo[DomainError]) -> tuple[Code, str]:
    return error.value.code, error.value.reason


@pytest.fixture
def transcripts() -> LocalTranscripts:
    return LocalTranscripts()


@pytest.fixture
def store() -> InMemorySummaryStore:
    return InMemorySummaryStore()


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


# -- the offline digest ------------------------------------------------------------------


def entries(messages: Sequence[object], start: int = 1) -> list[Entry]:
    from datetime import UTC, datetime

    return [
        Entry(start + i, m, datetime.now(UTC))  # type: ignore[arg-type]
        for i, m in enumerate(messages)
    ]


def test_offline_digest_is_readable_deterministic_and_bounded() -> None:
    first = entries(
        [
            user("How do I rotate the API keys of the billing service?"),
            assistant("", "k1"),
            tool("k1", "keys rotated at 10:00"),
            assistant("Done: the keys were rotated."),
        ]
    )
    digest = offline_digest(None, first, 4096)
    assert digest == offline_digest(None, first, 4096)
    assert "through entry 4" in digest
    assert "How do I rotate the API keys of the billing service?" in digest
    assert "assistant called lookup" in digest and "keys rotated at 10:00" in digest
    assert "Tools called: lookup (1)." in digest

    many = entries([user(f"message number {i} " + "word " * 60) for i in range(500)], start=5)
    grown = offline_digest(digest, many, 2048)
    assert len(grown.encode()) <= 2048
    assert "through entry 504" in grown
    assert "Counted: 501 user messages, 2 assistant messages, 1 tool results." in grown
    assert "How do I rotate" in grown  # the opening is kept
    assert "message number 499" in grown  # the most recent is kept
    assert "message number 10 " not in grown  # the middle made room

    foreign = offline_digest("A summary a model wrote.", first, 4096)
    assert "Earlier summary (excerpt): A summary a model wrote." in foreign


async def test_offline_summarizer_reports_usage() -> None:
    summarizer = OfflineSummarizer()
    prompt = summarizer.prepare(None, entries(chat(6)), max_output_tokens=1024)
    output = await summarizer.summarize(prompt, timeout=1.0)
    assert output.usage.model_calls == 1
    assert output.usage.input_tokens > 0 and output.usage.output_tokens > 0
    assert output.text.startswith("Conversation summary through entry 6")


# -- the queue workers -----------------------------------------------------------------


def worker_config(**overrides: object) -> SummaryConfig:
    from dataclasses import replace

    base = SummaryConfig(
        workers=0, backoff_base_s=0.0, backoff_max_s=0.0, max_failures=2, lease_s=30
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


async def test_workers_finish_retry_park_and_end_jobs(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    scripted = Scripted()
    config = worker_config()
    service = make_service(store, transcripts, scripted, config)
    workers = SummaryWorkers(service, config)
    cid = await new_conversation(transcripts, namespace, chat(40))
    job, _ = await service.request_summary(namespace, cid, 4, 8)

    # An outage: retried, never parked, however often.
    scripted.error = ModelUnavailable()
    parked = metrics.SUMMARY_JOB_FAILURES.labels("parked")._value.get()
    for _ in range(5):
        assert await workers.run_once("w")
    stored = await store.get_job(job.job_id)
    assert stored is not None and stored.state is JobState.PENDING
    assert (stored.attempts, stored.failures, stored.last_error) == (5, 0, "MODEL_UNAVAILABLE")

    # The model is back: the job drains the whole backlog and is done.
    scripted.error = None
    assert await workers.run_once("w")
    stored = await store.get_job(job.job_id)
    assert stored is not None and stored.state is JobState.DONE
    summary = await store.get_summary(namespace, uuid.UUID(cid))
    assert summary is not None and summary.through_sequence == 36
    assert not await workers.run_once("w")

    # A failure that is not an outage counts; the second one parks the job.
    await transcripts.service.append(namespace, cid, None, chat(10), "")
    job, created = await service.request_summary(namespace, cid, 4, 8)
    assert created
    scripted.error = DomainError(Code.FAILED_PRECONDITION, "MODEL_FAILED", "refused")
    assert await workers.run_once("w")
    assert await workers.run_once("w")
    stored = await store.get_job(job.job_id)
    assert stored is not None and stored.state is JobState.FAILED
    assert metrics.SUMMARY_JOB_FAILURES.labels("parked")._value.get() == parked + 1
    assert (await service.get_backlog(namespace)).failed_count == 1

    # A conversation erased while its job waits: the job ends, it does not loop.
    scripted.error = None
    job, _ = await service.request_summary(namespace, cid, 4, 8)
    await transcripts.service.delete_conversation(namespace, cid)
    assert await workers.run_once("w")
    ended = await store.get_job(job.job_id)
    assert ended is not None and ended.state is JobState.DONE
    assert not await workers.run_once("w")
    assert (await service.get_backlog(namespace)).depth == 0


async def test_a_job_refused_by_load_shedding_waits_and_is_never_parked(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    """A refusal that carries a retry delay (OVERLOADED, a namespace at its limit)
    says "later", not "never": the job goes back without a counted failure, due
    no sooner than the delay the refusal asked for."""
    scripted = Scripted()
    config = worker_config(max_failures=1)
    service = make_service(store, transcripts, scripted, config)
    workers = SummaryWorkers(service, config)

    for reason in ("OVERLOADED", "NAMESPACE_CONCURRENCY_LIMIT", "NAMESPACE_SHARE_EXCEEDED"):
        cid = await new_conversation(transcripts, namespace, chat(40))
        job, _ = await service.request_summary(namespace, cid, 4, 8)
        scripted.error = DomainError(Code.RESOURCE_EXHAUSTED, reason, "busy", retry_after_s=30.0)
        assert await workers.run_once("w")
        stored = await store.get_job(job.job_id)
        assert stored is not None and stored.state is JobState.PENDING, reason
        assert (stored.failures, stored.last_error) == (0, reason)
        # Not due again before the delay asked for (the configured backoff here is 0).
        assert not await workers.run_once("w"), reason

    cid = await new_conversation(transcripts, namespace, chat(40))
    job, _ = await service.request_summary(namespace, cid, 4, 8)
    # Without a retry delay (a budget that does not cover the call) it counts.
    scripted.error = DomainError(Code.RESOURCE_EXHAUSTED, "BUDGET_EXHAUSTED", "no budget")
    assert await workers.run_once("w")
    stored = await store.get_job(job.job_id)
    assert stored is not None and stored.state is JobState.FAILED


async def test_workers_run_in_the_background_and_stop_cleanly(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    config = worker_config(workers=2, poll_interval_s=0.05, gauge_interval_s=0.05)
    service = make_service(store, transcripts, Scripted(), config)
    workers = SummaryWorkers(service, config)
    service.on_enqueue = workers.wake
    await workers.start()
    try:
        cids = [await new_conversation(transcripts, namespace, chat(30)) for _ in range(5)]
        for cid in cids:
            await service.request_summary(namespace, cid, 4, 8)

        async def drained() -> bool:
            return (await service.get_backlog(namespace)).depth == 0

        from tests.support.waiting import wait_for

        await wait_for(drained)
        await wait_for(lambda: _gauge_is(0))
    finally:
        await workers.stop()
    for cid in cids:
        summary = await store.get_summary(namespace, uuid.UUID(cid))
        assert summary is not None and summary.through_sequence == 26


async def _gauge_is(value: float) -> bool:
    return bool(metrics.SUMMARY_JOBS_DEPTH._value.get() == value)


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


async def test_a_worker_stops_when_its_lease_is_lost_and_gives_jobs_back_on_stop(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    from tests.support.waiting import wait_for

    scripted = Scripted()
    scripted.delay = 30.0
    config = worker_config(lease_s=0.3)
    service = make_service(store, transcripts, scripted, config)
    workers = SummaryWorkers(service, config)
    cid = await new_conversation(transcripts, namespace, chat(20))
    job, _ = await service.request_summary(namespace, cid, 4, 8)

    async def calls(count: int) -> bool:
        return len(scripted.calls) >= count

    # Another worker takes the job over: the first one notices at its next heartbeat.
    run = asyncio.create_task(workers.run_once("w1"))
    await wait_for(lambda: calls(1))
    row = store._jobs[job.job_id]
    row.job = dataclasses.replace(row.job, lease_token=uuid.uuid4())
    assert await asyncio.wait_for(run, 10)
    assert await store.get_summary(namespace, uuid.UUID(cid)) is None

    # Shutdown while a job runs: the job goes back untouched (its attempt is not counted).
    other = await new_conversation(transcripts, namespace, chat(20))
    second, _ = await service.request_summary(namespace, other, 4, 8)
    run = asyncio.create_task(workers.run_once("w2"))
    await wait_for(lambda: calls(2))
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    stored = await store.get_job(second.job_id)
    assert stored is not None and stored.state is JobState.PENDING and stored.attempts == 0


async def test_a_job_whose_workers_keep_dying_is_parked(
    store: InMemorySummaryStore, transcripts: LocalTranscripts, namespace: str
) -> None:
    config = worker_config(max_failures=1)
    service = make_service(store, transcripts, Scripted(), config)
    workers = SummaryWorkers(service, config)
    cid = await new_conversation(transcripts, namespace, chat(20))
    job, _ = await service.request_summary(namespace, cid, 4, 8)
    assert await store.claim("crashed", 0.01) is not None  # and never heard of again
    await asyncio.sleep(0.05)  # let that lease lapse (a duration, not a condition)
    assert await workers.run_once("w")
    stored = await store.get_job(job.job_id)
    assert stored is not None and stored.state is JobState.FAILED
    assert stored.last_error == "LEASE_EXPIRED"


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
