"""The SQL of the pgvector adapter (adapter.py): its statements, and the search
statements composed for a query.

Statements name the table as `{}` (or `{table}`), filled with the adapter's
qualified table name; a query's terms become conditions with their values bound
as parameters, never interpolated.

Lexical (issue 21): `lexical` is a `tsvector` of the memory's term ids
(services/memory/search/lexical.py tokenises for every back-end; the lexemes are the
ids as text, so PostgreSQL's parser and dictionaries play no part) with a GIN
index, and `lexical_weights` the BM25 document weights by term (jsonb). NULL
on a row indexed before them: a write at the same revision that brings them
replaces it (`OR t.revision = excluded.revision AND t.lexical IS NULL`). A
search computes BM25 in the statement: the IDF of each query term from N and df
counted over the namespace's rows (through the namespace b-tree and the GIN
index), the score of a row from its weights. A hybrid search is one statement:
the dense top N (HNSW or exact, as a dense search) and the lexical top N
(GIN), rescored by both, fused (the same fusion as the other back-ends,
services/memory/search/lexical.py), best first.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from services.memory.index.model import NAMESPACE_FIELD, TAGS_FIELD, Term, ValidAt
from services.memory.search.lexical import FusionMethod, SearchMode

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


def where(terms: Sequence[Term | ValidAt]) -> sql.Composed:
    """A query's terms as one condition, the value of term i bound to %(term<i>)s."""
    return sql.SQL(" AND ").join(
        _condition(t, sql.Placeholder(f"term{i}")) for i, t in enumerate(terms)
    )


def term_values(terms: Sequence[Term | ValidAt]) -> dict[str, object]:
    """The parameters of `where(terms)`."""
    return {f"term{i}": _value(t) for i, t in enumerate(terms)}


# The HNSW index orders the scan; the filter applies to what it yields.
HNSW = sql.SQL(
    """SELECT memory_id, revision, 1 - (embedding <=> %(vector)s) AS score
         FROM {}
        WHERE {}
        ORDER BY embedding <=> %(vector)s
        LIMIT %(limit)s"""
)
# Exact: OFFSET 0 keeps the planner from ordering by the HNSW index, so the
# namespace's rows come from the b-tree and are all compared.
EXACT = sql.SQL(
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
IDF = sql.SQL(
    """idf AS MATERIALIZED (
         SELECT q.term, ln(1 + (n.n - d.df + 0.5) / (d.df + 0.5)) AS idf
           FROM unnest(%(terms)s::text[]) AS q(term)
          CROSS JOIN (SELECT count(*)::float8 AS n FROM {table}
                       WHERE namespace = %(namespace)s) AS n
          CROSS JOIN LATERAL (SELECT count(*)::float8 AS df FROM {table}
                               WHERE namespace = %(namespace)s
                                 AND lexical @@ q.term::tsquery) AS d)"""
)
BM25 = sql.SQL(
    "(SELECT coalesce(sum(i.idf * (r.lexical_weights ->> i.term)::float8), 0)"
    " FROM idf AS i WHERE r.lexical_weights ? i.term)"
)
LEXICAL = sql.SQL(
    """WITH {idf}
       SELECT memory_id, revision, NULL::float8 AS dense, lexical, lexical AS score
         FROM (SELECT r.memory_id, r.revision, {bm25} AS lexical
                 FROM {table} AS r
                WHERE {where} AND r.lexical @@ %(tsquery)s::tsquery) AS s
        ORDER BY score DESC, memory_id
        LIMIT %(limit)s"""
)
# Hybrid: {dense} is the dense search's statement (HNSW or exact) for point ids.
HYBRID = sql.SQL(
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
SCORE_FUSION = sql.SQL(
    "(1 - %(weight)s) * dense + coalesce(%(weight)s * lexical / nullif(max(lexical) OVER (), 0), 0)"
)
RRF_FUSION = sql.SQL(
    "2 * (1 - %(weight)s) / (%(rrf_k)s + row_number() OVER (ORDER BY dense DESC, memory_id))"
    " + CASE WHEN lexical > 0 THEN 2 * %(weight)s"
    " / (%(rrf_k)s + row_number() OVER (ORDER BY lexical DESC)) ELSE 0 END"
)
DENSE_IDS_HNSW = sql.SQL(
    "SELECT point_id FROM {} WHERE {} ORDER BY embedding <=> %(vector)s LIMIT %(limit)s"
)
DENSE_IDS_EXACT = sql.SQL(
    """SELECT point_id FROM (SELECT point_id, embedding FROM {} WHERE {} OFFSET 0) AS rows
        ORDER BY embedding <=> %(vector)s LIMIT %(limit)s"""
)
# How many rows the namespace holds, counted no further than the exact-search bound.
COUNT = sql.SQL(
    "SELECT count(*) FROM (SELECT 1 FROM {} WHERE namespace = %(namespace)s LIMIT %(bound)s) AS n"
)
# A point replaces only an older revision of its memory (point or tombstone).
UPSERT = sql.SQL(
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
TOMBSTONE = sql.SQL(
    """INSERT INTO {} AS t (point_id, namespace, memory_id, revision, tags, embedding, deleted_at)
       VALUES (%s, '', %s, %s, '{{}}', NULL, now())
       ON CONFLICT (point_id) DO UPDATE
          SET namespace = '', revision = excluded.revision, tags = '{{}}', embedding = NULL,
              deleted_at = excluded.deleted_at, lexical = NULL, lexical_weights = NULL
        WHERE t.revision <= excluded.revision"""
)
PURGE = sql.SQL("DELETE FROM {} WHERE point_id = ANY(%s)")
PRUNE = sql.SQL("DELETE FROM {} WHERE deleted_at <= now() - make_interval(secs => %s)")
KEYS = sql.SQL("SELECT namespace, memory_id FROM {} WHERE deleted_at IS NULL")


def lexical_statement(table: sql.Composable, conditions: sql.Composable) -> sql.Composed:
    """The lexical search: BM25 over the rows sharing a query term."""
    return LEXICAL.format(idf=IDF.format(table=table), bm25=BM25, table=table, where=conditions)


def ranked_statement(
    table: sql.Composable,
    mode: SearchMode,
    fusion: FusionMethod,
    conditions: sql.Composable,
    *,
    exact: bool,
) -> sql.Composed:
    """The dense or hybrid search, its dense part exact or through HNSW."""
    if mode is SearchMode.DENSE:
        return (EXACT if exact else HNSW).format(table, conditions)
    dense = (DENSE_IDS_EXACT if exact else DENSE_IDS_HNSW).format(table, conditions)
    return HYBRID.format(
        idf=IDF.format(table=table),
        dense=dense,
        table=table,
        where=conditions,
        bm25=BM25,
        fusion=SCORE_FUSION if fusion is FusionMethod.SCORE else RRF_FUSION,
    )
