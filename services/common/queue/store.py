"""The statements of a durable job queue's lease, run on PostgreSQL: what every queue's
store (services/summary/jobs/store.py, services/memory/curation/store.py) runs alike,
each with its own SQL (its statements.py; the shared text is statements.py here).
"""

from __future__ import annotations

import uuid

from services.common.postgres.pool import Database, fetch_one


async def extend_lease(
    db: Database, statement: str, job_id: uuid.UUID, lease_token: uuid.UUID, lease_s: float
) -> bool:
    """Push the lease forward; False when it was lost."""
    async with db.connection() as conn:
        cursor = await conn.execute(
            statement, {"job_id": job_id, "lease_token": lease_token, "lease_s": lease_s}
        )
        return cursor.rowcount == 1


async def fail(
    db: Database,
    statement: str,
    job_id: uuid.UUID,
    lease_token: uuid.UUID,
    reason: str,
    *,
    counted: bool,
    park: bool,
    retry_in_s: float,
) -> str | None:
    """Finish an attempt that failed; the job's state after it ("pending", "failed"), or
    None when the lease was lost."""
    async with db.connection() as conn:
        row = await fetch_one(
            conn,
            statement,
            {
                "job_id": job_id,
                "lease_token": lease_token,
                "reason": reason,
                "counted": counted,
                "park": park,
                "retry_in_s": retry_in_s,
            },
        )
    return str(row[0]) if row else None


async def release(db: Database, statement: str, job_id: uuid.UUID, lease_token: uuid.UUID) -> bool:
    """Give a claimed job back untouched; False when the lease was lost."""
    async with db.connection() as conn:
        cursor = await conn.execute(statement, {"job_id": job_id, "lease_token": lease_token})
        return cursor.rowcount == 1
