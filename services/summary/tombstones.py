"""Erasure tombstones: the incarnation of a conversation that an erasure erased.

An erasure (SummaryStore.erase_conversation) leaves one, and every commit and
enqueue checks for it under the conversation's advisory lock, so a summary or a
job for an erased incarnation is refused (CONVERSATION_ERASED) whatever the
interleaving: a summarizer still inside its model call when the erasure ran
cannot bring the erased text back.
"""

from __future__ import annotations

from typing import Any

from services.common.postgres.pool import AsyncConn, fetch_one
from services.summary import statements as sql
from services.summary.model import conversation_erased

# Tombstones are kept this long: far longer than any summarizer call or job attempt
# can be in flight (their deadlines are minutes).
ERASURE_RETENTION_S = 7 * 24 * 3600.0


async def refuse_erased(conn: AsyncConn, params: dict[str, Any]) -> None:
    """Inside a commit's or an enqueue's transaction: take the conversation's lock, then
    refuse when an erasure left a tombstone for this incarnation (the check sees every
    erasure that took the lock first)."""
    await conn.execute(sql.LOCK_CONVERSATION, params)
    if await fetch_one(conn, sql.ERASED, params):
        raise conversation_erased()


async def write_tombstone(conn: AsyncConn, params: dict[str, Any]) -> tuple[int, int]:
    """Inside an erasure's transaction, under the conversation's lock: the tombstone of
    `incarnation`, adding the `summaries` and `jobs` this erasure deleted to what earlier
    erasures of the incarnation did; returns the totals (an erasure receipt's counts)."""
    row = await fetch_one(conn, sql.INSERT_TOMBSTONE, params)
    assert row is not None  # the upsert always returns its row
    return int(row[0]), int(row[1])


async def prune_tombstones(conn: AsyncConn) -> None:
    """Delete the tombstones older than ERASURE_RETENTION_S."""
    await conn.execute(sql.PRUNE_TOMBSTONES, {"retention_s": ERASURE_RETENTION_S})
