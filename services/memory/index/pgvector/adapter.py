"""pgvector adapter: the searchable copy in a PostgreSQL table with an HNSW index.

One table per embedding model and dimension (`memory.<collection>`), all
namespaces in it. An HNSW scan applies the namespace filter after the graph
walk: a namespace holding 1% of the rows gets about 1% of the `ef_search`
candidates, so plain filtered HNSW misses most of its true neighbours
(recall@10 measured 0.30 at 100,000 rows over 100 namespaces). Two remedies:

- pgvector >= 0.8 has `hnsw.iterative_scan = relaxed_order`, which keeps
  walking until enough rows pass the filter; it is turned on when the
  installed extension has it. (pgserver's PostgreSQL ships pgvector 0.6.2,
  which does not.)
- Whatever the version: a namespace of at most `exact_below` rows is searched
  exactly (its rows through the namespace b-tree, then sorted by distance),
  and an HNSW answer with fewer rows than asked is redone exactly. Exact
  search costs what the namespace holds, a few milliseconds per 10,000 rows.

Results of a relaxed scan may be slightly out of order; they are re-sorted.

Valid time: `valid_from` and `valid_until` columns (Unix seconds; OPEN_END
while a fact holds), filtered with the other conditions of the query.

Revision guard: an upsert is `INSERT ... ON CONFLICT (point_id) DO UPDATE ...
WHERE t.revision < excluded.revision`, so the row lock of the conflict
serializes racing writers and an older write changes nothing. A tombstone is
the same row with no embedding (not in the HNSW graph), an empty namespace
(no query matches it) and `deleted_at`, written with `WHERE t.revision <=
excluded.revision`. Each row is its own autocommit statement: no writer holds
one row while waiting for another.

Lexical (issue 21): BM25 computed in the statement over the namespace's rows (a
`tsvector` of term ids with a GIN index, and the BM25 weights); a hybrid search
is one statement that fuses the dense and the lexical top N (statements.py).

The statements are in statements.py, the table and its upgrades in
schema.py; this module runs them (pool, revision-guarded writes, search).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector_async
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from services.common.logs import describe
from services.memory.index.model import (
    MEMORY_ID_FIELD,
    REVISION_FIELD,
    IndexHit,
    IndexPoint,
    NamespacedQuery,
    Tombstone,
    check_vector,
    checked_points,
    collection_name,
    fused_hits,
    point_ids,
    tombstone_points,
)
from services.memory.index.pgvector import schema
from services.memory.index.pgvector import statements as pg
from services.memory.index.protocol import IndexMismatch, IndexUnavailable
from services.memory.model import Key
from services.memory.search.lexical import SearchMode

log = logging.getLogger(__name__)

_POOL_MAX = 8


class PgvectorIndex:
    """VectorIndex on pgvector."""

    name = "pgvector"

    def __init__(
        self,
        url: str,
        model: str,
        dimension: int,
        *,
        ef_search: int = 200,
        exact_below: int = 10_000,
        timeout_s: float = 5.0,
    ) -> None:
        self.url = url
        self.dimension = dimension
        self.ef_search = ef_search
        self.exact_below = exact_below
        self.iterative_scan = False
        self.table = collection_name(model, dimension)
        self._qualified = sql.Identifier("memory", self.table)
        # The statements that name only the table, composed once.
        self._count = pg.COUNT.format(self._qualified)
        self._upsert = pg.UPSERT.format(self._qualified)
        self._tombstone = pg.TOMBSTONE.format(self._qualified)
        self._purge = pg.PURGE.format(self._qualified)
        self._prune = pg.PRUNE.format(self._qualified)
        self._keys = pg.KEYS.format(self._qualified)
        self._timeout = timeout_s
        self._pool: AsyncConnectionPool[Any] | None = None

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await register_vector_async(conn)
        await conn.execute("SELECT set_config('hnsw.ef_search', %s, false)", (str(self.ef_search),))
        if self.iterative_scan:
            await conn.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', false)")

    async def start(self) -> None:
        if self._pool is not None:
            return
        try:
            self.iterative_scan = await schema.prepare(
                self.url, self.table, self.dimension, self._timeout
            )
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                self.url,
                min_size=1,
                max_size=_POOL_MAX,
                open=False,
                kwargs={"autocommit": True},
                configure=self._configure,
                timeout=self._timeout,
                name="memory_index",
            )
            await pool.open(wait=True, timeout=max(self._timeout, 10.0))
        except IndexMismatch:
            raise
        except (psycopg.Error, PoolTimeout, OSError) as exc:
            # Opening runs DDL only: the error's text holds no data and says what to fix.
            raise IndexUnavailable(f"cannot open the pgvector table: {exc}") from exc
        self._pool = pool
        log.info("memory index opened", extra={"index": "pgvector", "table": self.table})

    def _require(self) -> AsyncConnectionPool[Any]:
        if self._pool is None:
            raise IndexUnavailable("the pgvector pool is closed")
        return self._pool

    async def upsert(self, points: Sequence[IndexPoint]) -> None:
        if not points:
            return
        rows = [
            (
                pid,
                p.namespace,
                p.memory_id,
                p.revision,
                p.tags(),
                np.asarray(p.vector, dtype=np.float32),
                p.valid_from,
                p.valid_end,
                None if p.lexical is None else list(p.lexical.weights()),
                None if p.lexical is None else Jsonb(p.lexical.weights()),
            )
            for pid, p in checked_points(points, self.dimension)
        ]
        try:
            async with self._require().connection() as conn, conn.cursor() as cursor:
                await cursor.executemany(self._upsert, rows)
        except (psycopg.Error, PoolTimeout) as exc:
            raise IndexUnavailable(f"pgvector upsert failed: {describe(exc)}") from exc

    async def delete(self, tombstones: Sequence[Tombstone]) -> None:
        if not tombstones:
            return
        rows = [(pid, t.memory_id, t.revision) for pid, t in tombstone_points(tombstones)]
        try:
            async with self._require().connection() as conn, conn.cursor() as cursor:
                await cursor.executemany(self._tombstone, rows)
        except (psycopg.Error, PoolTimeout) as exc:
            raise IndexUnavailable(f"pgvector delete failed: {describe(exc)}") from exc

    async def purge(self, keys: Sequence[Key]) -> None:
        if not keys:
            return
        try:
            async with self._require().connection() as conn:
                await conn.execute(self._purge, (point_ids(keys),))
        except (psycopg.Error, PoolTimeout) as exc:
            raise IndexUnavailable(f"pgvector delete failed: {describe(exc)}") from exc

    async def prune_tombstones(self, older_than_s: float) -> None:
        try:
            async with self._require().connection() as conn:
                await conn.execute(self._prune, (older_than_s,))
        except (psycopg.Error, PoolTimeout) as exc:
            raise IndexUnavailable(f"pgvector tombstone pruning failed: {describe(exc)}") from exc

    async def search(self, query: NamespacedQuery) -> list[IndexHit]:
        check_vector(query.vector, self.dimension)
        conditions = pg.where(query.terms)
        terms = [str(t) for t in query.lexical]
        params = {
            "vector": np.asarray(query.vector, dtype=np.float32),
            "limit": query.limit,
            "namespace": query.namespace,
            "bound": self.exact_below + 1,
            "terms": terms,
            # Term ids are digits: each one a quoted lexeme, any of them matches.
            "tsquery": " | ".join(f"'{t}'" for t in terms),
            "weight": query.fusion.weight,
            "rrf_k": query.fusion.rrf_k,
            **pg.term_values(query.terms),
        }
        mode = query.mode
        if mode is not SearchMode.DENSE and not terms:
            if mode is SearchMode.LEXICAL:
                return []
            mode = SearchMode.DENSE  # no term to match: the cosine alone, fused below
        try:
            async with self._require().connection() as conn:
                if mode is SearchMode.LEXICAL:
                    statement = pg.lexical_statement(self._qualified, conditions)
                    cursor = await conn.execute(statement, params)
                    return [
                        IndexHit(row[0], int(row[1]), float(row[4]), lexical=float(row[3]))
                        for row in await cursor.fetchall()
                    ]
                cursor = await conn.execute(self._count, params)
                size_row = await cursor.fetchone()
                small = size_row is not None and size_row[0] <= self.exact_below
                rows: list[Any] = []
                ranked = partial(
                    pg.ranked_statement, self._qualified, mode, query.fusion.method, conditions
                )
                if not small:
                    cursor = await conn.execute(ranked(exact=False), params)
                    rows = await cursor.fetchall()
                if small or len(rows) < query.limit:
                    cursor = await conn.execute(ranked(exact=True), params)
                    rows = await cursor.fetchall()
        except (psycopg.Error, PoolTimeout) as exc:
            raise IndexUnavailable(f"pgvector search failed: {describe(exc)}") from exc
        if mode is SearchMode.HYBRID:
            return [
                IndexHit(
                    row[0], int(row[1]), float(row[4]), dense=float(row[2]), lexical=float(row[3])
                )
                for row in rows
            ]
        hits = [IndexHit(row[0], int(row[1]), float(row[2]), dense=float(row[2])) for row in rows]
        if self.iterative_scan:
            hits.sort(key=lambda h: h.score, reverse=True)  # relaxed_order: nearly sorted
        if query.mode is SearchMode.HYBRID:  # no term to match: the cosine alone
            return fused_hits(
                [
                    ({MEMORY_ID_FIELD: str(h.memory_id), REVISION_FIELD: h.revision}, h.score)
                    for h in hits
                ],
                [],
                query,
            )
        return hits

    async def keys(self) -> set[Key]:
        try:
            async with self._require().connection() as conn:
                cursor = await conn.execute(self._keys)
                return {(row[0], uuid.UUID(str(row[1]))) for row in await cursor.fetchall()}
        except (psycopg.Error, PoolTimeout) as exc:
            raise IndexUnavailable(f"pgvector scan failed: {describe(exc)}") from exc

    async def optimize(self) -> None:
        """HNSW is maintained on every insert."""

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
