"""The SQL of the memory store.

Values always travel as bound parameters; the only interpolations are the
column lists and subqueries defined here.
"""

from __future__ import annotations

COLUMNS = (
    "namespace, memory_id, content, sources, metadata, revision, create_time, update_time, "
    "expire_time, embedding_model, embedding_dimension"
)


def write_statement(change: str, reason: str) -> str:
    """One write statement: `change` (a data-modifying query returning the memory's
    columns) as `m`, then its history row and its outbox row; returns the memory."""
    return f"""
WITH m AS ({change}
), r AS (
    INSERT INTO memory.revisions
           (namespace, memory_id, revision, kind, reason, content, sources, metadata,
            expire_time, recorded_at)
    SELECT namespace, memory_id, revision, 'write', '{reason}', content, sources, metadata,
           expire_time, update_time
      FROM m
), o AS (
    INSERT INTO memory.outbox (namespace, memory_id) SELECT namespace, memory_id FROM m
)
SELECT {COLUMNS} FROM m
"""


LIVE = "(expire_time IS NULL OR expire_time > now())"


# The same, on the memories table aliased `m`.
LIVE_M = "(m.expire_time IS NULL OR m.expire_time > now())"


# The live revision of one memory: why a conditional write wrote nothing.
CURRENT_REVISION = f"""
SELECT revision FROM memory.memories
 WHERE namespace = %(namespace)s AND memory_id = %(memory_id)s AND {LIVE}
"""


# Create: the revision continues after any earlier incarnation's tombstone.
CREATE = write_statement(
    f"""
    INSERT INTO memory.memories
           (namespace, memory_id, content, sources, metadata, revision, expire_time,
            embedding_model, embedding_dimension)
    VALUES (%(namespace)s, %(memory_id)s, %(content)s, %(sources)s, %(metadata)s,
            coalesce((SELECT max(revision) FROM memory.revisions
                       WHERE namespace = %(namespace)s AND memory_id = %(memory_id)s), 0) + 1,
            %(expire_time)s, %(model)s, %(dimension)s)
    ON CONFLICT (namespace, memory_id) DO NOTHING
    RETURNING {COLUMNS}""",
    "create",
)


# Update: a compare-and-swap on the live memory's revision.
UPDATE = write_statement(
    f"""
    UPDATE memory.memories
       SET content = %(content)s, sources = %(sources)s, metadata = %(metadata)s,
           expire_time = %(expire_time)s, embedding_model = %(model)s,
           embedding_dimension = %(dimension)s, revision = revision + 1, update_time = now()
     WHERE namespace = %(namespace)s AND memory_id = %(memory_id)s
       AND revision = %(expected_revision)s AND {LIVE}
 RETURNING {COLUMNS}""",
    "update",
)


# Erase the memories that `{victims}` selects (a query returning namespace,
# memory_id): delete the row, blank the content of its whole history, write a
# tombstone and an outbox row, in one statement. Returns one row per memory
# erased, with whether it was still live (not yet expired).
ERASE = f"""
WITH d AS (
    DELETE FROM memory.memories AS m
     USING ({{victims}}) AS v
     WHERE m.namespace = v.namespace AND m.memory_id = v.memory_id {{extra}}
 RETURNING m.namespace, m.memory_id, m.revision, {LIVE_M} AS live
), p AS (
    UPDATE memory.revisions AS h
       SET content = NULL, sources = NULL, metadata = NULL
      FROM d
     WHERE h.namespace = d.namespace AND h.memory_id = d.memory_id AND h.content IS NOT NULL
), t AS (
    INSERT INTO memory.revisions (namespace, memory_id, revision, kind, reason)
    SELECT namespace, memory_id, revision + 1, 'delete', %(reason)s FROM d
), o AS (
    INSERT INTO memory.outbox (namespace, memory_id) SELECT namespace, memory_id FROM d
)
SELECT live FROM d
"""


BY_ID = "SELECT %(namespace)s::text AS namespace, %(memory_id)s::uuid AS memory_id"


BY_SOURCE = """
SELECT namespace, memory_id FROM memory.memories
 WHERE namespace = %(namespace)s
   AND sources @> %(containment)s
   AND EXISTS (SELECT 1 FROM jsonb_array_elements(sources) AS s
                WHERE s->>'c' = %(conversation)s
                  AND (s->>'f')::bigint <= %(high)s AND (s->>'t')::bigint >= %(low)s)
"""


EXPIRED = """
SELECT namespace, memory_id FROM memory.memories
 WHERE expire_time IS NOT NULL AND expire_time <= now()
 ORDER BY expire_time
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED
"""


# Degraded search: any query word may match (plainto_tsquery ANDs them, which
# finds almost nothing for a question); ts_rank orders the hits.
TEXT_SEARCH = f"""
SELECT {COLUMNS}, ts_rank(content_tsv, q.query) AS score
  FROM memory.memories,
       (SELECT replace(plainto_tsquery('english', %(query)s)::text, ' & ', ' | ')::tsquery
               AS query) AS q
 WHERE namespace = %(namespace)s AND {LIVE} AND metadata @> %(metadata)s
   AND content_tsv @@ q.query
 ORDER BY score DESC, memory_id
 LIMIT %(limit)s
"""


# Claim the oldest rows no live claim holds: the rows themselves carry the
# claim (token, expiry), so no transaction stays open while the indexer embeds
# and writes the index, and several indexers take disjoint batches. The scan
# follows the primary key and passes over at most the rows of live claims
# (indexers x batch); FOR UPDATE SKIP LOCKED keeps two claims from racing for
# one row.
CLAIM_OUTBOX = """
WITH c AS (
    SELECT seq FROM memory.outbox
     WHERE claim_until IS NULL OR claim_until < now()
     ORDER BY seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE memory.outbox AS o
   SET claim_token = %(token)s, claim_until = now() + make_interval(secs => %(lease_s)s)
  FROM c
 WHERE o.seq = c.seq
RETURNING o.seq, o.namespace, o.memory_id
"""


# The state of the claimed memories in one snapshot: the live row, else the
# last revision recorded (a deletion's tombstone, or the write of a memory
# that expired and awaits the sweeper). Read apart, a re-create between the
# two reads would pass as the revision of a deletion.
OUTBOX_STATE = f"""
SELECT k.namespace, k.memory_id,
       (SELECT max(r.revision) FROM memory.revisions AS r
         WHERE r.namespace = k.namespace AND r.memory_id = k.memory_id),
       {", ".join("m." + c.strip() for c in COLUMNS.split(","))}
  FROM unnest(%s::text[], %s::uuid[]) AS k(namespace, memory_id)
  LEFT JOIN memory.memories AS m
    ON m.namespace = k.namespace AND m.memory_id = k.memory_id AND {LIVE_M}
"""


COMPLETE_OUTBOX = """
DELETE FROM memory.outbox WHERE seq = ANY(%(seqs)s) AND claim_token = %(token)s
"""


RELEASE_OUTBOX = """
UPDATE memory.outbox SET claim_token = NULL, claim_until = NULL
 WHERE seq = ANY(%(seqs)s) AND claim_token = %(token)s
"""


# Writes and erasures naming one conversation, one at a time (the same key as the
# summary service's, in its own database or schema).
LOCK_CONVERSATION = "SELECT pg_advisory_xact_lock(hashtextextended(%s || '/' || %s, 0))"
