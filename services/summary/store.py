"""Summary persistence: the store protocol and its PostgreSQL adapter (schema `summary`).

A commit holds the conversation's summary row (SELECT ... FOR UPDATE) while
it applies the monotonic rule (`model.check_commit`), so racing commits are
serialized by PostgreSQL and the rule sees the latest summary. Commits,
enqueues and erasures of one conversation also take a transaction-scoped
advisory lock on it, so a commit or job for an incarnation that an erasure has
left a tombstone for is refused (CONVERSATION_ERASED) whatever the interleaving
(tombstones.py). The store is also the job queue's (jobs/store.py): an erasure
deletes the conversation's jobs with its summaries, in one transaction.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from services.common.postgres.pool import AsyncConn, Database, fetch_one
from services.summary import statements as sql
from services.summary.jobs.store import JobStore, PostgresJobStore
from services.summary.model import (
    CommitResult,
    NewSummary,
    Summary,
    SummaryErasure,
    belongs,
    check_commit,
)
from services.summary.tombstones import refuse_erased, write_tombstone

# A first commit can lose the race to insert the row; it then re-reads once.
_COMMIT_ROUNDS = 3


class SummaryStore(JobStore, Protocol):
    """What the summary service and its workers need from a store: summaries, and the job
    queue (JobStore). Every method is atomic."""

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
    ) -> SummaryErasure:
        """Erase what was derived from a conversation: summaries, history and jobs; with an
        `incarnation`, leave its tombstone (later commits and jobs for it are
        CONVERSATION_ERASED), which adds up what every erasure of the incarnation erased.
        Returns the rows this call erased, and those totals."""


# --- PostgreSQL -------------------------------------------------------------


class PostgresSummaryStore(PostgresJobStore):
    """SummaryStore on PostgreSQL (schema `summary`): summaries here, jobs inherited."""

    def __init__(self, db: Database, *, history_limit: int = 64) -> None:
        super().__init__(db)
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
                    await refuse_erased(conn, params)
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
    ) -> SummaryErasure:
        params = {
            "namespace": namespace,
            "conversation_id": conversation_id,
            "incarnation": incarnation,
        }
        async with self.db.connection() as conn, conn.transaction():
            await conn.execute(sql.LOCK_CONVERSATION, params)
            summaries, jobs = await _delete_counted(conn, params, jobs=True)
            if not incarnation:
                return SummaryErasure(summaries + jobs, summaries, jobs)
            # After the deletes, under the lock: the tombstone adds this call's counts.
            totals = await write_tombstone(conn, {**params, "summaries": summaries, "jobs": jobs})
            return SummaryErasure(summaries + jobs, *totals)


async def _delete_derived(conn: AsyncConn, params: dict[str, Any], *, jobs: bool) -> int:
    """Delete a conversation's summaries and history (and jobs); return the rows deleted."""
    return sum(await _delete_counted(conn, params, jobs=jobs))


async def _delete_counted(
    conn: AsyncConn, params: dict[str, Any], *, jobs: bool
) -> tuple[int, int]:
    """Delete a conversation's summaries and history (and jobs); return the summaries
    (current and history) and the jobs deleted."""
    tables = ("summaries", "summary_history", "jobs") if jobs else ("summaries", "summary_history")
    erased = {}
    for table in tables:
        cursor = await conn.execute(
            f"""DELETE FROM summary.{table}
                 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s""",
            params,
        )
        erased[table] = cursor.rowcount
    return erased["summaries"] + erased["summary_history"], erased.get("jobs", 0)
