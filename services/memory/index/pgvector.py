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

Lexical (issue 21): `lexical` is a `tsvector` of the memory's term ids
(services/memory/lexical.py tokenises for every back-end; the lexemes are the
ids as text, so PostgreSQL's parser and dictionaries play no part) with a GIN
index, and `lexical_weights` the BM25 document weights by term (jsonb). NULL
on a row indexed before them: a write at the same revision that brings them
replaces it (`OR t.revision = excluded.revision AND t.lexical IS NULL`). A
search computes BM25 in the statement: the IDF of each query term from N and df
counted over the namespace's rows (through the namespace b-tree and the GIN
index), the score of a row from its weights. A hybrid search is one statement:
the dense top N (HNSW or exact, as a dense search) and the lexical top N
(GIN), rescored by both, fused (the same fusion as the other back-ends,
services/memory/lexical.py), best first.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector_async
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from services.memory.index import (
    MEMORY_ID_FIELD,
    NAMESPACE_FIELD,
    OPEN_END,
    REVISION_FIELD,
    TAGS_FIELD,
    IndexHit,
    IndexMismatch,
    IndexPoint,
    IndexUnavailable,
    Key,
    NamespacedQuery,
    Term,
    Tombstone,
    ValidAt,
    check_vector,
    checked_points,
    collection_name,
    fused_hits,
    point_ids,
    tombstone_points,
)
from services.memory.lexical import FusionMethod, SearchMode

log = logging.getLogger(__name__)

# Each query term becomes one of these conditions (a field the index knows),
# its value bound as a parameter.
_TERM_SQL = {
    NAMESPACE_FIELD: sql.SQL("namespace = {}"),
    TAGS_FIELD: sql.SQL("tags @> ARRAY[{}]::text[]"),
}
_VALID_AT_SQL = sql.SQL("valid_from <= {0} AND valid_until > {0}")


def _condition(term: Term | ValidAt, placeholder: sql.Placeholder) -> sql.Composed:
    """The SQL condition of one query term, its value bound to `placeholder`."""
    if isinstance(term, ValidAt):
        return _VALID_AT_SQL.format(placeholder)
    return _TERM_SQL[term.field].format(placeholder)


def _value(term: Term | ValidAt) -> object:
    return term.at if isinstance(term, ValidAt) else term.value


# The HNSW index orders the scan; the filter applies to what it yields.
_HNSW = sql.SQL(
    """SELECT memory_id, revision, 1 - (embedding <=> %(vector)s) AS score
         FROM {}
        WHERE {}
        ORDER BY embedding <=> %(vector)s
        LIMIT %(limit)s"""
)
# Exact: OFFSET 0 keeps the planner from ordering by the HNSW index, so the
# namespace's rows come from the b-tree and are all compared.
_EXACT = sql.SQL(
    """SELECT memory_id, revision, 1 - (embedding <=> %(vector)s) AS score
         FROM (SELECT memory_id, revision, embedding FROM {} WHERE {} OFFSET 0) AS rows
        ORDER BY embedding <=> %(vector)s
        LIMIT %(limit)s"""
)
# Lexical scoring. `idf`: each query term's IDF over the namespace's rows (tombstones
# have namespace ''; N counts the rows not yet given a lexical vector too, which Qdrant
# does not: the b-tree alone answers, without reading the rows); a row's BM25 is the
# sum of idf x weight over the terms it shares with the query. MATERIALIZED: computed
# once per statement (inlined, the planner recounted it for every row scored: 1.1 s at
# 100,000 rows).
_IDF = sql.SQL(
    """idf AS MATERIALIZED (
         SELECT q.term, ln(1 + (n.n - d.df + 0.5) / (d.df + 0.5)) AS idf
           FROM unnest(%(terms)s::text[]) AS q(term)
          CROSS JOIN (SELECT count(*)::float8 AS n FROM {table}
                       WHERE namespace = %(namespace)s) AS n
          CROSS JOIN LATERAL (SELECT count(*)::float8 AS df FROM {table}
                               WHERE namespace = %(namespace)s
                                 AND lexical @@ q.term::tsquery) AS d)"""
)
_BM25 = sql.SQL(
    "(SELECT coalesce(sum(i.idf * (r.lexical_weights ->> i.term)::float8), 0)"
    " FROM idf AS i WHERE r.lexical_weights ? i.term)"
)
_LEXICAL = sql.SQL(
    """WITH {idf}
       SELECT memory_id, revision, NULL::float8 AS dense, lexical, lexical AS score
         FROM (SELECT r.memory_id, r.revision, {bm25} AS lexical
                 FROM {table} AS r
                WHERE {where} AND r.lexical @@ %(tsquery)s::tsquery) AS s
        ORDER BY score DESC, memory_id
        LIMIT %(limit)s"""
)
# Hybrid: {dense} is the dense search's statement (HNSW or exact) for point ids.
_HYBRID = sql.SQL(
    """WITH {idf},
       dense AS ({dense}),
       lex AS (SELECT r.point_id FROM {table} AS r
                WHERE {where} AND r.lexical @@ %(tsquery)s::tsquery
                ORDER BY {bm25} DESC LIMIT %(limit)s),
       scored AS (SELECT r.memory_id, r.revision, 1 - (r.embedding <=> %(vector)s) AS dense,
                         {bm25} AS lexical
                    FROM {table} AS r
                   WHERE r.point_id IN (SELECT point_id FROM dense
                                        UNION SELECT point_id FROM lex)),
       fused AS (SELECT memory_id, revision, dense, lexical, {fusion} AS score FROM scored)
       SELECT memory_id, revision, dense, lexical, score FROM fused
        ORDER BY score DESC, memory_id
        LIMIT %(limit)s"""
)
_SCORE_FUSION = sql.SQL(
    "(1 - %(weight)s) * dense + coalesce(%(weight)s * lexical / nullif(max(lexical) OVER (), 0), 0)"
)
_RRF_FUSION = sql.SQL(
    "2 * (1 - %(weight)s) / (%(rrf_k)s + row_number() OVER (ORDER BY dense DESC, memory_id))"
    " + CASE WHEN lexical > 0 THEN 2 * %(weight)s"
    " / (%(rrf_k)s + row_number() OVER (ORDER BY lexical DESC)) ELSE 0 END"
)
_DENSE_IDS_HNSW = sql.SQL(
    "SELECT point_id FROM {} WHERE {} ORDER BY embedding <=> %(vector)s LIMIT %(limit)s"
)
_DENSE_IDS_EXACT = sql.SQL(
    """SELECT point_id FROM (SELECT point_id, embedding FROM {} WHERE {} OFFSET 0) AS rows
        ORDER BY embedding <=> %(vector)s LIMIT %(limit)s"""
)
# How many rows the namespace holds, counted no further than the exact-search bound.
_COUNT = sql.SQL(
    "SELECT count(*) FROM (SELECT 1 FROM {} WHERE namespace = %(namespace)s LIMIT %(bound)s) AS n"
)
# A point replaces only an older revision of its memory (point or tombstone).
_UPSERT = sql.SQL(
    """INSERT INTO {} AS t
              (point_id, namespace, memory_id, revision, tags, embedding, valid_from, valid_until,
               lexical, lexical_weights)
       VALUES (%s, %s, %s, %s, %s, %s, %s, %s, array_to_tsvector(%s::text[]), %s)
       ON CONFLICT (point_id) DO UPDATE
          SET namespace = excluded.namespace, revision = excluded.revision,
              tags = excluded.tags, embedding = excluded.embedding, deleted_at = NULL,
              valid_from = excluded.valid_from, valid_until = excluded.valid_until,
              lexical = excluded.lexical, lexical_weights = excluded.lexical_weights
        WHERE t.revision < excluded.revision
           OR (t.revision = excluded.revision AND t.lexical IS NULL AND t.deleted_at IS NULL
               AND excluded.lexical IS NOT NULL)"""
)
# A tombstone replaces the same or an older revision (an expired memory is
# deleted at the revision its point holds).
_TOMBSTONE = sql.SQL(
    """INSERT INTO {} AS t (point_id, namespace, memory_id, revision, tags, embedding, deleted_at)
       VALUES (%s, '', %s, %s, '{{}}', NULL, now())
       ON CONFLICT (point_id) DO UPDATE
          SET namespace = '', revision = excluded.revision, tags = '{{}}', embedding = NULL,
              deleted_at = excluded.deleted_at, lexical = NULL, lexical_weights = NULL
        WHERE t.revision <= excluded.revision"""
)
_PURGE = sql.SQL("DELETE FROM {} WHERE point_id = ANY(%s)")
_PRUNE = sql.SQL("DELETE FROM {} WHERE deleted_at <= now() - make_interval(secs => %s)")
_KEYS = sql.SQL("SELECT namespace, memory_id FROM {} WHERE deleted_at IS NULL")
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
        self._count = _COUNT.format(self._qualified)
        self._upsert = _UPSERT.format(self._qualified)
        self._tombstone = _TOMBSTONE.format(self._qualified)
        self._purge = _PURGE.format(self._qualified)
        self._prune = _PRUNE.format(self._qualified)
        self._keys = _KEYS.format(self._qualified)
        self._timeout = timeout_s
        self._pool: AsyncConnectionPool[Any] | None = None

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await register_vector_async(conn)
        await conn.execute("SELECT set_config('hnsw.ef_search', %s, false)", (str(self.ef_search),))
        if self.iterative_scan:
            await conn.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', false)")

    async def _prepare(self) -> None:
        """Create the extension and the table, or check that the table fits."""
        async with await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, connect_timeout=max(1, int(self._timeout))
        ) as conn:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            await conn.execute("CREATE SCHEMA IF NOT EXISTS memory")
            cursor = await conn.execute(
                "SELECT string_to_array(extversion, '.')::int[] >= '{0,8,0}'"
                " FROM pg_extension WHERE extname = 'vector'"
            )
            version_row = await cursor.fetchone()
            self.iterative_scan = bool(version_row and version_row[0])
            cursor = await conn.execute(
                """SELECT format_type(a.atttypid, a.atttypmod)
                     FROM pg_attribute AS a
                    WHERE a.attrelid = to_regclass(%s) AND a.attname = 'embedding'""",
                (f"memory.{self.table}",),
            )
            row = await cursor.fetchone()
            if row is not None:
                cursor = await conn.execute(
                    "SELECT indexdef FROM pg_indexes"
                    " WHERE schemaname = 'memory' AND tablename = %s",
                    (self.table,),
                )
                definitions = " ".join(r[0] for r in await cursor.fetchall())
                if row[0] != f"vector({self.dimension})" or "vector_cosine_ops" not in definitions:
                    raise IndexMismatch(
                        f"pgvector table memory.{self.table} was made for another vector size "
                        f"or distance (want vector({self.dimension}), cosine)"
                    )
                await self._add_tombstones(conn)
                await self._add_validity(conn)
                await self._add_lexical(conn)
                return
            async with conn.transaction():
                await conn.execute(
                    sql.SQL(
                        """CREATE TABLE IF NOT EXISTS {table} (
                               point_id   uuid PRIMARY KEY,
                               namespace  text NOT NULL,
                               memory_id  uuid NOT NULL,
                               revision   bigint NOT NULL,
                               tags       text[] NOT NULL DEFAULT '{{}}',
                               -- NULL on a tombstone, which also has namespace ''.
                               embedding  vector({dimension}),
                               deleted_at timestamptz,
                               valid_from double precision NOT NULL DEFAULT 0,
                               valid_until double precision NOT NULL DEFAULT {open_end},
                               -- NULL on a row indexed before lexical vectors, and on
                               -- a tombstone.
                               lexical    tsvector,
                               lexical_weights jsonb)"""
                    ).format(
                        table=self._qualified,
                        dimension=sql.Literal(self.dimension),
                        open_end=sql.Literal(OPEN_END),
                    )
                )
                await conn.execute(
                    sql.SQL(
                        "CREATE INDEX IF NOT EXISTS {name} ON {table} "
                        "USING hnsw (embedding vector_cosine_ops)"
                    ).format(name=sql.Identifier(f"{self.table}_hnsw"), table=self._qualified)
                )
                await conn.execute(
                    sql.SQL("CREATE INDEX IF NOT EXISTS {name} ON {table} (namespace)").format(
                        name=sql.Identifier(f"{self.table}_ns"), table=self._qualified
                    )
                )
                await self._tombstone_index(conn)
                await conn.execute(self._lexical_index(concurrently=False))

    def _lexical_index(self, *, concurrently: bool) -> sql.Composed:
        return sql.SQL("CREATE INDEX {} IF NOT EXISTS {} ON {} USING gin (lexical)").format(
            sql.SQL("CONCURRENTLY") if concurrently else sql.SQL(""),
            sql.Identifier(f"{self.table}_lexical"),
            self._qualified,
        )

    async def _add_lexical(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """A table made before lexical vectors: add the columns (NULL, metadata-only) and
        build their GIN index without blocking writes (CONCURRENTLY)."""
        cursor = await conn.execute(
            """SELECT i.indisvalid FROM pg_index AS i
                 JOIN pg_class AS c ON c.oid = i.indexrelid
                 JOIN pg_namespace AS n ON n.oid = c.relnamespace
                WHERE n.nspname = 'memory' AND c.relname = %s""",
            (f"{self.table}_lexical",),
        )
        row = await cursor.fetchone()
        if row is not None and row[0]:
            return  # no ALTER (its lock) at every start
        if row is not None:  # a concurrent build that did not finish: build it again
            await conn.execute(
                sql.SQL("DROP INDEX CONCURRENTLY {}").format(
                    sql.Identifier("memory", f"{self.table}_lexical")
                )
            )
        await conn.execute(
            sql.SQL(
                "ALTER TABLE {} ADD COLUMN IF NOT EXISTS lexical tsvector,"
                " ADD COLUMN IF NOT EXISTS lexical_weights jsonb"
            ).format(self._qualified)
        )
        await conn.execute(self._lexical_index(concurrently=True))

    async def _tombstone_index(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """What the pruning of tombstones reads."""
        await conn.execute(
            sql.SQL(
                "CREATE INDEX IF NOT EXISTS {name} ON {table} (deleted_at)"
                " WHERE deleted_at IS NOT NULL"
            ).format(name=sql.Identifier(f"{self.table}_tombstones"), table=self._qualified)
        )

    async def _add_tombstones(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """A table made before tombstones: let it hold them (metadata-only changes)."""
        cursor = await conn.execute(
            """SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%s) AND attname = 'deleted_at' AND NOT attisdropped""",
            (f"memory.{self.table}",),
        )
        if await cursor.fetchone() is not None:
            return
        async with conn.transaction():
            await conn.execute(
                sql.SQL(
                    "ALTER TABLE {} ALTER COLUMN embedding DROP NOT NULL,"
                    " ADD COLUMN IF NOT EXISTS deleted_at timestamptz"
                ).format(self._qualified)
            )
            await self._tombstone_index(conn)

    async def _add_validity(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """A table made before valid time: its rows become valid always, as far as the index
        knows (constant defaults: metadata-only changes; the store's re-read decides)."""
        cursor = await conn.execute(
            """SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass(%s) AND attname = 'valid_until'
                  AND NOT attisdropped""",
            (f"memory.{self.table}",),
        )
        if await cursor.fetchone() is not None:
            return  # no ALTER (its lock) at every start
        await conn.execute(
            sql.SQL(
                "ALTER TABLE {} ADD COLUMN IF NOT EXISTS valid_from double precision"
                " NOT NULL DEFAULT 0, ADD COLUMN IF NOT EXISTS valid_until double precision"
                " NOT NULL DEFAULT {}"
            ).format(self._qualified, sql.Literal(OPEN_END))
        )

    async def start(self) -> None:
        if self._pool is not None:
            return
        try:
            await self._prepare()
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
            raise IndexUnavailable(f"pgvector upsert failed: {exc}") from exc

    async def delete(self, tombstones: Sequence[Tombstone]) -> None:
        if not tombstones:
            return
        rows = [(pid, t.memory_id, t.revision) for pid, t in tombstone_points(tombstones)]
        try:
            async with self._require().connection() as conn, conn.cursor() as cursor:
                await cursor.executemany(self._tombstone, rows)
        except (psycopg.Error, PoolTimeout) as exc:
            raise IndexUnavailable(f"pgvector delete failed: {exc}") from exc

    async def purge(self, keys: Sequence[Key]) -> None:
        if not keys:
            return
        try:
            async with self._require().connection() as conn:
                await conn.execute(self._purge, (point_ids(keys),))
        except (psycopg.Error, PoolTimeout) as exc:
            raise IndexUnavailable(f"pgvector delete failed: {exc}") from exc

    async def prune_tombstones(self, older_than_s: float) -> None:
        try:
            async with self._require().connection() as conn:
                await conn.execute(self._prune, (older_than_s,))
        except (psycopg.Error, PoolTimeout) as exc:
            raise IndexUnavailable(f"pgvector tombstone pruning failed: {exc}") from exc

    async def search(self, query: NamespacedQuery) -> list[IndexHit]:
        check_vector(query.vector, self.dimension)
        conditions = sql.SQL(" AND ").join(
            _condition(t, sql.Placeholder(f"term{i}")) for i, t in enumerate(query.terms)
        )
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
            **{f"term{i}": _value(t) for i, t in enumerate(query.terms)},
        }
        mode = query.mode
        if mode is not SearchMode.DENSE and not terms:
            if mode is SearchMode.LEXICAL:
                return []
            mode = SearchMode.DENSE  # no term to match: the cosine alone, fused below
        try:
            async with self._require().connection() as conn:
                if mode is SearchMode.LEXICAL:
                    statement = _LEXICAL.format(
                        idf=_IDF.format(table=self._qualified),
                        bm25=_BM25,
                        table=self._qualified,
                        where=conditions,
                    )
                    cursor = await conn.execute(statement, params)
                    return [
                        IndexHit(row[0], int(row[1]), float(row[4]), lexical=float(row[3]))
                        for row in await cursor.fetchall()
                    ]
                cursor = await conn.execute(self._count, params)
                size_row = await cursor.fetchone()
                small = size_row is not None and size_row[0] <= self.exact_below
                rows: list[Any] = []
                if not small:
                    cursor = await conn.execute(
                        self._statement(query, mode, conditions, False), params
                    )
                    rows = await cursor.fetchall()
                if small or len(rows) < query.limit:
                    cursor = await conn.execute(
                        self._statement(query, mode, conditions, True), params
                    )
                    rows = await cursor.fetchall()
        except (psycopg.Error, PoolTimeout) as exc:
            raise IndexUnavailable(f"pgvector search failed: {exc}") from exc
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

    def _statement(
        self, query: NamespacedQuery, mode: SearchMode, conditions: sql.Composable, exact: bool
    ) -> sql.Composed:
        """The dense or hybrid statement, its dense part exact or through HNSW."""
        if mode is SearchMode.DENSE:
            return (_EXACT if exact else _HNSW).format(self._qualified, conditions)
        dense = (_DENSE_IDS_EXACT if exact else _DENSE_IDS_HNSW).format(self._qualified, conditions)
        return _HYBRID.format(
            idf=_IDF.format(table=self._qualified),
            dense=dense,
            table=self._qualified,
            where=conditions,
            bm25=_BM25,
            fusion=_SCORE_FUSION if query.fusion.method is FusionMethod.SCORE else _RRF_FUSION,
        )

    async def keys(self) -> set[Key]:
        try:
            async with self._require().connection() as conn:
                cursor = await conn.execute(self._keys)
                return {(row[0], uuid.UUID(str(row[1]))) for row in await cursor.fetchall()}
        except (psycopg.Error, PoolTimeout) as exc:
            raise IndexUnavailable(f"pgvector scan failed: {exc}") from exc

    async def optimize(self) -> None:
        """HNSW is maintained on every insert."""

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
