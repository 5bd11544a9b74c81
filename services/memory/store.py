"""Memory persistence: the store protocol and its PostgreSQL adapter (schema `memory`).

Every write is ONE SQL statement in autocommit: the change to the memory row,
its history row and its outbox row are written together or not at all, so
the index can never miss a write (transactional outbox). Only when the
statement wrote nothing do we look at why.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from psycopg.types.json import Jsonb

from services.common.db import AsyncConn, Database, fetch_one
from services.memory import statements as sql
from services.memory.model import (
    Memory,
    MemoryWrite,
    RevisionRecord,
    ScoredMemory,
    memory_exists,
    memory_not_found,
    request_id_reused,
    revision_conflict,
    source_not_found,
)
from services.memory.outbox_store import OutboxStore, PostgresOutbox
from services.memory.rows import memory_from_row, sources_json

# Erasure tombstones are kept this long: far longer than a source check and its write
# can be apart (a request's deadline is minutes at most).
ERASURE_RETENTION_S = 7 * 24 * 3600.0


class MemoryStore(OutboxStore, Protocol):
    """What the memory service needs from a store. Every method is atomic."""

    async def create(self, write: MemoryWrite) -> tuple[Memory, bool]:
        """Insert a memory; MEMORY_ALREADY_EXISTS if its id is live in the namespace.

        Every write (create and update) is refused with SOURCE_NOT_FOUND when one of
        `write.source_incarnations` was fenced by an erasure, and with a request id
        it replays the request's first result (REQUEST_ID_REUSED for another
        payload). Returns the memory and whether the (first) write created it."""

    async def update(self, write: MemoryWrite) -> tuple[Memory, bool]:
        """Replace a live memory at `write.expected_revision`; NOT_FOUND or REVISION_CONFLICT
        (and the rules of `create` on fences and request ids)."""

    async def get(self, namespace: str, memory_id: uuid.UUID) -> Memory | None:
        """The live memory, or None (also when expired or in another namespace)."""

    async def get_many(
        self, namespace: str, memory_ids: Sequence[uuid.UUID], metadata: Mapping[str, str]
    ) -> list[Memory]:
        """The live memories among `memory_ids` whose metadata holds every pair given."""

    async def list_memories(
        self,
        namespace: str,
        conversation_id: uuid.UUID | None,
        after: uuid.UUID | None,
        limit: int,
    ) -> list[Memory]:
        """Live memories in id order after a cursor, optionally with a source in a conversation."""

    async def delete(
        self, namespace: str, memory_id: uuid.UUID, expected_revision: int | None
    ) -> bool:
        """Erase a memory; False if it was not live; REVISION_CONFLICT on a stale revision."""

    async def forget_source(
        self, namespace: str, conversation_id: uuid.UUID, low: int, high: int, incarnation: int = 0
    ) -> int:
        """Erase every memory with a source range of the conversation overlapping [low, high];
        with an `incarnation`, fence it first (later writes naming it are refused)."""

    async def sweep_requests(self, older_than_s: float) -> int:
        """Forget request ids recorded more than `older_than_s` ago, and erasure tombstones
        older than ERASURE_RETENTION_S."""

    async def sweep_expired(self, limit: int) -> int:
        """Erase up to `limit` expired memories; return how many."""

    async def text_search(
        self, namespace: str, query: str, metadata: Mapping[str, str], limit: int
    ) -> list[ScoredMemory]:
        """Full-text search over live memories (the degraded mode); rank as score."""

    async def history(self, namespace: str, memory_id: uuid.UUID) -> list[RevisionRecord]:
        """Every revision of a memory id in the namespace, oldest first."""


# --- PostgreSQL -------------------------------------------------------------


async def _fence(conn: AsyncConn, write: MemoryWrite) -> tuple[Memory, bool] | None:
    """Inside the write's transaction: lock its source conversations (in a fixed order),
    refuse the write if an erasure fenced one of them, and claim its request id (or return
    the first result of that request). Runs before the write statement, whose snapshot
    then sees every erasure that took the lock first."""
    for cid in sorted(write.source_incarnations):
        await conn.execute(sql.LOCK_CONVERSATION, (write.namespace, str(cid)))
    if write.source_incarnations:
        cids = sorted(write.source_incarnations)
        erased = await fetch_one(
            conn,
            """SELECT 1 FROM memory.erasures
                WHERE namespace = %s
                  AND (conversation_id, incarnation) IN (
                      SELECT * FROM unnest(%s::uuid[], %s::bigint[]))""",
            (write.namespace, cids, [write.source_incarnations[c] for c in cids]),
        )
        if erased is not None:
            raise source_not_found()
    if write.request_id is None:
        return None
    claimed = await fetch_one(
        conn,
        """INSERT INTO memory.requests (namespace, request_id, payload_hash)
           VALUES (%s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1""",
        (write.namespace, write.request_id, write.payload_hash),
    )
    if claimed is not None:
        return None
    row = await fetch_one(
        conn,
        """SELECT payload_hash, memory_id, revision, created FROM memory.requests
            WHERE namespace = %s AND request_id = %s""",
        (write.namespace, write.request_id),
    )
    assert row is not None  # a recorded request is only removed by the retention sweep
    digest, memory_id, revision, created = row
    if bytes(digest) != write.payload_hash:
        raise request_id_reused()
    return await _replayed(conn, write.namespace, memory_id, revision), bool(created)


async def _recorded(
    conn: AsyncConn, write: MemoryWrite, memory: Memory, *, created: bool
) -> tuple[Memory, bool]:
    """Record the write's result under its request id (claimed by `_fence`)."""
    if write.request_id is not None:
        await conn.execute(
            """UPDATE memory.requests SET memory_id = %s, revision = %s, created = %s
                WHERE namespace = %s AND request_id = %s""",
            (memory.memory_id, memory.revision, created, write.namespace, write.request_id),
        )
    return memory, created


async def _replayed(conn: AsyncConn, namespace: str, memory_id: uuid.UUID, revision: int) -> Memory:
    """The memory as a recorded request wrote it: the live memory when it is still at that
    revision, else that revision from the history; MEMORY_NOT_FOUND once deleted (its
    history keeps no content)."""
    row = await fetch_one(
        conn,
        f"""SELECT {sql.COLUMNS} FROM memory.memories
             WHERE namespace = %s AND memory_id = %s AND revision = %s AND {sql.LIVE}""",
        (namespace, memory_id, revision),
    )
    if row is not None:
        return memory_from_row(row)
    old = await fetch_one(
        conn,
        """SELECT h.content, h.sources, h.metadata, h.expire_time, h.recorded_at,
                  m.embedding_model, m.embedding_dimension
             FROM memory.revisions AS h
             LEFT JOIN memory.memories AS m USING (namespace, memory_id)
            WHERE h.namespace = %s AND h.memory_id = %s AND h.revision = %s
              AND h.content IS NOT NULL""",
        (namespace, memory_id, revision),
    )
    if old is None:
        raise memory_not_found()
    content, sources, metadata, expire_time, recorded_at, model, dimension = old
    return memory_from_row(
        (
            namespace,
            memory_id,
            content,
            sources,
            metadata,
            revision,
            recorded_at,
            recorded_at,
            expire_time,
            model or "",
            dimension or 0,
        )
    )


def _write_params(write: MemoryWrite) -> dict[str, Any]:
    return {
        "namespace": write.namespace,
        "memory_id": write.memory_id,
        "content": write.content,
        "sources": Jsonb(sources_json(write.sources)),
        "metadata": Jsonb(dict(write.metadata)),
        "expected_revision": write.expected_revision,
        "expire_time": write.expire_time,
        "model": write.embedding_model,
        "dimension": write.embedding_dimension,
    }


class PostgresMemoryStore(PostgresOutbox):
    """MemoryStore on PostgreSQL (schema `memory`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(self, write: MemoryWrite) -> tuple[Memory, bool]:
        params = _write_params(write)
        async with self.db.connection() as conn, conn.transaction():
            replayed = await _fence(conn, write)
            if replayed is not None:
                return replayed
            for _ in range(2):
                row = await fetch_one(conn, sql.CREATE, params)
                if row is not None:
                    return await _recorded(conn, write, memory_from_row(row), created=True)
                # The id is taken. A lapsed memory the sweeper has not reached
                # yet is gone for every reader: erase it, then create again.
                erased = await fetch_one(
                    conn,
                    sql.ERASE.format(victims=sql.BY_ID, extra=f"AND NOT {sql.LIVE}"),
                    {**params, "reason": "expired"},
                )
                if erased is None:
                    break
        raise memory_exists()

    async def update(self, write: MemoryWrite) -> tuple[Memory, bool]:
        params = _write_params(write)
        async with self.db.connection() as conn, conn.transaction():
            replayed = await _fence(conn, write)
            if replayed is not None:
                return replayed
            row = await fetch_one(conn, sql.UPDATE, params)
            if row is not None:
                return await _recorded(conn, write, memory_from_row(row), created=False)
            current = await fetch_one(conn, sql.CURRENT_REVISION, params)
        if current is None:
            raise memory_not_found()
        assert write.expected_revision is not None
        raise revision_conflict(current[0], write.expected_revision)

    async def get(self, namespace: str, memory_id: uuid.UUID) -> Memory | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                f"""SELECT {sql.COLUMNS} FROM memory.memories
                     WHERE namespace = %s AND memory_id = %s AND {sql.LIVE}""",
                (namespace, memory_id),
            )
        return memory_from_row(row) if row else None

    async def get_many(
        self, namespace: str, memory_ids: Sequence[uuid.UUID], metadata: Mapping[str, str]
    ) -> list[Memory]:
        if not memory_ids:
            return []
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {sql.COLUMNS} FROM memory.memories
                     WHERE namespace = %s AND memory_id = ANY(%s) AND {sql.LIVE}
                       AND metadata @> %s""",
                (namespace, list(memory_ids), Jsonb(dict(metadata))),
            )
            return [memory_from_row(row) for row in await cursor.fetchall()]

    async def list_memories(
        self,
        namespace: str,
        conversation_id: uuid.UUID | None,
        after: uuid.UUID | None,
        limit: int,
    ) -> list[Memory]:
        containment = Jsonb([{"c": str(conversation_id)}]) if conversation_id else None
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {sql.COLUMNS} FROM memory.memories
                     WHERE namespace = %(namespace)s AND {sql.LIVE}
                       AND (%(after)s::uuid IS NULL OR memory_id > %(after)s::uuid)
                       AND (%(containment)s::jsonb IS NULL OR sources @> %(containment)s::jsonb)
                     ORDER BY memory_id
                     LIMIT %(limit)s""",
                {
                    "namespace": namespace,
                    "after": after,
                    "containment": containment,
                    "limit": limit,
                },
            )
            return [memory_from_row(row) for row in await cursor.fetchall()]

    async def delete(
        self, namespace: str, memory_id: uuid.UUID, expected_revision: int | None
    ) -> bool:
        params = {
            "namespace": namespace,
            "memory_id": memory_id,
            "expected": expected_revision,
            "reason": "delete",
        }
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                sql.ERASE.format(
                    victims=sql.BY_ID,
                    extra="AND (%(expected)s::bigint IS NULL OR m.revision = %(expected)s::bigint)"
                    f" AND ({sql.LIVE_M} OR %(expected)s::bigint IS NULL)",
                ),
                params,
            )
            if row is not None:
                return bool(row[0])
            if expected_revision is None:
                return False
            current = await fetch_one(conn, sql.CURRENT_REVISION, params)
        if current is None:
            return False
        raise revision_conflict(current[0], expected_revision)

    async def forget_source(
        self, namespace: str, conversation_id: uuid.UUID, low: int, high: int, incarnation: int = 0
    ) -> int:
        async with self.db.connection() as conn, conn.transaction():
            if incarnation:
                await conn.execute(sql.LOCK_CONVERSATION, (namespace, str(conversation_id)))
                await conn.execute(
                    """INSERT INTO memory.erasures (namespace, conversation_id, incarnation)
                       VALUES (%s, %s, %s) ON CONFLICT DO NOTHING""",
                    (namespace, conversation_id, incarnation),
                )
            cursor = await conn.execute(
                sql.ERASE.format(victims=sql.BY_SOURCE, extra=""),
                {
                    "namespace": namespace,
                    "containment": Jsonb([{"c": str(conversation_id)}]),
                    "conversation": str(conversation_id),
                    "low": low,
                    "high": high,
                    "reason": "forget_source",
                },
            )
            return len(await cursor.fetchall())

    async def sweep_requests(self, older_than_s: float) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                "DELETE FROM memory.requests WHERE recorded_at < now() - make_interval(secs => %s)",
                (older_than_s,),
            )
            await conn.execute(
                "DELETE FROM memory.erasures WHERE erase_time < now() - make_interval(secs => %s)",
                (ERASURE_RETENTION_S,),
            )
            return cursor.rowcount

    async def sweep_expired(self, limit: int) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.ERASE.format(victims=sql.EXPIRED, extra=""),
                {"limit": limit, "reason": "expired"},
            )
            return len(await cursor.fetchall())

    async def text_search(
        self, namespace: str, query: str, metadata: Mapping[str, str], limit: int
    ) -> list[ScoredMemory]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.TEXT_SEARCH,
                {
                    "namespace": namespace,
                    "query": query,
                    "metadata": Jsonb(dict(metadata)),
                    "limit": limit,
                },
            )
            return [
                ScoredMemory(memory_from_row(row), float(row[11]))
                for row in await cursor.fetchall()
            ]

    async def history(self, namespace: str, memory_id: uuid.UUID) -> list[RevisionRecord]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                """SELECT revision, kind, reason, recorded_at, content, metadata
                     FROM memory.revisions WHERE namespace = %s AND memory_id = %s
                    ORDER BY revision""",
                (namespace, memory_id),
            )
            return [
                RevisionRecord(row[0], row[1], row[2], row[3], row[4], row[5] or {})
                for row in await cursor.fetchall()
            ]

    async def memory_count(self) -> int:
        """Live memories (tests, reindex)."""
        async with self.db.connection() as conn:
            row = await fetch_one(conn, f"SELECT count(*) FROM memory.memories WHERE {sql.LIVE}")
        return int(row[0]) if row else 0
