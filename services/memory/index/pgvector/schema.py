"""The pgvector adapter's table (adapter.py): made at the first start, checked and
brought up to date at every other.

`memory.<collection>` holds every namespace: one row per memory (or tombstone),
an HNSW index on the embedding (cosine), a b-tree on the namespace, a partial
index on the tombstones' `deleted_at`, a GIN index on the lexical vector. A
table made by an older version gains what it lacks (tombstones, valid time,
lexical vectors) with metadata-only changes; the GIN index of the lexical
vectors is built CONCURRENTLY, without blocking writes.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from services.memory.index.model import OPEN_END
from services.memory.index.protocol import IndexMismatch

_CREATE_TABLE = sql.SQL(
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
)


async def prepare(url: str, table: str, dimension: int, timeout_s: float) -> bool:
    """Create the extension and the table, or check that the table fits (IndexMismatch
    otherwise) and bring it up to date. Returns whether the installed pgvector has
    `hnsw.iterative_scan` (0.8 and newer)."""
    qualified = sql.Identifier("memory", table)
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=max(1, int(timeout_s))
    ) as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        await conn.execute("CREATE SCHEMA IF NOT EXISTS memory")
        cursor = await conn.execute(
            "SELECT string_to_array(extversion, '.')::int[] >= '{0,8,0}'"
            " FROM pg_extension WHERE extname = 'vector'"
        )
        version_row = await cursor.fetchone()
        iterative_scan = bool(version_row and version_row[0])
        cursor = await conn.execute(
            """SELECT format_type(a.atttypid, a.atttypmod)
                 FROM pg_attribute AS a
                WHERE a.attrelid = to_regclass(%s) AND a.attname = 'embedding'""",
            (f"memory.{table}",),
        )
        row = await cursor.fetchone()
        if row is not None:
            cursor = await conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE schemaname = 'memory' AND tablename = %s",
                (table,),
            )
            definitions = " ".join(r[0] for r in await cursor.fetchall())
            if row[0] != f"vector({dimension})" or "vector_cosine_ops" not in definitions:
                raise IndexMismatch(
                    f"pgvector table memory.{table} was made for another vector size "
                    f"or distance (want vector({dimension}), cosine)"
                )
            await _add_tombstones(conn, table)
            await _add_validity(conn, table)
            await _add_lexical(conn, table)
            return iterative_scan
        async with conn.transaction():
            await conn.execute(
                _CREATE_TABLE.format(
                    table=qualified,
                    dimension=sql.Literal(dimension),
                    open_end=sql.Literal(OPEN_END),
                )
            )
            await conn.execute(
                sql.SQL(
                    "CREATE INDEX IF NOT EXISTS {name} ON {table} "
                    "USING hnsw (embedding vector_cosine_ops)"
                ).format(name=sql.Identifier(f"{table}_hnsw"), table=qualified)
            )
            await conn.execute(
                sql.SQL("CREATE INDEX IF NOT EXISTS {name} ON {table} (namespace)").format(
                    name=sql.Identifier(f"{table}_ns"), table=qualified
                )
            )
            await _tombstone_index(conn, table)
            await conn.execute(_lexical_index(table, concurrently=False))
    return iterative_scan


def _lexical_index(table: str, *, concurrently: bool) -> sql.Composed:
    return sql.SQL("CREATE INDEX {} IF NOT EXISTS {} ON {} USING gin (lexical)").format(
        sql.SQL("CONCURRENTLY") if concurrently else sql.SQL(""),
        sql.Identifier(f"{table}_lexical"),
        sql.Identifier("memory", table),
    )


async def _add_lexical(conn: psycopg.AsyncConnection[Any], table: str) -> None:
    """A table made before lexical vectors: add the columns (NULL, metadata-only) and
    build their GIN index without blocking writes (CONCURRENTLY)."""
    cursor = await conn.execute(
        """SELECT i.indisvalid FROM pg_index AS i
             JOIN pg_class AS c ON c.oid = i.indexrelid
             JOIN pg_namespace AS n ON n.oid = c.relnamespace
            WHERE n.nspname = 'memory' AND c.relname = %s""",
        (f"{table}_lexical",),
    )
    row = await cursor.fetchone()
    if row is not None and row[0]:
        return  # no ALTER (its lock) at every start
    if row is not None:  # a concurrent build that did not finish: build it again
        await conn.execute(
            sql.SQL("DROP INDEX CONCURRENTLY {}").format(
                sql.Identifier("memory", f"{table}_lexical")
            )
        )
    await conn.execute(
        sql.SQL(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS lexical tsvector,"
            " ADD COLUMN IF NOT EXISTS lexical_weights jsonb"
        ).format(sql.Identifier("memory", table))
    )
    await conn.execute(_lexical_index(table, concurrently=True))


async def _tombstone_index(conn: psycopg.AsyncConnection[Any], table: str) -> None:
    """What the pruning of tombstones reads."""
    await conn.execute(
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS {name} ON {table} (deleted_at) WHERE deleted_at IS NOT NULL"
        ).format(name=sql.Identifier(f"{table}_tombstones"), table=sql.Identifier("memory", table))
    )


async def _has_column(conn: psycopg.AsyncConnection[Any], table: str, column: str) -> bool:
    cursor = await conn.execute(
        """SELECT 1 FROM pg_attribute
            WHERE attrelid = to_regclass(%s) AND attname = %s AND NOT attisdropped""",
        (f"memory.{table}", column),
    )
    return await cursor.fetchone() is not None


async def _add_tombstones(conn: psycopg.AsyncConnection[Any], table: str) -> None:
    """A table made before tombstones: let it hold them (metadata-only changes)."""
    if await _has_column(conn, table, "deleted_at"):
        return
    async with conn.transaction():
        await conn.execute(
            sql.SQL(
                "ALTER TABLE {} ALTER COLUMN embedding DROP NOT NULL,"
                " ADD COLUMN IF NOT EXISTS deleted_at timestamptz"
            ).format(sql.Identifier("memory", table))
        )
        await _tombstone_index(conn, table)


async def _add_validity(conn: psycopg.AsyncConnection[Any], table: str) -> None:
    """A table made before valid time: its rows become valid always, as far as the index
    knows (constant defaults: metadata-only changes; the store's re-read decides)."""
    if await _has_column(conn, table, "valid_until"):
        return  # no ALTER (its lock) at every start
    await conn.execute(
        sql.SQL(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS valid_from double precision"
            " NOT NULL DEFAULT 0, ADD COLUMN IF NOT EXISTS valid_until double precision"
            " NOT NULL DEFAULT {}"
        ).format(sql.Identifier("memory", table), sql.Literal(OPEN_END))
    )
