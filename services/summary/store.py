"""Summary persistence: the store protocol and its PostgreSQL adapter (schema `summary`).

A commit holds the conversation's summary row (SELECT ... FOR UPDATE) while
it applies the monotonic rule (`model.check_commit`), so racing commits are
serialized by PostgreSQL and the rule sees the latest summary. Commits,
enqueues and erasures of one conversation also take a transaction-scoped
advisory lock on it, so a commit or job for an incarnation that an erasure has
fenced is refused (CONVERSATION_ERASED) whatever the interleaving. Jobs are
claimed with FOR UPDATE SKIP LOCKED under a lease: every later change of a
claimed job names its lease token, so a worker that lost its lease (it was
too slow, or presumed dead) can no longer change the job.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from services.common.postgres.pool import AsyncConn, Database, fetch_one
from services.summary import statements as sql
from services.summary.model import (
    STATES_BY_NAME,
    CommitResult,
    Job,
    JobQueue,
    JobState,
    NewJob,
    NewSummary,
    Summary,
    belongs,
    check_commit,
    conversation_erased,
)

# Erasure tombstones are kept this long: far longer than any summarizer call or job
# attempt can be in flight (their deadlines are minutes).
ERASURE_RETENTION_S = 7 * 24 * 3600.0

# A first commit can lose the race to insert the row; it then re-reads once.
_COMMIT_ROUNDS = 3


class SummaryStore(Protocol):
    """What the summary service and its workers need from a store. Every method is atomic."""

    async def get_summary(self, namespace: str, conversation_id: uuid.UUID) -> Summary | None:
        """The current summary, or None."""

    async def commit_summary(self, new: NewSummary) -> CommitResult:
        """Apply `check_commit` against the current summary and write atomically.

        The replaced summary moves to the history, which keeps the newest
        `history_limit` replaced revisions."""

    async def summary_history(self, namespace: str, conversation_id: uuid.UUID) -> list[Summary]:
        """The replaced summaries kept, oldest first."""

    async def erase_conversation(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int
    ) -> int:
        """Erase what was derived from a conversation: summaries, history and jobs; with an
        `incarnation`, fence it (later commits and jobs for it are CONVERSATION_ERASED).
        Returns the number of rows erased."""

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


# --- PostgreSQL -------------------------------------------------------------


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


class PostgresSummaryStore:
    """SummaryStore on PostgreSQL (schema `summary`)."""

    def __init__(self, db: Database, *, history_limit: int = 64) -> None:
        self.db = db
        self.history_limit = history_limit

    async def get_summary(self, namespace: str, conversation_id: uuid.UUID) -> Summary | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn, sql.GET_SUMMARY, {"namespace": namespace, "conversation_id": conversation_id}
            )
        return Summary(*row) if row else None

    async def commit_summary(self, new: NewSummary) -> CommitResult:
        params = {
            "namespace": new.namespace,
            "conversation_id": new.conversation_id,
            "through_sequence": new.through_sequence,
            "text": new.text,
            "history_limit": self.history_limit,
            "incarnation": new.incarnation,
        }
        async with self.db.connection() as conn:
            for _ in range(_COMMIT_ROUNDS):
                async with conn.transaction():
                    await _check_tombstone(conn, params)
                    row = await fetch_one(conn, sql.GET_SUMMARY + " FOR UPDATE", params)
                    stored = Summary(*row) if row else None
                    current = belongs(stored, new)
                    if stored is not None and current is None:
                        # An earlier incarnation's: it describes nothing that exists.
                        await _delete_derived(conn, params, jobs=False)
                    replay = check_commit(current, new)
                    if replay is not None:
                        return CommitResult(replay, written=False)
                    if current is None:
                        row = await fetch_one(conn, sql.INSERT_FIRST_SUMMARY, params)
                        if row is None:
                            continue  # a racing first commit won the insert: re-read it
                    else:
                        row = await fetch_one(
                            conn,
                            sql.REPLACE_SUMMARY,
                            {**params, "current_revision": current.revision},
                        )
                    assert row is not None
                    return CommitResult(Summary(*row), written=True)
        raise RuntimeError("summary commit did not settle")  # pragma: no cover

    async def summary_history(self, namespace: str, conversation_id: uuid.UUID) -> list[Summary]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {sql.SUMMARY_COLUMNS} FROM summary.summary_history
                     WHERE namespace = %s AND conversation_id = %s
                     ORDER BY revision""",
                (namespace, conversation_id),
            )
            return [Summary(*row) for row in await cursor.fetchall()]

    async def erase_conversation(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int
    ) -> int:
        params = {
            "namespace": namespace,
            "conversation_id": conversation_id,
            "incarnation": incarnation,
        }
        async with self.db.connection() as conn, conn.transaction():
            await conn.execute(sql.LOCK_CONVERSATION, params)
            if incarnation:
                await conn.execute(
                    """INSERT INTO summary.erasures (namespace, conversation_id, incarnation)
                       VALUES (%(namespace)s, %(conversation_id)s, %(incarnation)s)
                       ON CONFLICT DO NOTHING""",
                    params,
                )
            return await _delete_derived(conn, params, jobs=True)

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
            for _ in range(_COMMIT_ROUNDS):
                async with conn.transaction():
                    await _check_tombstone(conn, params)
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
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.EXTEND, {"job_id": job_id, "lease_token": lease_token, "lease_s": lease_s}
            )
            return cursor.rowcount == 1

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
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                sql.FAIL,
                {
                    "job_id": job_id,
                    "lease_token": lease_token,
                    "reason": reason,
                    "counted": counted,
                    "park": park,
                    "retry_in_s": retry_in_s,
                },
            )
        return STATES_BY_NAME[row[0]] if row else None

    async def release(self, job_id: uuid.UUID, lease_token: uuid.UUID) -> bool:
        async with self.db.connection() as conn:
            cursor = await conn.execute(sql.RELEASE, {"job_id": job_id, "lease_token": lease_token})
            return cursor.rowcount == 1

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
            await conn.execute(
                """DELETE FROM summary.erasures
                    WHERE erase_time < now() - make_interval(secs => %s)""",
                (ERASURE_RETENTION_S,),
            )
            return cursor.rowcount


async def _check_tombstone(conn: AsyncConn, params: dict[str, Any]) -> None:
    """Inside a commit's or an enqueue's transaction: take the conversation's lock, then
    refuse when an erasure fenced this incarnation (its statement sees every erasure that
    took the lock first)."""
    await conn.execute(sql.LOCK_CONVERSATION, params)
    if await fetch_one(conn, sql.ERASED, params):
        raise conversation_erased()


async def _delete_derived(conn: AsyncConn, params: dict[str, Any], *, jobs: bool) -> int:
    """Delete a conversation's summaries and history (and jobs); return the rows deleted."""
    tables = ("summaries", "summary_history", "jobs") if jobs else ("summaries", "summary_history")
    erased = 0
    for table in tables:
        cursor = await conn.execute(
            f"""DELETE FROM summary.{table}
                 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s""",
            params,
        )
        erased += cursor.rowcount
    return erased
