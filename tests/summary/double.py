"""An in-memory SummaryStore, for the domain unit tests.

It obeys the same protocol and atomicity as the PostgreSQL store (one lock
around every write, the same commit rule), so the domain tests exercise the
real rules.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from services.summary.jobs.model import Job, JobQueue, JobState, NewJob
from services.summary.model import (
    CommitResult,
    NewSummary,
    Summary,
    SummaryErasure,
    belongs,
    check_commit,
    conversation_erased,
)

_ACTIVE = (JobState.PENDING, JobState.RUNNING)


@dataclass
class _JobRow:
    job: Job
    run_after: float = 0.0
    lease_until: float = 0.0
    requested_again: datetime | None = None
    finish_time: float | None = None


class InMemorySummaryStore:
    """SummaryStore held in dicts."""

    def __init__(self, *, history_limit: int = 64) -> None:
        self.history_limit = history_limit
        self._summaries: dict[tuple[str, uuid.UUID], Summary] = {}
        self._history: dict[tuple[str, uuid.UUID], list[Summary]] = {}
        self._jobs: dict[uuid.UUID, _JobRow] = {}
        self._erased: set[tuple[str, uuid.UUID, int]] = set()
        # What the erasures of each tombstone's incarnation erased: (summaries, jobs).
        self._erasure_counts: dict[tuple[str, uuid.UUID, int], tuple[int, int]] = {}
        self._lock = asyncio.Lock()

    async def get_summary(self, namespace: str, conversation_id: uuid.UUID) -> Summary | None:
        return self._summaries.get((namespace, conversation_id))

    async def commit_summary(self, new: NewSummary) -> CommitResult:
        async with self._lock:
            key = (new.namespace, new.conversation_id)
            if (*key, new.incarnation) in self._erased:
                raise conversation_erased()
            stored = self._summaries.get(key)
            current = belongs(stored, new)
            if stored is not None and current is None:  # an earlier incarnation's
                del self._summaries[key]
                self._history.pop(key, None)
            replay = check_commit(current, new)
            if replay is not None:
                return CommitResult(replay, written=False)
            summary = Summary(
                new.conversation_id,
                new.namespace,
                new.text,
                new.through_sequence,
                current.revision + 1 if current else 1,
                datetime.now(UTC),
                new.incarnation,
            )
            if current is not None:
                history = self._history.setdefault(key, [])
                history.append(current)
                del history[: max(0, len(history) - self.history_limit)]
            self._summaries[key] = summary
            return CommitResult(summary, written=True)

    async def summary_history(self, namespace: str, conversation_id: uuid.UUID) -> list[Summary]:
        return list(self._history.get((namespace, conversation_id), []))

    async def erase_conversation(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int
    ) -> SummaryErasure:
        key = (namespace, conversation_id)
        async with self._lock:
            summaries = int(self._summaries.pop(key, None) is not None)
            summaries += len(self._history.pop(key, []))
            doomed = [
                j
                for j, row in self._jobs.items()
                if (row.job.namespace, row.job.conversation_id) == key
            ]
            for job_id in doomed:
                del self._jobs[job_id]
            rows = summaries + len(doomed)
            if not incarnation:
                return SummaryErasure(rows, summaries, len(doomed))
            tombstone = (namespace, conversation_id, incarnation)
            self._erased.add(tombstone)
            before = self._erasure_counts.get(tombstone, (0, 0))
            totals = (before[0] + summaries, before[1] + len(doomed))
            self._erasure_counts[tombstone] = totals
            return SummaryErasure(rows, *totals)

    def _active(self, namespace: str, conversation_id: uuid.UUID) -> _JobRow | None:
        for row in self._jobs.values():
            job = row.job
            if (
                job.namespace == namespace
                and job.conversation_id == conversation_id
                and job.state in _ACTIVE
            ):
                return row
        return None

    async def enqueue(self, job: NewJob) -> tuple[Job, bool]:
        async with self._lock:
            if (job.namespace, job.conversation_id, job.incarnation) in self._erased:
                raise conversation_erased()
            active = self._active(job.namespace, job.conversation_id)
            if active is not None:
                if active.job.state == JobState.RUNNING and active.requested_again is None:
                    active.requested_again = datetime.now(UTC)
                if job.window < active.job.window:  # it reaches as far as each request
                    active.job = replace(active.job, window=job.window)
                return active.job, False
            now = datetime.now(UTC)
            stored = Job(
                job.job_id,
                job.namespace,
                job.conversation_id,
                job.window,
                job.summary_batch,
                JobState.PENDING,
                0,
                0,
                now,
                now,
                incarnation=job.incarnation,
            )
            self._jobs[job.job_id] = _JobRow(stored, run_after=time.monotonic())
            return stored, True

    async def get_job(self, job_id: uuid.UUID) -> Job | None:
        row = self._jobs.get(job_id)
        return row.job if row else None

    async def claim(self, worker: str, lease_s: float) -> Job | None:
        async with self._lock:
            now = time.monotonic()
            due = [
                row
                for row in self._jobs.values()
                if (row.job.state == JobState.PENDING and row.run_after <= now)
                or (row.job.state == JobState.RUNNING and row.lease_until < now)
            ]
            if not due:
                return None
            row = min(due, key=lambda r: r.run_after)
            expired = row.job.state == JobState.RUNNING
            row.job = replace(
                row.job,
                state=JobState.RUNNING,
                attempts=row.job.attempts + 1,
                failures=row.job.failures + int(expired),
                last_error="LEASE_EXPIRED" if expired else row.job.last_error,
                lease_token=uuid.uuid4(),
                claimed_by=worker,
            )
            row.lease_until = now + lease_s
            return row.job

    def _held(self, job_id: uuid.UUID, lease_token: uuid.UUID) -> _JobRow | None:
        row = self._jobs.get(job_id)
        if row is None or row.job.state != JobState.RUNNING or row.job.lease_token != lease_token:
            return None
        return row

    async def extend_lease(self, job_id: uuid.UUID, lease_token: uuid.UUID, lease_s: float) -> bool:
        async with self._lock:
            row = self._held(job_id, lease_token)
            if row is None:
                return False
            row.lease_until = time.monotonic() + lease_s
            return True

    async def complete(
        self, job_id: uuid.UUID, lease_token: uuid.UUID, requeue: bool
    ) -> JobState | None:
        async with self._lock:
            row = self._held(job_id, lease_token)
            if row is None:
                return None
            again = requeue or row.requested_again is not None
            row.job = replace(
                row.job,
                state=JobState.PENDING if again else JobState.DONE,
                failures=0,
                last_error="",
                lease_token=None,
                enqueue_time=row.requested_again or row.job.enqueue_time,
            )
            row.requested_again = None
            row.run_after = time.monotonic()
            row.finish_time = None if again else time.monotonic()
            return row.job.state

    async def fail(
        self,
        job_id: uuid.UUID,
        lease_token: uuid.UUID,
        reason: str,
        *,
        counted: bool,
        park: bool,
        retry_in_s: float,
    ) -> JobState | None:
        async with self._lock:
            row = self._held(job_id, lease_token)
            if row is None:
                return None
            row.job = replace(
                row.job,
                state=JobState.FAILED if park else JobState.PENDING,
                failures=row.job.failures + int(counted),
                last_error=reason,
                lease_token=None,
            )
            row.run_after = time.monotonic() + retry_in_s
            row.finish_time = time.monotonic() if park else None
            return row.job.state

    async def release(self, job_id: uuid.UUID, lease_token: uuid.UUID) -> bool:
        async with self._lock:
            row = self._held(job_id, lease_token)
            if row is None:
                return False
            row.job = replace(
                row.job,
                state=JobState.PENDING,
                attempts=max(0, row.job.attempts - 1),
                lease_token=None,
            )
            row.run_after = time.monotonic()
            return True

    async def backlog(self, namespace: str | None) -> JobQueue:
        rows = [
            row.job
            for row in self._jobs.values()
            if namespace is None or row.job.namespace == namespace
        ]
        active = [job for job in rows if job.state in _ACTIVE]
        oldest = min((job.enqueue_time for job in active), default=None)
        age = (datetime.now(UTC) - oldest) if oldest else timedelta(0)
        return JobQueue(
            depth=len(active),
            oldest_pending_age_s=max(0.0, age.total_seconds()),
            failed_count=sum(job.state == JobState.FAILED for job in rows),
            running_count=sum(job.state == JobState.RUNNING for job in rows),
        )

    async def prune_jobs(self, older_than_s: float) -> int:
        async with self._lock:
            limit = time.monotonic() - older_than_s
            gone = [
                job_id
                for job_id, row in self._jobs.items()
                if row.finish_time is not None and row.finish_time < limit
            ]
            for job_id in gone:
                del self._jobs[job_id]
            return len(gone)
