"""The SQL of the memory writes: create, update, supersede and erase, each one statement
with its history and outbox rows, and the numbers of its changes in its namespace's
change feed (migrations/0006_change_feed.sql).

Values always travel as bound parameters; the only interpolations are the
column lists and subqueries defined here."""

from __future__ import annotations

from services.memory.statements import COLUMNS, LIVE, LIVE_M

# The memory's columns, of the CTE `m`.
COLUMNS_M = ", ".join(f"m.{column}" for column in COLUMNS.split(", "))


def take_numbers(changes: str) -> str:
    """The change feed's numbers for `changes` (a CTE of namespace, memory_id, ...): raise
    each namespace's `last_change_sequence` by its count of changes, and return it, with
    the namespace's `feed_key` when a process watches it (`watched_key`, else NULL: the
    write is announced to the other processes only then).

    The namespace's row stays locked until the transaction ends, so writers of one
    namespace number their changes in commit order, without gaps (a rollback gives its
    numbers back). The aggregate reads every change before the first row is locked: a
    statement takes its memories' row locks first, and the feed's last, as every write
    does (no write waits for a memory while holding its namespace's numbers); and
    namespaces are taken in name order (a sweep spans several)."""
    return f"""
    INSERT INTO memory.feeds AS f (namespace, last_change_sequence)
    SELECT namespace, count(*) FROM {changes} GROUP BY namespace ORDER BY namespace
        ON CONFLICT (namespace) DO UPDATE
       SET last_change_sequence = f.last_change_sequence + excluded.last_change_sequence
 RETURNING f.namespace, f.last_change_sequence,
           CASE WHEN f.watched_until > now() THEN f.feed_key END AS watched_key"""


# The number of each change of `c` (joined with its namespace's row `f` of take_numbers),
# in the window `w` (the changes of its namespace) ordered by `order`: the last ones
# taken, in that order.
def _numbered(order: str) -> str:
    return f"f.last_change_sequence - count(*) OVER w + row_number() OVER (w ORDER BY {order})"


def write_statement(change: str, reason: str) -> str:
    """One write statement: `change` (a data-modifying query returning the memory's
    columns) as `m`, then its history row (numbered in the change feed) and its outbox
    row; returns the memory's columns, then the feed key to announce (or NULL)."""
    return f"""
WITH m AS ({change}
), f AS ({take_numbers("m")}
), r AS (
    INSERT INTO memory.revisions
           (namespace, memory_id, revision, kind, reason, content, sources, metadata,
            expire_time, recorded_at, valid_from_time, valid_until_time, superseded_by,
            change_sequence)
    SELECT m.namespace, m.memory_id, m.revision, 'write', '{reason}', m.content, m.sources,
           m.metadata, m.expire_time, m.update_time, m.valid_from_time, m.valid_until_time,
           m.superseded_by, {_numbered("m.memory_id")}
      FROM m JOIN f ON f.namespace = m.namespace
    WINDOW w AS (PARTITION BY m.namespace)
), o AS (
    INSERT INTO memory.outbox (namespace, memory_id) SELECT namespace, memory_id FROM m
)
SELECT {COLUMNS_M}, f.watched_key FROM m JOIN f ON f.namespace = m.namespace
"""


# The live revision of one memory: why a conditional write wrote nothing.
CURRENT_REVISION = f"""
SELECT revision FROM memory.memories
 WHERE namespace = %(namespace)s AND memory_id = %(memory_id)s AND {LIVE}
"""


# A memory live at one revision (the replay of a recorded request).
LIVE_AT_REVISION = f"""
SELECT {COLUMNS} FROM memory.memories
 WHERE namespace = %s AND memory_id = %s AND revision = %s AND {LIVE}
"""


# Create: the revision continues after any earlier incarnation's tombstone.
CREATE = write_statement(
    f"""
    INSERT INTO memory.memories
           (namespace, memory_id, content, sources, metadata, revision, expire_time,
            embedding_model, embedding_dimension, valid_from_time, valid_until_time)
    VALUES (%(namespace)s, %(memory_id)s, %(content)s, %(sources)s, %(metadata)s,
            coalesce((SELECT max(revision) FROM memory.revisions
                       WHERE namespace = %(namespace)s AND memory_id = %(memory_id)s), 0) + 1,
            %(expire_time)s, %(model)s, %(dimension)s,
            coalesce(%(valid_from)s::timestamptz, now()), %(valid_until)s::timestamptz)
    ON CONFLICT (namespace, memory_id) DO NOTHING
    RETURNING {COLUMNS}""",
    "create",
)


# Update: a compare-and-swap on the live memory's revision. Validity not given is kept.
UPDATE = write_statement(
    f"""
    UPDATE memory.memories
       SET content = %(content)s, sources = %(sources)s, metadata = %(metadata)s,
           expire_time = %(expire_time)s, embedding_model = %(model)s,
           valid_from_time = coalesce(%(valid_from)s::timestamptz, valid_from_time),
           valid_until_time = coalesce(%(valid_until)s::timestamptz, valid_until_time),
           embedding_dimension = %(dimension)s, revision = revision + 1, update_time = now()
     WHERE namespace = %(namespace)s AND memory_id = %(memory_id)s
       AND revision = %(expected_revision)s AND {LIVE}
 RETURNING {COLUMNS}""",
    "update",
)


# The memories a write supersedes (and the written memory itself, on an update), locked
# in id order before the write: two supersessions that share memories take their locks in
# the same order.
LOCK_FOR_SUPERSESSION = f"""
SELECT memory_id, revision, valid_from_time, valid_until_time, superseded_by
  FROM memory.memories
 WHERE namespace = %(namespace)s AND memory_id = ANY(%(ids)s) AND {LIVE}
 ORDER BY memory_id
   FOR UPDATE
"""


# The successors of a memory, following superseded_by (each memory has at most one):
# returns the first of %(ids)s met, i.e. a supersession of it would close a cycle.
SUCCESSOR_IN = """
WITH RECURSIVE chain (memory_id) AS (
    SELECT superseded_by FROM memory.memories
     WHERE namespace = %(namespace)s AND memory_id = %(memory_id)s
       AND superseded_by IS NOT NULL
    UNION
    SELECT m.superseded_by
      FROM memory.memories AS m JOIN chain AS c ON m.memory_id = c.memory_id
     WHERE m.namespace = %(namespace)s AND m.superseded_by IS NOT NULL
)
SELECT memory_id FROM chain WHERE memory_id = ANY(%(ids)s) LIMIT 1
"""


# Close the validity of the superseded memories (already locked and checked): a new
# revision of each, with its history and outbox rows.
SUPERSEDE = write_statement(
    f"""
    UPDATE memory.memories
       SET valid_until_time = %(valid_until)s, superseded_by = %(superseded_by)s,
           revision = revision + 1, update_time = now()
     WHERE namespace = %(namespace)s AND memory_id = ANY(%(ids)s)
 RETURNING {COLUMNS}""",
    "superseded",
)


# Erase the memories that `{victims}` selects (a query returning namespace,
# memory_id): delete the row, blank the content and validity of its whole history,
# write a tombstone and an outbox row, in one statement. The memories an erased one
# superseded are reopened (a new revision, validity open again, their history no
# longer naming it): what the erased memory's content caused goes with it. Every
# tombstone and reopening is numbered in its namespace's change feed (the tombstones
# first, then the reopenings, each in memory id order). Returns one row per memory
# erased, with whether it was still live (not yet expired), the feed key to announce
# (or NULL), and on every row how many revisions had their content erased (an erasure
# receipt counts them).
ERASE = f"""
WITH d AS (
    DELETE FROM memory.memories AS m
     USING ({{victims}}) AS v
     WHERE m.namespace = v.namespace AND m.memory_id = v.memory_id {{extra}}
 RETURNING m.namespace, m.memory_id, m.revision, {LIVE_M} AS live
), p AS (
    UPDATE memory.revisions AS h
       SET content = NULL, sources = NULL, metadata = NULL,
           valid_from_time = NULL, valid_until_time = NULL, superseded_by = NULL
      FROM d
     WHERE h.namespace = d.namespace AND h.memory_id = d.memory_id AND h.content IS NOT NULL
 RETURNING h.revision
), r AS (
    UPDATE memory.memories AS y
       SET valid_until_time = NULL, superseded_by = NULL, revision = y.revision + 1,
           update_time = now()
      FROM d
     WHERE y.namespace = d.namespace AND y.superseded_by = d.memory_id
       AND NOT EXISTS (SELECT 1 FROM d AS e
                        WHERE e.namespace = y.namespace AND e.memory_id = y.memory_id)
 RETURNING y.namespace, y.memory_id, y.revision, y.content, y.sources, y.metadata,
           y.expire_time, y.update_time, y.valid_from_time, d.memory_id AS successor
), c AS (
    -- Every change of the statement: 0, a tombstone; 1, a reopening.
    SELECT namespace, memory_id, 0 AS part FROM d
    UNION ALL
    SELECT namespace, memory_id, 1 FROM r
), f AS ({take_numbers("c")}
), n AS (
    SELECT c.namespace, c.memory_id, c.part, f.watched_key,
           {_numbered("c.part, c.memory_id")} AS change_sequence
      FROM c JOIN f ON f.namespace = c.namespace
    WINDOW w AS (PARTITION BY c.namespace)
), t AS (
    INSERT INTO memory.revisions (namespace, memory_id, revision, kind, reason, change_sequence)
    SELECT d.namespace, d.memory_id, d.revision + 1, 'delete', %(reason)s, n.change_sequence
      FROM d JOIN n ON n.namespace = d.namespace AND n.memory_id = d.memory_id AND n.part = 0
), rh AS (
    INSERT INTO memory.revisions
           (namespace, memory_id, revision, kind, reason, content, sources, metadata,
            expire_time, recorded_at, valid_from_time, change_sequence)
    SELECT r.namespace, r.memory_id, r.revision, 'write', 'reopened', r.content, r.sources,
           r.metadata, r.expire_time, r.update_time, r.valid_from_time, n.change_sequence
      FROM r JOIN n ON n.namespace = r.namespace AND n.memory_id = r.memory_id AND n.part = 1
), rp AS (
    UPDATE memory.revisions AS h
       SET valid_until_time = NULL, superseded_by = NULL
      FROM r
     WHERE h.namespace = r.namespace AND h.memory_id = r.memory_id
       AND h.superseded_by = r.successor
), o AS (
    INSERT INTO memory.outbox (namespace, memory_id)
    SELECT namespace, memory_id FROM d
    UNION ALL
    SELECT namespace, memory_id FROM r
)
SELECT d.live, n.watched_key, (SELECT count(*) FROM p) AS revisions
  FROM d JOIN n ON n.namespace = d.namespace AND n.memory_id = d.memory_id AND n.part = 0
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


# The memories one of whose sources is an external URI: containment, so that the GIN
# index on sources (jsonb_path_ops) finds them; jsonb compares the strings exactly.
BY_EXTERNAL = """
SELECT namespace, memory_id FROM memory.memories
 WHERE namespace = %(namespace)s AND sources @> %(containment)s
"""


EXPIRED = """
SELECT namespace, memory_id FROM memory.memories
 WHERE expire_time IS NOT NULL AND expire_time <= now()
 ORDER BY expire_time
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED
"""


# Writes and erasures naming one conversation, one at a time (the same key as the
# summary service's, in its own database or schema).
LOCK_CONVERSATION = "SELECT pg_advisory_xact_lock(hashtextextended(%s || '/' || %s, 0))"


# An erasure's tombstone (the incarnation it fenced), adding up what every erasure of
# the incarnation deleted. `outbox_through`: an outbox position no lower than the index
# writes this one queued (its own rows are visible to it), so that the index has caught
# up with the erasure once no row at or below it is left.
RECORD_ERASURE = """
INSERT INTO memory.erasures AS e
       (namespace, conversation_id, incarnation, memories, revisions, index_points,
        outbox_through)
VALUES (%(namespace)s, %(conversation_id)s, %(incarnation)s, %(memories)s, %(revisions)s,
        %(memories)s,
        CASE WHEN %(memories)s > 0 THEN (SELECT max(seq) FROM memory.outbox) END)
ON CONFLICT (namespace, conversation_id, incarnation) DO UPDATE
   SET memories = e.memories + excluded.memories,
       revisions = e.revisions + excluded.revisions,
       index_points = e.index_points + excluded.index_points,
       outbox_through = greatest(e.outbox_through, excluded.outbox_through)
"""


# An outbox row at or below an erasure's `outbox_through`: the index is not there yet.
_PENDING = "EXISTS (SELECT 1 FROM memory.outbox AS o WHERE o.seq <= e.outbox_through)"


# Record when the index caught up with an erasure (once: the first time it is seen).
INDEX_CAUGHT_UP = f"""
UPDATE memory.erasures AS e SET index_complete_time = now()
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   AND incarnation = %(incarnation)s AND index_complete_time IS NULL
   AND (outbox_through IS NULL OR NOT {_PENDING})
"""


ERASURE = """
SELECT conversation_id, incarnation, memories, revisions, index_points, erase_time,
       index_complete_time
  FROM memory.erasures
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   AND incarnation = %(incarnation)s
"""


# Tombstones past their retention, except those whose index writes are still queued
# (their receipts would never learn that the index caught up).
PRUNE_ERASURES = f"""
DELETE FROM memory.erasures AS e
 WHERE erase_time < now() - make_interval(secs => %(retention_s)s)
   AND (outbox_through IS NULL OR index_complete_time IS NOT NULL OR NOT {_PENDING})
"""
