"""Erasure receipts in the store: the protocol (`ReceiptStore`, part of TranscriptStore)
and its PostgreSQL adapter; `record_in` lets the deletion of a transcript record its
receipt in its own transaction (conversations/store.py)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from psycopg.types.json import Jsonb

from services.common.postgres.pool import AsyncConn, Database, fetch_one
from services.transcript.receipts import statements as sql
from services.transcript.receipts.model import ErasureProgress, ErasureReceipt


class ReceiptStore(Protocol):
    """The receipts part of TranscriptStore (every method atomic)."""

    async def record_receipt(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        incarnation: int,
        progress: ErasureProgress,
        receipt_id: uuid.UUID,
    ) -> ErasureReceipt | None:
        """Make the incarnation's receipt (with `receipt_id`) or merge `progress` into the
        one kept (model.merge); return it as kept. None, and nothing written, when neither
        that incarnation of the conversation nor a receipt of it exists."""

    async def get_receipt(self, namespace: str, receipt_id: uuid.UUID) -> ErasureReceipt | None:
        """The receipt, or None (also for another namespace's)."""

    async def latest_receipt(
        self, namespace: str, conversation_id: uuid.UUID
    ) -> ErasureReceipt | None:
        """The latest receipt of a conversation id in the namespace, or None."""

    async def sweep_receipts(self, retention_s: float, limit: int) -> int:
        """Delete up to `limit` receipts first recorded more than `retention_s` ago."""


def receipt_from_row(row: Sequence[Any]) -> ErasureReceipt:
    receipt_id, namespace, conversation_id, incarnation, counts, remaining, created, done = row
    return ErasureReceipt(
        receipt_id,
        namespace,
        conversation_id,
        incarnation,
        {name: int(value) for name, value in counts.items()},
        list(remaining),
        created,
        done,
    )


async def record_in(
    conn: AsyncConn,
    namespace: str,
    conversation_id: uuid.UUID,
    incarnation: int,
    progress: ErasureProgress,
    receipt_id: uuid.UUID,
) -> ErasureReceipt:
    """Record a receipt inside the caller's transaction (one statement)."""
    row = await fetch_one(
        conn,
        sql.RECORD,
        {
            "receipt_id": receipt_id,
            "namespace": namespace,
            "conversation_id": conversation_id,
            "incarnation": incarnation,
            "counts": Jsonb(dict(progress.counts)),
            "remaining": sorted(set(progress.remaining)),
        },
    )
    assert row is not None  # the upsert returns its row
    return receipt_from_row(row)


async def receipt_kept(
    conn: AsyncConn, namespace: str, conversation_id: uuid.UUID, incarnation: int
) -> bool:
    """Whether a receipt of that incarnation is kept (seen from `conn`'s transaction)."""
    row = await fetch_one(
        conn,
        sql.KEPT,
        {"namespace": namespace, "conversation_id": conversation_id, "incarnation": incarnation},
    )
    return row is not None


class PostgresReceipts:
    """The receipt methods of PostgresTranscriptStore."""

    db: Database

    async def record_receipt(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        incarnation: int,
        progress: ErasureProgress,
        receipt_id: uuid.UUID,
    ) -> ErasureReceipt | None:
        async with self.db.connection() as conn:
            params = {
                "namespace": namespace,
                "conversation_id": conversation_id,
                "incarnation": incarnation,
            }
            # Checked before the upsert, not in one transaction: a conversation deleted in
            # between was there when the erasure asked (a receipt of it is right).
            if await fetch_one(conn, sql.RECORDABLE, params) is None:
                return None
            return await record_in(
                conn, namespace, conversation_id, incarnation, progress, receipt_id
            )

    async def get_receipt(self, namespace: str, receipt_id: uuid.UUID) -> ErasureReceipt | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn, sql.BY_ID, {"namespace": namespace, "receipt_id": receipt_id}
            )
        return receipt_from_row(row) if row is not None else None

    async def latest_receipt(
        self, namespace: str, conversation_id: uuid.UUID
    ) -> ErasureReceipt | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn, sql.LATEST, {"namespace": namespace, "conversation_id": conversation_id}
            )
        return receipt_from_row(row) if row is not None else None

    async def sweep_receipts(self, retention_s: float, limit: int) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(sql.SWEEP, {"retention_s": retention_s, "limit": limit})
            return cursor.rowcount
