"""The summary job queue's persistence: the protocol and its PostgreSQL adapter (table
summary.jobs).

Jobs are claimed with FOR UPDATE SKIP LOCKED under a lease: every later change
of a claimed job names its lease token, so a worker that lost its lease (it was
too slow, or presumed dead) can no longer change the job. An enqueue takes the
conversation's lock and checks its erasure tombstone (services/summary/
tombstones.py): no job is queued for an erased incarnation.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from services.common.postgres.pool import Database, fetch_one
from services.common.queue import store as queue
from services.summary.jobs import statements as sql
from services.summary.jobs.model import STATES_BY_NAME, Job, JobQueue, JobState, NewJob
from services.summary.tombstones import prune_tombstones, refuse_erased

# An enqueue can lose the race with the active job's end; it then inserts again.
_ENQUEUE_ROUNDS = 3


class JobStore(Protocol):
    """What the summary service and its workers need of the job queue. Every method is
    atomic."""

    async def enqueue(self, job: NewJob) -> tuple[Job, bool]:
        """Insert a pending job unless the conversation has a waiting or running one.

        Returns that job and False otherwise; a running job is then marked to
        run again once it finishes (the request is not lost)."""

    async def get_job(self, job_id: uuid.UUID) -> Job | None:
        """A job by id."""

    async def claim(self, worker: str, lease_s: float) -> Job | None:
        """Take the oldest due pending job, or a running job whose lease expired
        (that counts as a failure: its worker died), under a new lease."""

    async def extend_lease(self, job_id: uuid.UUID, lease_token: uuid.UUID, lease_s: float) -> bool:
        """Push the lease forward; False when the lease was lost."""

    async def complete(
        self, job_id: uuid.UUID, lease_token: uuid.UUID, requeue: bool
    ) -> JobState | None:
        """Finish an attempt that succeeded: DONE, or PENDING again when asked to
        (`requeue`) or when a request arrived meanwhile. None when the lease was lost."""

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
        """Finish an attempt that failed: PENDING after `retry_in_s`, or FAILED
        (parked). `counted` adds one to the job's failures. None when the lease was lost."""

    async def release(self, job_id: uuid.UUID, lease_token: uuid.UUID) -> bool:
        """Give a claimed job back untouched (shutdown): PENDING, due now, attempt not counted."""

    async def backlog(self, namespace: str | None) -> JobQueue:
        """The queue of a namespace, or of every namespace when None."""

    async def prune_jobs(self, older_than_s: float) -> int:
        """Delete DONE and FAILED jobs finished more than `older_than_s` ago, and erasure
        tombstones older than ERASURE_RETENTION_S."""


def _job(row: Sequence[Any]) -> Job:
    (
        job_id,
        namespace,
        conversation_id,
        window,
        summary_batch,
        state,
        attempts,
        failures,
        create_time,
        enqueue_time,
        lease_token,
        claimed_by,
        last_error,
        incarnation,
    ) = row
    return Job(
        job_id,
        namespace,
        conversation_id,
        window,
        summary_batch,
        STATES_BY_NAME[state],
        attempts,
        failures,
        create_time,
        enqueue_time,
        lease_token,
        claimed_by,
        last_error,
        incarnation,
    )


class PostgresJobStore:
    """JobStore on PostgreSQL (schema `summary`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def enqueue(self, job: NewJob) -> tuple[Job, bool]:
        params = {
            "job_id": job.job_id,
            "namespace": job.namespace,
            "conversation_id": job.conversation_id,
            "window": job.window,
            "summary_batch": job.summary_batch,
            "incarnation": job.incarnation,
        }
        async with self.db.connection() as conn:
            for _ in range(_ENQUEUE_ROUNDS):
                async with conn.transaction():
                    await refuse_erased(conn, params)
                    row = await fetch_one(conn, sql.INSERT_JOB, params)
                    if row is not None:
                        return _job(row), True
                    row = await fetch_one(conn, sql.REPEAT_JOB, params)
                    if row is not None:
                        return _job(row), False
                # The active job finished between the two statements: insert again.
        raise RuntimeError("enqueue did not settle")  # pragma: no cover

    async def get_job(self, job_id: uuid.UUID) -> Job | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn, f"SELECT {sql.JOB_COLUMNS} FROM summary.jobs WHERE job_id = %s", (job_id,)
            )
        return _job(row) if row else None

    async def claim(self, worker: str, lease_s: float) -> Job | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                sql.CLAIM,
                {"lease_token": uuid.uuid4(), "lease_s": lease_s, "worker": worker},
            )
        return _job(row) if row else None

    async def extend_lease(self, job_id: uuid.UUID, lease_token: uuid.UUID, lease_s: float) -> bool:
        return await queue.extend_lease(self.db, sql.EXTEND, job_id, lease_token, lease_s)

    async def complete(
        self, job_id: uuid.UUID, lease_token: uuid.UUID, requeue: bool
    ) -> JobState | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                sql.COMPLETE,
                {"job_id": job_id, "lease_token": lease_token, "requeue": requeue},
            )
        return STATES_BY_NAME[row[0]] if row else None

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
        state = await queue.fail(
            self.db,
            sql.FAIL,
            job_id,
            lease_token,
            reason,
            counted=counted,
            park=park,
            retry_in_s=retry_in_s,
        )
        return STATES_BY_NAME[state] if state else None

    async def release(self, job_id: uuid.UUID, lease_token: uuid.UUID) -> bool:
        return await queue.release(self.db, sql.RELEASE, job_id, lease_token)

    async def backlog(self, namespace: str | None) -> JobQueue:
        async with self.db.connection() as conn:
            row = await fetch_one(conn, sql.BACKLOG, {"namespace": namespace})
        assert row is not None
        depth, oldest, failed, running = row
        return JobQueue(depth, max(0.0, float(oldest)), failed, running)

    async def prune_jobs(self, older_than_s: float) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                """DELETE FROM summary.jobs
                    WHERE state IN ('done', 'failed')
                      AND finish_time < now() - make_interval(secs => %s)""",
                (older_than_s,),
            )
            await prune_tombstones(conn)
            return cursor.rowcount
