"""The background workers that drain the curation queue (the summary queue's design:
services/summary/jobs/worker.py).

Each worker claims one job at a time (FOR UPDATE SKIP LOCKED, in fair order, under a
lease it keeps extending) and runs up to RUNIFOLD_CURATION_BATCHES_PER_RUN batches of
it (MemoryService.curate), then gives the job back to the queue if entries remain.
Several workers, processes and replicas share one queue: a job is held by one lease at
a time, a batch commits only under the lease that read it (its transaction checks), and
a worker that loses its lease stops. A crashed worker's job is taken over when its lease
expires; the batch it was applying was never committed, so it is applied once, by the
next worker.

Transient failures (the model, TranscriptService or PostgreSQL down or slow) are retried
with exponential backoff and never park a job; so are refusals with a retry delay (the
namespace's hourly budget, load shedding), retried no sooner than that delay. Any other
failure counts, and a job is parked (FAILED) after RUNIFOLD_CURATION_JOB_MAX_FAILURES.
A conversation that was erased (or is gone) ends its job.

The claiming, the lease, the retries and the parking are the durable queue's every
service shares (services/common/queue/worker.py); what a curation job does, and what
its outcomes count, is here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from services.common.auth import Identity
from services.common.errors import DomainError
from services.common.queue.worker import Backlog, QueueSettings, QueueWorkers
from services.memory import metrics
from services.memory.config import MemoryConfig
from services.memory.curation.model import CurationJob, JobState
from services.memory.curation.service import AutoCuration, CurationRun
from services.memory.curation.store import CurationStore

log = logging.getLogger(__name__)

_ENDED = ("CONVERSATION_ERASED", "CONVERSATION_NOT_FOUND")


class CurationWorkers(QueueWorkers[CurationJob, CurationRun]):
    """The curation workers and the queue gauges of one process."""

    store: CurationStore

    def __init__(
        self,
        service: AutoCuration,
        store: CurationStore,
        config: MemoryConfig,
        *,
        ready: Callable[[], Awaitable[bool]] | None = None,
        identity: Callable[[str], Identity | None] | None = None,
    ) -> None:
        super().__init__(
            store,
            QueueSettings(
                name="curation",
                workers=config.curation_workers,
                poll_interval_s=config.curation_poll_interval_s,
                lease_s=config.curation_lease_s,
                max_failures=config.curation_max_failures,
                job_timeout_s=config.curation_job_timeout_s,
                gauge_interval_s=config.curation_gauge_interval_s,
                job_retention_s=config.curation_job_retention_s,
                backoff_base_s=config.curation_backoff_s,
                backoff_max_s=config.curation_backoff_max_s,
                transient_at_info=True,
            ),
            ready=ready,
            identity=identity,
        )
        self.service = service
        self.config = config

    async def work(self, job: CurationJob) -> CurationRun:
        assert job.lease_token is not None
        return await self.service.curate(job, job.lease_token)

    async def finished(self, job: CurationJob, result: CurationRun) -> None:
        assert job.lease_token is not None
        metrics.CURATION_JOB_FACTS.observe(result.added)
        metrics.CURATION_JOB_MODEL_CALLS.observe(result.model_calls)
        metrics.CURATION_JOB_TOKENS.observe(result.usage.input_tokens + result.usage.output_tokens)
        state = await self.store.complete(job, job.lease_token, requeue=result.remaining)
        if state is None:
            metrics.CURATION_JOBS.labels("lost").inc()
        else:
            metrics.CURATION_JOBS.labels("done" if state is JobState.DONE else "requeued").inc()

    async def settled(self, job: CurationJob, error: DomainError) -> bool:
        assert job.lease_token is not None
        if error.reason in _ENDED:
            # The conversation (this incarnation of it) is gone: nothing is left to curate.
            log.info("curation job ended: conversation erased", extra={"job_id": str(job.job_id)})
            await self.store.complete(job, job.lease_token, requeue=False)
            metrics.CURATION_JOBS.labels("ended").inc()
            return True
        if error.reason == "CURATION_LEASE_LOST":
            metrics.CURATION_JOBS.labels("lost").inc()
            return True
        return False

    def failed(self, parked: bool) -> None:
        metrics.CURATION_JOBS.labels("parked" if parked else "retried").inc()

    def lease_lost(self) -> None:
        metrics.CURATION_JOBS.labels("lost").inc()

    async def backlog(self) -> Backlog:
        return await self.store.backlog(None, self.service.now())

    def show(self, backlog: Backlog) -> None:
        metrics.CURATION_JOBS_DEPTH.set(backlog.depth)
        metrics.CURATION_JOBS_OLDEST_AGE.set(backlog.oldest_pending_age_s)
        metrics.CURATION_JOBS_FAILED.set(backlog.failed_count)

    async def prune(self) -> None:
        await self.store.prune(self.settings.job_retention_s)
