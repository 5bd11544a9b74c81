"""The background workers that drain the summary job queue.

Each worker claims one job at a time (FOR UPDATE SKIP LOCKED, under a lease
it keeps extending), runs Summarize with the job's window and batch, the
server's default pass limit and budget, until no backlog remains, and
records the outcome. Several workers, processes and replicas can share one
queue: a job is held by one lease at a time, and a worker that loses its
lease stops working on the job. A crashed worker's job is taken over when
its lease expires.

Failures: UNAVAILABLE and DEADLINE_EXCEEDED (the model, TranscriptService or
PostgreSQL is down or slow) are retried with exponential backoff and never
park a job, so an outage loses nothing; so are refusals that carry a retry
delay (load shedding: OVERLOADED, a namespace at its concurrency limit or share
of the model), retried no sooner than that delay. Any other failure counts, and a job
is parked (FAILED) after RUNIFOLD_SUMMARY_JOB_MAX_FAILURES of them. A
conversation that no longer exists (or was erased and made again: the job
names the incarnation it was asked for) ends its job.

The claiming, the lease, the retries and the parking are the durable queue's every
service shares (services/common/queue/worker.py); what a summary job does, and what
its outcomes count, is here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from services.common.auth import Identity
from services.common.domain import Budget
from services.common.errors import DomainError
from services.common.queue.worker import Backlog, QueueSettings, QueueWorkers
from services.summary import metrics
from services.summary.config import SummaryConfig
from services.summary.jobs.model import Job, JobState
from services.summary.jobs.store import JobStore
from services.summary.service import SummaryService, is_not_found

log = logging.getLogger(__name__)


class SummaryWorkers(QueueWorkers[Job, bool]):
    """The queue workers and the queue gauges of one process."""

    store: JobStore

    def __init__(
        self,
        service: SummaryService,
        config: SummaryConfig,
        *,
        ready: Callable[[], Awaitable[bool]] | None = None,
        identity: Callable[[str], Identity | None] | None = None,
    ) -> None:
        super().__init__(
            service.store,
            QueueSettings(
                name="summary",
                workers=config.workers,
                poll_interval_s=config.poll_interval_s,
                lease_s=config.lease_s,
                max_failures=config.max_failures,
                job_timeout_s=config.job_timeout_s,
                gauge_interval_s=config.gauge_interval_s,
                job_retention_s=config.job_retention_s,
                backoff_base_s=config.backoff_base_s,
                backoff_max_s=config.backoff_max_s,
            ),
            ready=ready,
            identity=identity,
        )
        self.service = service
        self.config = config

    async def work(self, job: Job) -> bool:
        """Summarize until no backlog remains; True when backlog remains after the
        configured rounds (the job goes back to the queue, giving others a turn)."""
        for _ in range(self.config.worker_rounds):
            # Summarize carries on by itself when another writer moves the summary.
            result = await self.service.summarize(
                job.namespace,
                str(job.conversation_id),
                job.window,
                job.summary_batch,
                self.config.worker_max_passes,
                Budget(),
                incarnation=job.incarnation or None,
            )
            if result.backlog == 0:
                return False
        return True

    async def finished(self, job: Job, result: bool) -> None:
        assert job.lease_token is not None
        state = await self.store.complete(job.job_id, job.lease_token, requeue=result)
        if state is JobState.DONE:
            metrics.SUMMARY_JOBS_COMPLETED.inc()
        elif state is None:
            log.warning("summary job lease lost", extra={"job_id": str(job.job_id)})

    async def settled(self, job: Job, error: DomainError) -> bool:
        if not is_not_found(error):
            return False
        # The conversation (this incarnation of it) is gone: the job has nothing to do.
        assert job.lease_token is not None
        log.info("summary job ended: conversation not found", extra={"job_id": str(job.job_id)})
        await self.store.complete(job.job_id, job.lease_token, requeue=False)
        return True

    def failed(self, parked: bool) -> None:
        metrics.SUMMARY_JOB_FAILURES.labels("parked" if parked else "retried").inc()

    def lease_lost(self) -> None:
        pass  # logged only

    async def backlog(self) -> Backlog:
        return await self.store.backlog(None)

    def show(self, backlog: Backlog) -> None:
        metrics.SUMMARY_JOBS_DEPTH.set(backlog.depth)
        metrics.SUMMARY_JOBS_OLDEST_AGE.set(backlog.oldest_pending_age_s)
        metrics.SUMMARY_JOBS_FAILED.set(backlog.failed_count)

    async def prune(self) -> None:
        await self.store.prune_jobs(self.settings.job_retention_s)
