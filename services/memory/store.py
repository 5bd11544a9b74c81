"""Memory persistence: the store protocol and its PostgreSQL adapter (schema `memory`).

The store is put together from its features' parts: the writes (writes/store.py),
the full-text search (search/store.py) and the outbox (outbox/store.py), each a
protocol and a mixin of PostgresMemoryStore; the reads by id, the listing and the
history are here.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

from psycopg.types.json import Jsonb

from services.common.postgres.pool import Database, fetch_one
from services.memory.model import Memory, RevisionRecord
from services.memory.outbox.store import OutboxStore, PostgresOutbox
from services.memory.rows import memory_from_row, sources_from_json
from services.memory.search.store import PostgresSearch, SearchStore
from services.memory.statements import COLUMNS, LIVE, VALID_AT
from services.memory.writes.store import PostgresWrites, WriteStore


class MemoryStore(WriteStore, SearchStore, OutboxStore, Protocol):
    """What the memory service needs from a store. Every method is atomic."""

    async def get(self, namespace: str, memory_id: uuid.UUID) -> Memory | None:
        """The live memory, or None (also when expired or in another namespace)."""

    async def get_many(
        self,
        namespace: str,
        memory_ids: Sequence[uuid.UUID],
        metadata: Mapping[str, str],
        valid_at: datetime | None = None,
    ) -> list[Memory]:
        """The live memories among `memory_ids` whose metadata holds every pair given
        (and, with `valid_at`, valid at that time)."""

    async def list_memories(
        self,
        namespace: str,
        conversation_id: uuid.UUID | None,
        after: uuid.UUID | None,
        limit: int,
        valid_at: datetime | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> list[Memory]:
        """Live memories in id order after a cursor, optionally with a source in a conversation,
        valid at `valid_at` (None: whatever their validity) and with metadata holding every
        pair of `metadata`."""

    async def history(
        self,
        namespace: str,
        memory_id: uuid.UUID,
        after_revision: int = 0,
        limit: int | None = None,
    ) -> list[RevisionRecord]:
        """The revisions of a memory id in the namespace after `after_revision`, oldest
        first, at most `limit` of them (None: all)."""


# --- PostgreSQL -------------------------------------------------------------


class PostgresMemoryStore(PostgresWrites, PostgresSearch, PostgresOutbox):
    """MemoryStore on PostgreSQL (schema `memory`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, namespace: str, memory_id: uuid.UUID) -> Memory | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                f"""SELECT {COLUMNS} FROM memory.memories
                     WHERE namespace = %s AND memory_id = %s AND {LIVE}""",
                (namespace, memory_id),
            )
        return memory_from_row(row) if row else None

    async def get_many(
        self,
        namespace: str,
        memory_ids: Sequence[uuid.UUID],
        metadata: Mapping[str, str],
        valid_at: datetime | None = None,
    ) -> list[Memory]:
        if not memory_ids:
            return []
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {COLUMNS} FROM memory.memories
                     WHERE namespace = %(namespace)s AND memory_id = ANY(%(ids)s) AND {LIVE}
                       AND metadata @> %(metadata)s AND {VALID_AT}""",
                {
                    "namespace": namespace,
                    "ids": list(memory_ids),
                    "metadata": Jsonb(dict(metadata)),
                    "valid_at": valid_at,
                },
            )
            return [memory_from_row(row) for row in await cursor.fetchall()]

    async def list_memories(
        self,
        namespace: str,
        conversation_id: uuid.UUID | None,
        after: uuid.UUID | None,
        limit: int,
        valid_at: datetime | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> list[Memory]:
        containment = Jsonb([{"c": str(conversation_id)}]) if conversation_id else None
        # Served by the GIN index memories_metadata (migration 0009).
        pairs = Jsonb(dict(metadata)) if metadata else None
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {COLUMNS} FROM memory.memories
                     WHERE namespace = %(namespace)s AND {LIVE} AND {VALID_AT}
                       AND (%(after)s::uuid IS NULL OR memory_id > %(after)s::uuid)
                       AND (%(containment)s::jsonb IS NULL OR sources @> %(containment)s::jsonb)
                       AND (%(pairs)s::jsonb IS NULL OR metadata @> %(pairs)s::jsonb)
                     ORDER BY memory_id
                     LIMIT %(limit)s""",
                {
                    "namespace": namespace,
                    "after": after,
                    "containment": containment,
                    "pairs": pairs,
                    "limit": limit,
                    "valid_at": valid_at,
                },
            )
            return [memory_from_row(row) for row in await cursor.fetchall()]

    async def history(
        self,
        namespace: str,
        memory_id: uuid.UUID,
        after_revision: int = 0,
        limit: int | None = None,
    ) -> list[RevisionRecord]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                """SELECT revision, kind, reason, recorded_at, content, metadata, sources,
                          expire_time, valid_from_time, valid_until_time, superseded_by
                     FROM memory.revisions
                    WHERE namespace = %s AND memory_id = %s AND revision > %s
                    ORDER BY revision
                    LIMIT %s""",
                (namespace, memory_id, after_revision, limit),
            )
            return [
                RevisionRecord(
                    revision=row[0],
                    kind=row[1],
                    reason=row[2],
                    recorded_at=row[3],
                    content=row[4],
                    metadata=row[5] or {},
                    sources=sources_from_json(row[6]),
                    expire_time=row[7],
                    valid_from_time=row[8],
                    valid_until_time=row[9],
                    superseded_by=row[10],
                )
                for row in await cursor.fetchall()
            ]

    async def memory_count(self) -> int:
        """Live memories (tests, reindex)."""
        async with self.db.connection() as conn:
            row = await fetch_one(conn, f"SELECT count(*) FROM memory.memories WHERE {LIVE}")
        return int(row[0]) if row else 0
