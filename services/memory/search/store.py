"""The degraded search on PostgreSQL: full-text over the live memories (the protocol and
its adapter, mixed into PostgresMemoryStore, store.py)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Protocol

from psycopg.types.json import Jsonb

from services.common.postgres.pool import Database
from services.memory.rows import COLUMN_COUNT, memory_from_row
from services.memory.search import statements as sql
from services.memory.search.model import ScoredMemory


class SearchStore(Protocol):
    """The full-text search of MemoryStore."""

    async def text_search(
        self,
        namespace: str,
        query: str,
        metadata: Mapping[str, str],
        limit: int,
        valid_at: datetime | None = None,
    ) -> list[ScoredMemory]:
        """Full-text search over live memories valid at `valid_at` (the degraded mode);
        rank as score."""


class PostgresSearch:
    """The full-text search of PostgresMemoryStore."""

    db: Database

    async def text_search(
        self,
        namespace: str,
        query: str,
        metadata: Mapping[str, str],
        limit: int,
        valid_at: datetime | None = None,
    ) -> list[ScoredMemory]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.TEXT_SEARCH,
                {
                    "namespace": namespace,
                    "query": query,
                    "metadata": Jsonb(dict(metadata)),
                    "limit": limit,
                    "valid_at": valid_at,
                },
            )
            return [
                ScoredMemory(memory_from_row(row), float(row[COLUMN_COUNT]))
                for row in await cursor.fetchall()
            ]
