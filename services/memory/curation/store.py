"""Automatic curation's persistence: the protocol and its PostgreSQL adapter (the job queue,
the cursors, the clocks and the budget in schema `memory`, beside the memories a batch
stores).

Jobs are claimed with FOR UPDATE SKIP LOCKED under a lease: every later change of a
claimed job names its lease token, so a worker that lost its lease can no longer change
the job. A batch is applied in ONE transaction with the memories it writes: under the
conversation's advisory lock (the lock every write and erasure naming the conversation
takes), it checks the erasure tombstone, that its lease still holds, and that the
conversation's cursor is where the batch started; then it forgets the curated memories
of retracted entries, stores the facts (each with its history and outbox rows, and the
supersessions it makes, by compare-and-swap), moves the cursor and counts the facts.
Any refusal rolls everything back: a batch is applied whole, once, or not at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from psycopg.types.json import Jsonb

from services.common.postgres.pool import AsyncConn, Database, fetch_one
from services.common.queue import store as queue
from services.memory.curation import statements as sql
from services.memory.curation.model import (
    ORIGIN,
    ORIGIN_KEY,
    STATES_BY_NAME,
    Batch,
    BatchResult,
    CurationBacklog,
    CurationJob,
    Cursor,
    JobState,
    curation_lease_lost,
    cursor_moved,
    window_start,
)
from services.memory.model import Memory
from services.memory.proposals.model import conversation_erased
from services.memory.rows import memory_from_row, sources_json
from services.memory.statements import COLUMNS, LIVE
from services.memory.writes import statements as write_sql
from services.memory.writes import transaction
from services.memory.writes.model import MemoryWrite

# An enqueue can lose the race with the active job's end; it then inserts again.
_ENQUEUE_ROUNDS = 3


class CurationStore(Protocol):
    """What automatic curation needs of its store. Every method is atomic."""

    async def enqueue(
        self,
        job_id: uuid.UUID,
        namespace: str,
        conversation_id: uuid.UUID,
        incarnation: int,
        max_pending: int,
    ) -> tuple[CurationJob, bool] | None:
        """Queue a job unless the conversation has a waiting or running one (returned with
        False: a running one is marked to run again). None when the namespace already has
        `max_pending` active jobs. CONVERSATION_ERASED when an erasure fenced the
        incarnation."""

    async def get_job(self, job_id: uuid.UUID) -> CurationJob | None:
        """A job by id."""

    async def claim(self, worker: str, lease_s: float) -> CurationJob | None:
        """Take the first due waiting job in fair order, or a running job whose lease
        expired (counted as a failure: its worker died), under a new lease."""

    async def extend_lease(self, job_id: uuid.UUID, lease_token: uuid.UUID, lease_s: float) -> bool:
        """Push the lease forward; False when it was lost."""

    async def complete(
        self, job: CurationJob, lease_token: uuid.UUID, requeue: bool
    ) -> JobState | None:
        """Finish an attempt that succeeded: DONE, or PENDING again when asked to or when
        a request arrived meanwhile. None when the lease was lost."""

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
        """Finish an attempt that failed: PENDING after `retry_in_s`, or FAILED (parked).
        None when the lease was lost."""

    async def defer_namespace(self, namespace: str, reason: str, retry_in_s: float) -> int:
        """Make every waiting job of a namespace wait `retry_in_s` (its budget is spent)."""

    async def release(self, job_id: uuid.UUID, lease_token: uuid.UUID) -> bool:
        """Give a claimed job back untouched (shutdown)."""

    async def backlog(self, namespace: str | None, now: datetime) -> CurationBacklog:
        """The queue of a namespace (and its spending in the hour of `now`), or of every
        namespace when None."""

    async def active_count(self, namespace: str, limit: int) -> int:
        """The namespace's waiting and running jobs, counted up to `limit`."""

    async def cursor(self, namespace: str, conversation_id: uuid.UUID, incarnation: int) -> Cursor:
        """How far curation read this incarnation of the conversation."""

    async def reserve(
        self, namespace: str, now: datetime, tokens: int, max_calls: int, max_tokens: int
    ) -> bool:
        """Charge one model call and `tokens` to the namespace's hour unless a limit
        (0: none) would be passed; False (nothing charged) when it would."""

    async def settle(self, namespace: str, when: datetime, delta_tokens: int) -> None:
        """Correct the tokens charged in the hour of `when` by what the call really used."""

    async def recent_curated(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        metadata: Mapping[str, str],
        limit: int,
    ) -> list[Memory]:
        """The conversation's latest open memories with the metadata, newest first."""

    async def apply_batch(
        self, batch: Batch, writes: Sequence[MemoryWrite], now: datetime
    ) -> BatchResult:
        """Apply a batch in one transaction (see the module): CONVERSATION_ERASED,
        CURATION_LEASE_LOST, CURATION_CURSOR_MOVED and the supersession refusals of
        UpsertMemory (REVISION_CONFLICT, ...) store nothing."""

    async def prune(self, older_than_s: float) -> int:
        """Delete DONE and FAILED jobs finished more than `older_than_s` ago, and the
        hourly usage of days past."""


def _job(row: Sequence[Any]) -> CurationJob:
    (
        job_id,
        namespace,
        conversation_id,
        incarnation,
        state,
        attempts,
        failures,
        create_time,
        enqueue_time,
        lease_token,
        claimed_by,
        last_error,
        batches,
        facts,
    ) = row[:14]
    return CurationJob(
        job_id,
        namespace,
        conversation_id,
        incarnation,
        STATES_BY_NAME[state],
        attempts,
        failures,
        create_time,
        enqueue_time,
        lease_token,
        claimed_by,
        last_error,
        batches,
        facts,
    )


async def _refuse_erased(
    conn: AsyncConn, namespace: str, conversation_id: uuid.UUID, incarnation: int
) -> None:
    """Inside a transaction: take the conversation's lock, then refuse when an erasure
    fenced this incarnation (the check sees every erasure that took the lock first)."""
    await conn.execute(write_sql.LOCK_CONVERSATION, (namespace, str(conversation_id)))
    erased = await fetch_one(
        conn,
        """SELECT 1 FROM memory.erasures
            WHERE namespace = %s AND conversation_id = %s AND incarnation = %s""",
        (namespace, conversation_id, incarnation),
    )
    if erased is not None:
        raise conversation_erased()


class PostgresCurationStore:
    """CurationStore on PostgreSQL (schema `memory`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def enqueue(
        self,
        job_id: uuid.UUID,
        namespace: str,
        conversation_id: uuid.UUID,
        incarnation: int,
        max_pending: int,
    ) -> tuple[CurationJob, bool] | None:
        params = {
            "job_id": job_id,
            "namespace": namespace,
            "conversation_id": conversation_id,
            "incarnation": incarnation,
            "max_pending": max_pending,
        }
        async with self.db.connection() as conn:
            for _ in range(_ENQUEUE_ROUNDS):
                async with conn.transaction():
                    await _refuse_erased(conn, namespace, conversation_id, incarnation)
                    await conn.execute(sql.LOCK_NAMESPACE_QUEUE, (namespace,))
                    row = await fetch_one(conn, sql.INSERT_JOB, params)
                    if row is not None:
                        return _job(row), True
                    row = await fetch_one(conn, sql.REPEAT_JOB, params)
                    if row is not None:
                        return _job(row), False
                    full = await fetch_one(conn, sql.ACTIVE_COUNT, params)
                    if full is not None and full[0] >= max_pending:
                        return None
                # The active job finished between the two statements: insert again.
        raise RuntimeError("enqueue did not settle")  # pragma: no cover

    async def get_job(self, job_id: uuid.UUID) -> CurationJob | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                f"SELECT {sql.JOB_COLUMNS} FROM memory.curation_jobs WHERE job_id = %s",
                (job_id,),
            )
        return _job(row) if row else None

    async def claim(self, worker: str, lease_s: float) -> CurationJob | None:
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
        self, job: CurationJob, lease_token: uuid.UUID, requeue: bool
    ) -> JobState | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                sql.COMPLETE,
                {
                    "job_id": job.job_id,
                    "lease_token": lease_token,
                    "requeue": requeue,
                    "namespace": job.namespace,
                },
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

    async def defer_namespace(self, namespace: str, reason: str, retry_in_s: float) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.DEFER_NAMESPACE,
                {"namespace": namespace, "reason": reason, "retry_in_s": retry_in_s},
            )
            return cursor.rowcount

    async def release(self, job_id: uuid.UUID, lease_token: uuid.UUID) -> bool:
        return await queue.release(self.db, sql.RELEASE, job_id, lease_token)

    async def backlog(self, namespace: str | None, now: datetime) -> CurationBacklog:
        async with self.db.connection() as conn:
            row = await fetch_one(conn, sql.BACKLOG, {"namespace": namespace})
            usage = (
                await fetch_one(
                    conn, sql.USAGE, {"namespace": namespace, "window_start": window_start(now)}
                )
                if namespace is not None
                else None
            )
        assert row is not None
        depth, oldest, failed, running = row
        calls, tokens, facts = usage or (0, 0, 0)
        return CurationBacklog(
            depth, max(0.0, float(oldest)), failed, running, calls, tokens, facts
        )

    async def active_count(self, namespace: str, limit: int) -> int:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn, sql.ACTIVE_COUNT, {"namespace": namespace, "max_pending": limit}
            )
        return int(row[0]) if row else 0

    async def cursor(self, namespace: str, conversation_id: uuid.UUID, incarnation: int) -> Cursor:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn, sql.CURSOR, {"namespace": namespace, "conversation_id": conversation_id}
            )
        if row is None or row[0] != incarnation:
            return Cursor()  # never curated, or an erased incarnation's (its id made again)
        return Cursor(row[1], row[2])

    async def reserve(
        self, namespace: str, now: datetime, tokens: int, max_calls: int, max_tokens: int
    ) -> bool:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                sql.RESERVE,
                {
                    "namespace": namespace,
                    "window_start": window_start(now),
                    "tokens": tokens,
                    "max_calls": max_calls,
                    "max_tokens": max_tokens,
                },
            )
        return row is not None

    async def settle(self, namespace: str, when: datetime, delta_tokens: int) -> None:
        if not delta_tokens:
            return
        async with self.db.connection() as conn:
            await conn.execute(
                sql.SETTLE,
                {"namespace": namespace, "window_start": window_start(when), "delta": delta_tokens},
            )

    async def recent_curated(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        metadata: Mapping[str, str],
        limit: int,
    ) -> list[Memory]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.RECENT_CURATED.format(columns=COLUMNS, live=LIVE),
                {
                    "namespace": namespace,
                    "containment": Jsonb([{"c": str(conversation_id)}]),
                    "metadata": Jsonb(dict(metadata)),
                    "limit": limit,
                },
            )
            return [memory_from_row(row) for row in await cursor.fetchall()]

    async def apply_batch(
        self, batch: Batch, writes: Sequence[MemoryWrite], now: datetime
    ) -> BatchResult:
        key = {"namespace": batch.namespace, "conversation_id": batch.conversation_id}
        async with self.db.connection() as conn, conn.transaction():
            await _refuse_erased(conn, batch.namespace, batch.conversation_id, batch.incarnation)
            held = await fetch_one(
                conn, sql.HOLD_JOB, {"job_id": batch.job_id, "lease_token": batch.lease_token}
            )
            if held is None:
                raise curation_lease_lost()
            row = await fetch_one(conn, sql.CURSOR_FOR_UPDATE, key)
            current = row[1] if row is not None and row[0] == batch.incarnation else 0
            if current != batch.after_sequence:
                raise cursor_moved(current)
            forgotten = 0
            if batch.retracted:
                cursor = await conn.execute(
                    write_sql.ERASE.format(victims=sql.RETRACTED_VICTIMS, extra=""),
                    {
                        **key,
                        "containment": Jsonb([{"c": str(batch.conversation_id)}]),
                        "conversation": str(batch.conversation_id),
                        "origin": Jsonb({ORIGIN_KEY: ORIGIN}),
                        "retracted": list(batch.retracted),
                        "reason": "retracted",
                    },
                )
                forgotten = len(await cursor.fetchall())
            superseded = 0
            for write in writes:
                locked = await transaction.lock_superseded(conn, write, updating=False)
                created = await fetch_one(conn, write_sql.CREATE, _params(write))
                assert created is not None  # a fresh UUIDv7: never taken
                result = await transaction.recorded(
                    conn, write, memory_from_row(created), locked, created=True
                )
                superseded += len(result.superseded)
            await conn.execute(
                sql.SAVE_CURSOR,
                {
                    **key,
                    "incarnation": batch.incarnation,
                    "through": batch.through_sequence,
                    "version": batch.conversation_version,
                },
            )
            await conn.execute(sql.COUNT_BATCH, {"job_id": batch.job_id, "facts": len(writes)})
            if writes:
                await conn.execute(
                    sql.COUNT_FACTS,
                    {
                        "namespace": batch.namespace,
                        "window_start": window_start(now),
                        "facts": len(writes),
                    },
                )
        return BatchResult(len(writes), superseded, forgotten)

    async def prune(self, older_than_s: float) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                """DELETE FROM memory.curation_jobs
                    WHERE state IN ('done', 'failed')
                      AND finish_time < now() - make_interval(secs => %s)""",
                (older_than_s,),
            )
            await conn.execute(
                "DELETE FROM memory.curation_usage WHERE window_start < now() - interval '2 days'"
            )
            return cursor.rowcount


def _params(write: MemoryWrite) -> dict[str, Any]:
    """The parameters of the CREATE statement for a curated memory."""
    return {
        "namespace": write.namespace,
        "memory_id": write.memory_id,
        "content": write.content,
        "sources": Jsonb(sources_json(write.sources)),
        "metadata": Jsonb(dict(write.metadata)),
        "expected_revision": None,
        "expire_time": write.expire_time,
        "model": write.embedding_model,
        "dimension": write.embedding_dimension,
        "valid_from": write.valid_from_time,
        "valid_until": write.valid_until_time,
    }
