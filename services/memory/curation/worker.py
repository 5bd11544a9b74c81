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
from services.common.errors import Code, DomainError
from services.memory import metrics
from services.memory.config import MemoryConfig
from services.memory.curation.model import CurationJob, JobState
from services.memory.curation.service import AutoCuration, CurationRun
from services.memory.curation.store import CurationStore

log = logging.getLogger(__name__)

_TRANSIENT = (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED)
_ENDED = ("CONVERSATION_ERASED", "CONVERSATION_NOT_FOUND")
_PRUNE_EVERY_S = 60.0


def retry_delay(config: MemoryConfig, attempts: int) -> float:
    """Delay before the next attempt: exponential in the attempts made, capped, jittered."""
    return backoff(
        attempts - 1,
        base_s=config.curation_backoff_s,
        max_s=config.curation_backoff_max_s,
        jitter=0.2,
    )


class CurationWorkers:
    """The curation workers and the queue gauges of one process."""

    def __init__(
        self,
        service: AutoCuration,
        store: CurationStore,
        config: MemoryConfig,
        *,
        ready: Callable[[], Awaitable[bool]] | None = None,
        identity: Callable[[str], Identity | None] | None = None,
    ) -> None:
        self.service = service
        self.store = store
        self.config = config
        self._ready = ready
        self._acting_for = identity
        self._identity = f"{socket.gethostname()}:{os.getpid()}"
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_prune = 0.0

    def wake(self) -> None:
        """A job was queued here: idle workers claim now rather than at their next poll."""
        self._wake.set()

    async def start(self) -> None:
        """Start the workers (RUNIFOLD_CURATION_WORKERS of them) and the gauge refresher."""
        self._tasks.append(asyncio.create_task(self._gauge_loop(), name="curation-gauges"))
        for index in range(self.config.curation_workers):
            self._tasks.append(
                asyncio.create_task(self._loop(f"{self._identity}:{index}"), name="curation-worker")
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
            await asyncio.wait_for(self._wake.wait(), self.config.curation_poll_interval_s)
        self._wake.clear()

    async def _loop(self, worker: str) -> None:
        while True:
            ran = False
            try:
                if self._ready is None or await self._ready():
                    ran = await self.run_once(worker)
            except DomainError as error:
                # Unavailable (PostgreSQL restarting, a shutdown under way): the next poll
                # tries again; anything else is worth a warning.
                (log.info if error.code in _TRANSIENT else log.warning)(
                    "curation worker cannot claim", extra={"reason": error.reason}
                )
            except Exception:
                log.exception("curation worker failed")
            if not ran:
                await self._idle()

    async def run_once(self, worker: str) -> bool:
        """Claim one job and run it to its outcome; False when no job was due."""
        job = await self.store.claim(worker, self.config.curation_lease_s)
        if job is None:
            return False
        assert job.lease_token is not None
        if job.failures >= self.config.curation_max_failures:
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
            metrics.CURATION_JOBS.labels("lost").inc()
            log.warning("curation job lease lost", extra={"job_id": str(job.job_id)})
            return True
        error = run.exception()
        if error is None:
            done: CurationRun = run.result()
            self._observe(done)
            state = await self.store.complete(job, job.lease_token, requeue=done.remaining)
            if state is None:
                metrics.CURATION_JOBS.labels("lost").inc()
            else:
                metrics.CURATION_JOBS.labels("done" if state is JobState.DONE else "requeued").inc()
            return True
        if isinstance(error, DomainError) and error.reason in _ENDED:
            # The conversation (this incarnation of it) is gone: nothing is left to curate.
            log.info("curation job ended: conversation erased", extra={"job_id": str(job.job_id)})
            await self.store.complete(job, job.lease_token, requeue=False)
            metrics.CURATION_JOBS.labels("ended").inc()
            return True
        if isinstance(error, DomainError) and error.reason == "CURATION_LEASE_LOST":
            metrics.CURATION_JOBS.labels("lost").inc()
            return True
        if isinstance(error, DomainError):
            # A refusal with a retry delay is "later", never "no" (the hourly budget).
            shed = error.code is Code.RESOURCE_EXHAUSTED and error.retry_after_s is not None
            await self._record_failure(
                job,
                error.reason,
                counted=error.code not in _TRANSIENT and not shed,
                code=error.code.value,
                not_before_s=error.retry_after_s or 0.0,
            )
        else:
            log.error("curation job crashed", exc_info=error, extra={"job_id": str(job.job_id)})
            await self._record_failure(job, "INTERNAL", counted=True)
        return True

    @staticmethod
    def _observe(run: CurationRun) -> None:
        metrics.CURATION_JOB_FACTS.observe(run.added)
        metrics.CURATION_JOB_MODEL_CALLS.observe(run.model_calls)
        metrics.CURATION_JOB_TOKENS.observe(run.usage.input_tokens + run.usage.output_tokens)

    async def _record_failure(
        self,
        job: CurationJob,
        reason: str,
        *,
        counted: bool,
        code: str = "INTERNAL",
        not_before_s: float = 0.0,
    ) -> None:
        assert job.lease_token is not None
        limit = self.config.curation_max_failures
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
            metrics.CURATION_JOBS.labels("parked" if park else "retried").inc()
        # A transient failure (a store or service unavailable, a shutdown under way) is
        # retried with backoff and counted by the metric: worth a warning only once it
        # counts towards parking the job.
        (log.warning if counted or park else log.info)(
            "curation job failed",
            extra={
                "job_id": str(job.job_id),
                "reason": reason,
                "code": code,
                "attempts": job.attempts,
                "parked": park,
            },
        )

    async def _run(self, job: CurationJob) -> CurationRun:
        deadline_var.set(time.monotonic() + self.config.curation_job_timeout_s)
        # No caller waits for a job: it runs under the service's own identity, acting for
        # the job's namespace only, so TranscriptService applies the usual rule.
        identity_var.set(self._acting_for(job.namespace) if self._acting_for else None)
        assert job.lease_token is not None
        return await self.service.curate(job, job.lease_token)

    async def _heartbeat(self, job: CurationJob) -> None:
        """Extend the lease until it is lost (then return, which stops the run)."""
        assert job.lease_token is not None
        while True:
            await asyncio.sleep(self.config.curation_lease_s / 3)
            try:
                held = await self.store.extend_lease(
                    job.job_id, job.lease_token, self.config.curation_lease_s
                )
            except DomainError:
                continue  # a store blip: the lease may still hold; try again
            if not held:
                return

    async def refresh_gauges(self) -> None:
        """Set the queue gauges (all namespaces) and prune old finished jobs now and then."""
        backlog = await self.store.backlog(None, self.service.now())
        metrics.CURATION_JOBS_DEPTH.set(backlog.depth)
        metrics.CURATION_JOBS_OLDEST_AGE.set(backlog.oldest_pending_age_s)
        metrics.CURATION_JOBS_FAILED.set(backlog.failed_count)
        now = time.monotonic()
        if now - self._last_prune >= _PRUNE_EVERY_S:
            self._last_prune = now
            await self.store.prune(self.config.curation_job_retention_s)

    async def _gauge_loop(self) -> None:
        while True:
            try:
                await self.refresh_gauges()
            except Exception as error:
                log.warning(
                    "curation gauges not refreshed", extra={"error_type": type(error).__name__}
                )
            await asyncio.sleep(self.config.curation_gauge_interval_s)
