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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable

from services.common.auth import Identity, identity_var
from services.common.backoff import backoff
from services.common.deadlines import deadline_var
from services.common.domain import Budget
from services.common.errors import Code, DomainError
from services.summary import metrics
from services.summary.config import SummaryConfig
from services.summary.jobs.model import Job, JobState
from services.summary.service import SummaryService, is_not_found

log = logging.getLogger(__name__)

_TRANSIENT = (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED)
_PRUNE_EVERY_S = 60.0


def retry_delay(config: SummaryConfig, attempts: int) -> float:
    """Delay before the next attempt: exponential in the attempts made, capped, jittered."""
    return backoff(
        attempts - 1, base_s=config.backoff_base_s, max_s=config.backoff_max_s, jitter=0.2
    )


class SummaryWorkers:
    """The queue workers and the queue gauges of one process."""

    def __init__(
        self,
        service: SummaryService,
        config: SummaryConfig,
        *,
        ready: Callable[[], Awaitable[bool]] | None = None,
        identity: Callable[[str], Identity | None] | None = None,
    ) -> None:
        self.service = service
        self._acting_for = identity
        self.store = service.store
        self.config = config
        self._ready = ready
        self._identity = f"{socket.gethostname()}:{os.getpid()}"
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_prune = 0.0

    def wake(self) -> None:
        """A job was enqueued here: idle workers claim now rather than at their next poll."""
        self._wake.set()

    async def start(self) -> None:
        """Start the workers (RUNIFOLD_SUMMARY_WORKERS of them) and the gauge refresher."""
        self._tasks.append(asyncio.create_task(self._gauge_loop(), name="summary-gauges"))
        for index in range(self.config.workers):
            self._tasks.append(
                asyncio.create_task(self._loop(f"{self._identity}:{index}"), name="summary-worker")
            )

    async def stop(self) -> None:
        """Stop every worker; a job in progress goes back to the queue untouched."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def _idle(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self.config.poll_interval_s)
        self._wake.clear()

    async def _loop(self, worker: str) -> None:
        while True:
            ran = False
            try:
                if self._ready is None or await self._ready():
                    ran = await self.run_once(worker)
            except DomainError as error:
                log.warning("summary worker cannot claim", extra={"reason": error.reason})
            except Exception:
                log.exception("summary worker failed")
            if not ran:
                await self._idle()

    async def run_once(self, worker: str) -> bool:
        """Claim one job and run it to its outcome; False when no job was due."""
        job = await self.store.claim(worker, self.config.lease_s)
        if job is None:
            return False
        assert job.lease_token is not None
        if job.failures >= self.config.max_failures:
            # Its earlier workers died holding it (leases expired) too often.
            await self._record_failure(job, job.last_error or "LEASE_EXPIRED", counted=False)
            return True
        run = asyncio.create_task(self._run(job))
        heartbeat = asyncio.create_task(self._heartbeat(job))
        try:
            await asyncio.wait({run, heartbeat}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            for task in (run, heartbeat):
                task.cancel()
            await asyncio.gather(run, heartbeat, return_exceptions=True)
            # Shutdown: give the job back so another worker takes it at once.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release(job.job_id, job.lease_token))
            raise
        heartbeat.cancel()
        await asyncio.gather(heartbeat, return_exceptions=True)
        if not run.done():
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            log.warning("summary job lease lost", extra={"job_id": str(job.job_id)})
            return True
        error = run.exception()
        if error is None:
            state = await self.store.complete(job.job_id, job.lease_token, requeue=run.result())
            if state is JobState.DONE:
                metrics.SUMMARY_JOBS_COMPLETED.inc()
            elif state is None:
                log.warning("summary job lease lost", extra={"job_id": str(job.job_id)})
            return True
        if isinstance(error, DomainError) and is_not_found(error):
            # The conversation (this incarnation of it) is gone: the job has nothing to do.
            log.info("summary job ended: conversation not found", extra={"job_id": str(job.job_id)})
            await self.store.complete(job.job_id, job.lease_token, requeue=False)
            return True
        if isinstance(error, DomainError):
            # A refusal with a retry delay is load shedding: "later", never "no".
            shed = error.code is Code.RESOURCE_EXHAUSTED and error.retry_after_s is not None
            await self._record_failure(
                job,
                error.reason,
                counted=error.code not in _TRANSIENT and not shed,
                code=error.code.value,
                not_before_s=error.retry_after_s or 0.0,
            )
        else:
            log.error("summary job crashed", exc_info=error, extra={"job_id": str(job.job_id)})
            await self._record_failure(job, "INTERNAL", counted=True)
        return True

    async def _record_failure(
        self,
        job: Job,
        reason: str,
        *,
        counted: bool,
        code: str = "INTERNAL",
        not_before_s: float = 0.0,
    ) -> None:
        assert job.lease_token is not None
        limit = self.config.max_failures
        park = job.failures >= limit or (counted and job.failures + 1 >= limit)
        state = await self.store.fail(
            job.job_id,
            job.lease_token,
            reason,
            counted=counted,
            park=park,
            retry_in_s=max(not_before_s, retry_delay(self.config, job.attempts)),
        )
        if state is not None:
            metrics.SUMMARY_JOB_FAILURES.labels("parked" if park else "retried").inc()
        log.warning(
            "summary job failed",
            extra={
                "job_id": str(job.job_id),
                "reason": reason,
                "code": code,
                "attempts": job.attempts,
                "parked": park,
            },
        )

    async def _run(self, job: Job) -> bool:
        """Summarize until no backlog remains; True when backlog remains after the
        configured rounds (the job goes back to the queue, giving others a turn)."""
        deadline_var.set(time.monotonic() + self.config.job_timeout_s)
        # No caller waits for a job: it runs under the service's own identity, acting
        # for the job's namespace only, so TranscriptService applies the usual rule.
        identity_var.set(self._acting_for(job.namespace) if self._acting_for else None)
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

    async def _heartbeat(self, job: Job) -> None:
        """Extend the lease until it is lost (then return, which stops the run)."""
        assert job.lease_token is not None
        while True:
            await asyncio.sleep(self.config.lease_s / 3)
            try:
                held = await self.store.extend_lease(
                    job.job_id, job.lease_token, self.config.lease_s
                )
            except DomainError:
                continue  # a store blip: the lease may still hold; try again
            if not held:
                return

    async def refresh_gauges(self) -> None:
        """Set the queue gauges (all namespaces) and prune old finished jobs now and then."""
        backlog = await self.store.backlog(None)
        metrics.SUMMARY_JOBS_DEPTH.set(backlog.depth)
        metrics.SUMMARY_JOBS_OLDEST_AGE.set(backlog.oldest_pending_age_s)
        metrics.SUMMARY_JOBS_FAILED.set(backlog.failed_count)
        now = time.monotonic()
        if now - self._last_prune >= _PRUNE_EVERY_S:
            self._last_prune = now
            await self.store.prune_jobs(self.config.job_retention_s)

    async def _gauge_loop(self) -> None:
        while True:
            try:
                await self.refresh_gauges()
            except Exception as error:
                log.warning(
                    "summary gauges not refreshed", extra={"error_type": type(error).__name__}
                )
            await asyncio.sleep(self.config.gauge_interval_s)
