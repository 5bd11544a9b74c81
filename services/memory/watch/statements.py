"""The SQL of WatchMemories (store.py): opening a stream, one read of a namespace's
changes, and the pulse over every namespace a process watches.

Values always travel as bound parameters; the only interpolations are the
fragments defined here.
"""

from __future__ import annotations

from services.memory.config import CHANGE_OVERHEAD_BYTES

# Mark the namespace watched (its writes then announce themselves) and read its feed's
# head. The row is made for a namespace that never changed; the mark is written only
# when it would lapse soon (a stream opened where this or another process watches
# already writes nothing), and then RETURNING says the head. Otherwise the head is read
# as it is (none, when the row committed by another stream's open after this
# statement's snapshot: the store asks again).
OPEN_WATCH = """
WITH marked AS (
    INSERT INTO memory.feeds AS f (namespace, last_change_sequence, watched_until)
    VALUES (%(namespace)s, 0, now() + make_interval(secs => %(ttl_s)s))
        ON CONFLICT (namespace) DO UPDATE SET watched_until = excluded.watched_until
     WHERE f.watched_until IS NULL
        OR f.watched_until < now() + make_interval(secs => %(renew_before_s)s)
 RETURNING f.feed_key, f.last_change_sequence
)
SELECT feed_key, last_change_sequence, now() FROM marked
UNION ALL
SELECT feed_key, last_change_sequence, now() FROM memory.feeds
 WHERE namespace = %(namespace)s AND NOT EXISTS (SELECT 1 FROM marked)
"""


# One read of a stream, in one snapshot: the namespace's head, and the first %(limit)s
# changes after %(after)s (an index range of revisions_change_sequence), past the first
# no more than about %(max_bytes)s of memory. A change of a memory that still has its
# content (not removed since) comes with the memory as of that revision: its history
# row, and the live row's create time and embedding model.
READ_CHANGES = f"""
WITH f AS MATERIALIZED (
    SELECT last_change_sequence, now() AS read_time FROM memory.feeds
     WHERE feed_key = %(key)s
), c AS (
    SELECT h.change_sequence, h.kind, h.reason, h.memory_id, h.revision, h.recorded_at,
           h.content, h.sources, h.metadata, h.expire_time, h.valid_from_time,
           h.valid_until_time, h.superseded_by,
           coalesce(octet_length(h.content), 0)
             + coalesce(octet_length(h.sources::text), 0)
             + coalesce(octet_length(h.metadata::text), 0) + {CHANGE_OVERHEAD_BYTES} AS size
      FROM memory.revisions AS h
     WHERE h.namespace = %(namespace)s AND h.change_sequence > %(after)s
       AND h.change_sequence <= (SELECT last_change_sequence FROM f)
     ORDER BY h.change_sequence
     LIMIT %(limit)s
), page AS (
    SELECT c.*, sum(size) OVER (ORDER BY change_sequence) - size AS before FROM c
)
SELECT f.last_change_sequence, f.read_time,
       p.change_sequence, p.kind, p.reason, p.memory_id, p.revision, p.recorded_at, p.size,
       p.content, p.sources, p.metadata, p.expire_time, p.valid_from_time,
       p.valid_until_time, p.superseded_by,
       m.create_time, m.embedding_model, m.embedding_dimension
  FROM f
  LEFT JOIN page AS p ON p.before < %(max_bytes)s
  LEFT JOIN memory.memories AS m
         ON p.content IS NOT NULL
        AND m.namespace = %(namespace)s AND m.memory_id = p.memory_id
 ORDER BY p.change_sequence
"""


# Every watched namespace of a process in one statement: renew the marks that would
# lapse soon (skipping a row a writer holds: it is renewed next time, well before it
# lapses), and read the heads.
PULSE = """
WITH due AS (
    SELECT namespace FROM memory.feeds
     WHERE feed_key = ANY(%(keys)s::bigint[])
       AND (watched_until IS NULL
            OR watched_until < now() + make_interval(secs => %(renew_before_s)s))
       FOR NO KEY UPDATE SKIP LOCKED
), renewed AS (
    UPDATE memory.feeds AS u
       SET watched_until = now() + make_interval(secs => %(ttl_s)s)
      FROM due
     WHERE u.namespace = due.namespace
)
SELECT feed_key, last_change_sequence, now() FROM memory.feeds
 WHERE feed_key = ANY(%(keys)s::bigint[])
"""
