"""The summary job queue on the in-memory store, and the queue workers' decisions."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest

from services.common.errors import Code, DomainError
from services.llm.model import ModelUnavailable
from services.summary import metrics
from services.summary.config import SummaryConfig
from services.summary.jobs.model import JobState
from services.summary.jobs.worker import SummaryWorkers
from services.summary.store import SummaryStore
from tests.summary.double import InMemorySummaryStore
from tests.summary.jobs.cases import JobQueueCases
from tests.summary.support import (
    LocalTranscripts,
    Scripted,
    chat,
    make_service,
    new_conversation,
)


class TestJobQueueInMemory(JobQueueCases):
    @pytest.fixture
    def store(self) -> SummaryStore:
        return InMemorySummaryStore(history_limit=3)


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
