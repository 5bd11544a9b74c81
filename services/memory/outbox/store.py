"""The memory outbox on PostgreSQL: index writes waiting for the indexer, claimed under a
lease (FOR UPDATE SKIP LOCKED) so that no transaction is held across embedding or index
I/O (mixed into PostgresMemoryStore; MemoryStore's protocol includes OutboxStore)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Protocol

from services.common.postgres.pool import AsyncConn, Database, fetch_one
from services.memory.model import Key, Memory
from services.memory.outbox import statements as sql
from services.memory.outbox.model import OutboxClaim, OutboxDepth, OutboxEntry
from services.memory.rows import memory_from_row
from services.memory.statements import COLUMNS, LIVE


class OutboxStore(Protocol):
    """The outbox part of MemoryStore (every method atomic)."""

    async def claim_outbox(self, limit: int, lease_s: float) -> OutboxClaim | None:
        """Claim up to `limit` of the oldest outbox rows that no live claim holds, under
        a new token for `lease_s` seconds; None when there are none. An expired claim
        is claimable again. No transaction stays open: the claim is on the rows."""

    async def complete_outbox(
        self, claim: OutboxClaim, reembedded: Sequence[Key], model: str, dimension: int
    ) -> int:
        """Remove the batch's rows that still carry its token (the others were claimed
        again after the lease ended); record `model` on re-embedded memories. Returns
        how many rows were removed."""

    async def release_outbox(self, claim: OutboxClaim) -> None:
        """Give the batch's rows that still carry its token back to the next claim."""

    async def backlog(self) -> OutboxDepth:
        """Outbox depth and oldest age."""

    async def scan(self, after: Key | None, limit: int) -> list[Memory]:
        """Live memories of every namespace in key order (reindex)."""

    async def set_embedding(self, keys: Sequence[Key], model: str, dimension: int) -> None:
        """Record the model that indexed these memories."""


async def set_embedding_rows(
    conn: AsyncConn, keys: Sequence[Key], model: str, dimension: int
) -> None:
    if not keys:
        return
    await conn.execute(
        """UPDATE memory.memories AS m SET embedding_model = %s, embedding_dimension = %s
             FROM unnest(%s::text[], %s::uuid[]) AS k(namespace, memory_id)
            WHERE m.namespace = k.namespace AND m.memory_id = k.memory_id
              AND (m.embedding_model <> %s OR m.embedding_dimension <> %s)""",
        (model, dimension, [k[0] for k in keys], [k[1] for k in keys], model, dimension),
    )


class PostgresOutbox:
    """The outbox methods of PostgresMemoryStore."""

    db: Database

    async def claim_outbox(self, limit: int, lease_s: float) -> OutboxClaim | None:
        token = uuid.uuid4()
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.CLAIM_OUTBOX, {"limit": limit, "lease_s": lease_s, "token": token}
            )
            entries = sorted(
                (OutboxEntry(*row) for row in await cursor.fetchall()), key=lambda e: e.seq
            )
            if not entries:
                return None
            keys = list(dict.fromkeys((e.namespace, e.memory_id) for e in entries))
            cursor = await conn.execute(
                sql.OUTBOX_STATE, ([k[0] for k in keys], [k[1] for k in keys])
            )
            current: dict[Key, Memory] = {}
            deleted: dict[Key, int] = {}
            for row in await cursor.fetchall():
                namespace, memory_id, last_revision = row[:3]
                if row[3] is None:  # no live row joined
                    deleted[(namespace, memory_id)] = last_revision or 0
                else:
                    current[(namespace, memory_id)] = memory_from_row(row[3:])
        return OutboxClaim(token, entries, current, deleted)

    async def complete_outbox(
        self, claim: OutboxClaim, reembedded: Sequence[Key], model: str, dimension: int
    ) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.COMPLETE_OUTBOX, {"seqs": claim.seqs, "token": claim.token}
            )
            await set_embedding_rows(conn, reembedded, model, dimension)
            return cursor.rowcount

    async def release_outbox(self, claim: OutboxClaim) -> None:
        async with self.db.connection() as conn:
            await conn.execute(sql.RELEASE_OUTBOX, {"seqs": claim.seqs, "token": claim.token})

    async def backlog(self) -> OutboxDepth:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                """SELECT count(*), coalesce(extract(epoch FROM now() - min(enqueued_at)), 0)
                     FROM memory.outbox""",
            )
        assert row is not None
        return OutboxDepth(int(row[0]), float(row[1]))

    async def scan(self, after: Key | None, limit: int) -> list[Memory]:
        namespace, memory_id = after if after else ("", uuid.UUID(int=0))
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {COLUMNS} FROM memory.memories
                     WHERE (namespace, memory_id) > (%s, %s) AND {LIVE}
                     ORDER BY namespace, memory_id LIMIT %s""",
                (namespace, memory_id, limit),
            )
            return [memory_from_row(row) for row in await cursor.fetchall()]

    async def set_embedding(self, keys: Sequence[Key], model: str, dimension: int) -> None:
        async with self.db.connection() as conn:
            await set_embedding_rows(conn, keys, model, dimension)
