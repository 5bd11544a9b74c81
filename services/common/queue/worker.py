"""The workers of a durable job queue in PostgreSQL, shared by the summary jobs
(services/summary/jobs/worker.py) and automatic curation
(services/memory/curation/worker.py): each service's workers say what a job does and
what its outcomes count; the claiming, the lease, the retries and the parking are here.

Each worker claims one job at a time (FOR UPDATE SKIP LOCKED, under a lease it keeps
extending) and runs it. Several workers, processes and replicas share one queue: a job
is held by one lease at a time, and a worker that loses its lease stops working on the
job. A crashed worker's job is taken over when its lease expires; at shutdown a job in
progress is given back untouched.

Failures: UNAVAILABLE and DEADLINE_EXCEEDED (a store, a service or the model down or
slow) are retried with exponential backoff and never park a job, so an outage loses
nothing; so are refusals that carry a retry delay (load shedding, a budget), retried no
sooner than that delay. Any other failure counts, and a job is parked (FAILED) after
`max_failures` of them.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from services.common.auth import Identity, identity_var
from services.common.backoff import backoff
from services.common.deadlines import deadline_var
from services.common.errors import Code, DomainError

log = logging.getLogger(__name__)

TRANSIENT = (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED)
_PRUNE_EVERY_S = 60.0


class Job(Protocol):
    """What the workers read of a claimed job."""

    @property
    def job_id(self) -> uuid.UUID: ...
    @property
    def namespace(self) -> str: ...
    @property
    def attempts(self) -> int: ...
    @property
    def failures(self) -> int: ...
    @property
    def lease_token(self) -> uuid.UUID | None: ...
    @property
    def last_error(self) -> str: ...


JobT = TypeVar("JobT", bound=Job)
JobT_co = TypeVar("JobT_co", bound=Job, covariant=True)
ResultT = TypeVar("ResultT")


class Backlog(Protocol):
    """What the gauges show of a queue."""

    @property
    def depth(self) -> int: ...
    @property
    def oldest_pending_age_s(self) -> float: ...
    @property
    def failed_count(self) -> int: ...


class LeaseStore(Protocol[JobT_co]):
    """The queue's statements the workers run (each atomic); the rest are the service's."""

    async def claim(self, worker: str, lease_s: float) -> JobT_co | None:
        """Take a due job, or a running one whose lease expired, under a new lease."""

    async def extend_lease(self, job_id: uuid.UUID, lease_token: uuid.UUID, lease_s: float) -> bool:
        """Push the lease forward; False when it was lost."""

    async def fail(
        self,
        job_id: uuid.UUID,
        lease_token: uuid.UUID,
        reason: str,
        *,
        counted: bool,
        park: bool,
        retry_in_s: float,
    ) -> object | None:
        """Finish an attempt that failed: pending after `retry_in_s`, or parked. None when
        the lease was lost."""

    async def release(self, job_id: uuid.UUID, lease_token: uuid.UUID) -> bool:
        """Give a claimed job back untouched (shutdown)."""


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """A queue's workers' settings (each service reads its own RUNIFOLD_* variables)."""

    name: str  # "summary": in the log and the tasks' names
    workers: int
    poll_interval_s: float
    lease_s: float
    max_failures: int
    job_timeout_s: float
    gauge_interval_s: float
    job_retention_s: float
    backoff_base_s: float
    backoff_max_s: float
    # Log failures that do not count towards parking (a store or service unavailable, a
    # shutdown under way) at INFO rather than WARNING.
    transient_at_info: bool = False


class QueueWorkers(abc.ABC, Generic[JobT, ResultT]):
    """The workers and the queue gauges of one process."""

    def __init__(
        self,
        store: LeaseStore[JobT],
        settings: QueueSettings,
        *,
        ready: Callable[[], Awaitable[bool]] | None = None,
        identity: Callable[[str], Identity | None] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self._ready = ready
        self._acting_for = identity
        self._identity = f"{socket.gethostname()}:{os.getpid()}"
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_prune = 0.0

    # -- what each queue's jobs do ---------------------------------------------------------

    @abc.abstractmethod
    async def work(self, job: JobT) -> ResultT:
        """Run the job (under its deadline, acting for its namespace)."""

    @abc.abstractmethod
    async def finished(self, job: JobT, result: ResultT) -> None:
        """Record a run that succeeded (complete the job, or queue it again)."""

    @abc.abstractmethod
    async def settled(self, job: JobT, error: DomainError) -> bool:
        """Handle an error that is no failure of the job (what it works on is gone: the
        job ends; its lease was lost); True when handled."""

    @abc.abstractmethod
    def failed(self, parked: bool) -> None:
        """Count a failure recorded (retried, or parked)."""

    @abc.abstractmethod
    def lease_lost(self) -> None:
        """Count a run stopped because its lease was lost."""

    @abc.abstractmethod
    async def backlog(self) -> Backlog:
        """The queue of every namespace, for the gauges."""

    @abc.abstractmethod
    def show(self, backlog: Backlog) -> None:
        """Set the queue gauges."""

    @abc.abstractmethod
    async def prune(self) -> None:
        """Delete finished jobs older than `job_retention_s`."""

    # -- the workers -----------------------------------------------------------------------

    def wake(self) -> None:
        """A job was queued here: idle workers claim now rather than at their next poll."""
        self._wake.set()

    async def start(self) -> None:
        """Start the workers and the gauge refresher."""
        name = self.settings.name
        self._tasks.append(asyncio.create_task(self._gauge_loop(), name=f"{name}-gauges"))
        for index in range(self.settings.workers):
            self._tasks.append(
                asyncio.create_task(self._loop(f"{self._identity}:{index}"), name=f"{name}-worker")
            )

    async def stop(self) -> None:
        """Stop every worker; a job in progress goes back to the queue untouched."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    def _log_failure(self, counts: bool) -> Callable[..., None]:
        return log.info if self.settings.transient_at_info and not counts else log.warning

    async def _idle(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self.settings.poll_interval_s)
        self._wake.clear()

    async def _loop(self, worker: str) -> None:
        while True:
            ran = False
            try:
                if self._ready is None or await self._ready():
                    ran = await self.run_once(worker)
            except DomainError as error:
                # Unavailable (PostgreSQL restarting, a shutdown under way): the next poll
                # tries again.
                self._log_failure(error.code not in TRANSIENT)(
                    "%s worker cannot claim", self.settings.name, extra={"reason": error.reason}
                )
            except Exception:
                log.exception("%s worker failed", self.settings.name)
            if not ran:
                await self._idle()

    async def run_once(self, worker: str) -> bool:
        """Claim one job and run it to its outcome; False when no job was due."""
        settings = self.settings
        job = await self.store.claim(worker, settings.lease_s)
        if job is None:
            return False
        assert job.lease_token is not None
        if job.failures >= settings.max_failures:
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
            self.lease_lost()
            log.warning("%s job lease lost", settings.name, extra={"job_id": str(job.job_id)})
            return True
        error = run.exception()
        if error is None:
            await self.finished(job, run.result())
            return True
        if isinstance(error, DomainError) and await self.settled(job, error):
            return True
        if isinstance(error, DomainError):
            # A refusal with a retry delay is load shedding or a spent budget: "later",
            # never "no".
            shed = error.code is Code.RESOURCE_EXHAUSTED and error.retry_after_s is not None
            await self._record_failure(
                job,
                error.reason,
                counted=error.code not in TRANSIENT and not shed,
                code=error.code.value,
                not_before_s=error.retry_after_s or 0.0,
            )
        else:
            log.error(
                "%s job crashed", settings.name, exc_info=error, extra={"job_id": str(job.job_id)}
            )
            await self._record_failure(job, "INTERNAL", counted=True)
        return True

    async def _record_failure(
        self,
        job: JobT,
        reason: str,
        *,
        counted: bool,
        code: str = "INTERNAL",
        not_before_s: float = 0.0,
    ) -> None:
        assert job.lease_token is not None
        settings = self.settings
        limit = settings.max_failures
        park = job.failures >= limit or (counted and job.failures + 1 >= limit)
        retry_s = backoff(
            job.attempts - 1,
            base_s=settings.backoff_base_s,
            max_s=settings.backoff_max_s,
            jitter=0.2,
        )
        state = await self.store.fail(
            job.job_id,
            job.lease_token,
            reason,
            counted=counted,
            park=park,
            retry_in_s=max(not_before_s, retry_s),
        )
        if state is not None:
            self.failed(park)
        # A transient failure is retried with backoff and counted by the metric: worth a
        # warning once it counts towards parking the job.
        self._log_failure(counted or park)(
            "%s job failed",
            settings.name,
            extra={
                "job_id": str(job.job_id),
                "reason": reason,
                "code": code,
                "attempts": job.attempts,
                "parked": park,
            },
        )

    async def _run(self, job: JobT) -> ResultT:
        deadline_var.set(time.monotonic() + self.settings.job_timeout_s)
        # No caller waits for a job: it runs under the service's own identity, acting for
        # the job's namespace only, so TranscriptService applies the usual rule.
        identity_var.set(self._acting_for(job.namespace) if self._acting_for else None)
        return await self.work(job)

    async def _heartbeat(self, job: JobT) -> None:
        """Extend the lease until it is lost (then return, which stops the run)."""
        assert job.lease_token is not None
        lease_s = self.settings.lease_s
        while True:
            await asyncio.sleep(lease_s / 3)
            try:
                held = await self.store.extend_lease(job.job_id, job.lease_token, lease_s)
            except DomainError:
                continue  # a store blip: the lease may still hold; try again
            if not held:
                return

    async def refresh_gauges(self) -> None:
        """Set the queue gauges (all namespaces) and prune old finished jobs now and then."""
        self.show(await self.backlog())
        now = time.monotonic()
        if now - self._last_prune >= _PRUNE_EVERY_S:
            self._last_prune = now
            await self.prune()

    async def _gauge_loop(self) -> None:
        while True:
            try:
                await self.refresh_gauges()
            except Exception as error:
                log.warning(
                    "%s gauges not refreshed",
                    self.settings.name,
                    extra={"error_type": type(error).__name__},
                )
            await asyncio.sleep(self.settings.gauge_interval_s)
