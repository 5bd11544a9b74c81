"""The SQL of checkpoints (store.py): puts, reads, deletions and copies of a
conversation's LangGraph checkpoints, their channel values and pending writes.

Values always travel as bound parameters.
"""

from __future__ import annotations

# The conversation a put writes to, held against erasure and DeleteCheckpoints (which
# take it FOR UPDATE) until the put commits, with its exclusive lease holder, if any.
THREAD = """
SELECT conversation_key, lease_turn_id,
       coalesce(lease_until >= now(), false), lease_fencing_token
  FROM transcript.conversations
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   FOR KEY SHARE
"""

# The turn lease a fenced write quotes, while it holds: locked, so that a takeover or a
# release (which update the row) waits for the write to commit, and the write never
# commits after the lease ended.
LEASE_HELD = """
SELECT 1 FROM transcript.turns
 WHERE conversation_key = %(key)s AND turn_id = %(turn_id)s
   AND fencing_token = %(fencing_token)s AND state = 'running' AND lease_until >= now()
   FOR SHARE
"""

CONVERSATION_KEY = """
SELECT conversation_key FROM transcript.conversations
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
"""

# The values of the channels whose version is new, whole or as deltas (model.py); a
# value stored already is kept.
PUT_VALUES = """
INSERT INTO transcript.checkpoint_blobs
       (conversation_key, checkpoint_ns, channel, version, type, blob, full_length,
        base_version, head_length, base_offset, base_length, depth)
SELECT %(key)s, %(checkpoint_ns)s, v.channel, v.version, v.type, v.blob, v.full_length,
       v.base_version, v.head_length, v.base_offset, v.base_length, v.depth
  FROM unnest(%(channels)s::text[], %(versions)s::text[], %(types)s::text[],
              %(blobs)s::bytea[], %(full_lengths)s::bigint[], %(base_versions)s::text[],
              %(head_lengths)s::integer[], %(base_offsets)s::integer[],
              %(base_lengths)s::integer[], %(depths)s::integer[])
       AS v(channel, version, type, blob, full_length, base_version, head_length,
            base_offset, base_length, depth)
ON CONFLICT (conversation_key, checkpoint_ns, channel, version) DO NOTHING
"""

# The channel versions of the parent checkpoint: the bases of the new values' deltas.
PARENT_VERSIONS = """
SELECT channels, versions FROM transcript.checkpoints
 WHERE conversation_key = %(key)s AND checkpoint_ns = %(checkpoint_ns)s
   AND checkpoint_id = %(parent)s
"""

# Which of the new values are stored already (a repeat of a put).
STORED_VERSIONS = """
SELECT b.channel, b.version FROM transcript.checkpoint_blobs AS b
  JOIN unnest(%(channels)s::text[], %(versions)s::text[]) AS n(channel, version)
    ON b.channel = n.channel AND b.version = n.version
 WHERE b.conversation_key = %(key)s AND b.checkpoint_ns = %(checkpoint_ns)s
"""

# A read (GetCheckpoint, a ListCheckpoints page) sees one snapshot: the keys it chooses,
# their checkpoints, values and writes as of one instant, whatever commits meanwhile (a
# prune between two of its statements would otherwise leave a chosen key unread).
ONE_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"

# A value and the chain of bases it is a delta of, the value first (at most its depth
# + 1 rows: index probes).
CHAIN = """
WITH RECURSIVE chain AS (
    SELECT b.version, b.type, b.blob, b.base_version, b.head_length, b.base_offset,
           b.base_length, b.depth, 0 AS link
      FROM transcript.checkpoint_blobs AS b
     WHERE b.conversation_key = %(key)s AND b.checkpoint_ns = %(checkpoint_ns)s
       AND b.channel = %(channel)s AND b.version = %(version)s
    UNION ALL
    SELECT b.version, b.type, b.blob, b.base_version, b.head_length, b.base_offset,
           b.base_length, b.depth, c.link + 1
      FROM chain AS c
      JOIN transcript.checkpoint_blobs AS b
        ON b.conversation_key = %(key)s AND b.checkpoint_ns = %(checkpoint_ns)s
       AND b.channel = %(channel)s AND b.version = c.base_version
     -- A put makes chains at most DELTA_MAX_DEPTH deep: a bad row cannot make it spin.
     WHERE c.link <= 64
)
SELECT type, blob, base_version, head_length, base_offset, base_length, depth
  FROM chain ORDER BY link
"""

PUT_CHECKPOINT = """
INSERT INTO transcript.checkpoints
       (conversation_key, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
        checkpoint_type, checkpoint, metadata, run_id, channels, versions)
VALUES (%(key)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(parent_checkpoint_id)s,
        %(checkpoint_type)s, %(checkpoint)s, %(metadata)s::jsonb, %(run_id)s,
        %(channels)s::text[], %(versions)s::text[])
ON CONFLICT (conversation_key, checkpoint_ns, checkpoint_id) DO UPDATE
   SET parent_checkpoint_id = EXCLUDED.parent_checkpoint_id,
       checkpoint_type = EXCLUDED.checkpoint_type, checkpoint = EXCLUDED.checkpoint,
       metadata = EXCLUDED.metadata, run_id = EXCLUDED.run_id,
       channels = EXCLUDED.channels, versions = EXCLUDED.versions
"""

# The bytes of the values a checkpoint names (index probes, one per channel).
VALUES_BYTES = """
SELECT coalesce(sum(b.full_length), 0)
  FROM unnest(%(channels)s::text[], %(versions)s::text[]) AS n(channel, version)
  JOIN transcript.checkpoint_blobs AS b
    ON b.conversation_key = %(key)s AND b.checkpoint_ns = %(checkpoint_ns)s
   AND b.channel = n.channel AND b.version = n.version
"""

# Pending writes: a repeat of a (task, idx) keeps the first, but the special channels'
# (negative idx: error, interrupt, resume, scheduled) are replaced, as LangGraph's own
# savers do.
PUT_WRITES = """
INSERT INTO transcript.checkpoint_writes
       (conversation_key, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob,
        task_path)
SELECT %(key)s, %(checkpoint_ns)s, %(checkpoint_id)s, %(task_id)s, w.idx, w.channel,
       w.type, w.blob, %(task_path)s
  FROM unnest(%(idxs)s::integer[], %(channels)s::text[], %(types)s::text[],
              %(blobs)s::bytea[]) AS w(idx, channel, type, blob)
ON CONFLICT (conversation_key, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE
   SET channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob,
       task_path = EXCLUDED.task_path
 WHERE EXCLUDED.idx < 0
"""

# The checkpoints of a page, newest first, with what each weighs as read back (its
# serialized form, the values it names, its writes): the page is cut by weight before
# any value is read.
_WEIGHT = """octet_length(c.checkpoint) + coalesce((
    SELECT sum(b.full_length)
      FROM unnest(c.channels, c.versions) AS n(channel, version)
      JOIN transcript.checkpoint_blobs AS b
        ON b.conversation_key = c.conversation_key AND b.checkpoint_ns = c.checkpoint_ns
       AND b.channel = n.channel AND b.version = n.version), 0) + coalesce((
    SELECT sum(octet_length(w.blob)) FROM transcript.checkpoint_writes AS w
     WHERE w.conversation_key = c.conversation_key AND w.checkpoint_ns = c.checkpoint_ns
       AND w.checkpoint_id = c.checkpoint_id), 0)"""

# What a checkpoint weighs with its writes once a call's writes are in (the writes alone
# while the checkpoint's put has not landed yet): a read returns them all, so the writes
# of all calls against one checkpoint are bounded as its put is.
WEIGHT_WITH_WRITES = f"""
SELECT coalesce(
    (SELECT {_WEIGHT} FROM transcript.checkpoints AS c
      WHERE c.conversation_key = %(key)s AND c.checkpoint_ns = %(checkpoint_ns)s
        AND c.checkpoint_id = %(checkpoint_id)s),
    (SELECT coalesce(sum(octet_length(w.blob)), 0) FROM transcript.checkpoint_writes AS w
      WHERE w.conversation_key = %(key)s AND w.checkpoint_ns = %(checkpoint_ns)s
        AND w.checkpoint_id = %(checkpoint_id)s))
"""

LIST_KEYS = f"""
SELECT c.checkpoint_ns, c.checkpoint_id, {_WEIGHT}
  FROM transcript.checkpoints AS c
 WHERE c.conversation_key = %(key)s
   AND (%(checkpoint_ns)s::text IS NULL OR c.checkpoint_ns = %(checkpoint_ns)s::text)
   AND (%(checkpoint_id)s::text IS NULL OR c.checkpoint_id = %(checkpoint_id)s::text)
   AND (%(filter)s::jsonb IS NULL OR c.metadata @> %(filter)s::jsonb)
   AND (%(before)s::text IS NULL OR c.checkpoint_id < %(before)s::text)
   AND (%(after_id)s::text IS NULL
        OR (c.checkpoint_id, c.checkpoint_ns) < (%(after_id)s::text, %(after_ns)s::text))
 ORDER BY c.checkpoint_id DESC, c.checkpoint_ns DESC
 LIMIT %(limit)s
"""

READ_CHECKPOINTS = """
SELECT c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.checkpoint_type,
       c.checkpoint, c.metadata::text, c.channels, c.versions, c.create_time
  FROM unnest(%(namespaces)s::text[], %(ids)s::text[]) AS k(checkpoint_ns, checkpoint_id)
  JOIN transcript.checkpoints AS c
    ON c.conversation_key = %(key)s AND c.checkpoint_ns = k.checkpoint_ns
   AND c.checkpoint_id = k.checkpoint_id
"""

# The values the chosen checkpoints name, each once (the keys made distinct first, so
# that no value's bytes are sorted or hashed).
READ_VALUES = """
SELECT b.checkpoint_ns, b.channel, b.version, b.type, b.blob, b.base_version
  FROM (SELECT DISTINCT c.checkpoint_ns, n.channel, n.version
          FROM transcript.checkpoints AS c
         CROSS JOIN LATERAL unnest(c.channels, c.versions) AS n(channel, version)
         WHERE c.conversation_key = %(key)s
           AND (c.checkpoint_ns, c.checkpoint_id) IN (
               SELECT * FROM unnest(%(namespaces)s::text[], %(ids)s::text[]))) AS k
  JOIN transcript.checkpoint_blobs AS b
    ON b.conversation_key = %(key)s AND b.checkpoint_ns = k.checkpoint_ns
   AND b.channel = k.channel AND b.version = k.version
"""

READ_WRITES = """
SELECT w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx, w.channel, w.type, w.blob,
       w.task_path
  FROM transcript.checkpoint_writes AS w
 WHERE w.conversation_key = %(key)s
   AND (w.checkpoint_ns, w.checkpoint_id) IN (
       SELECT * FROM unnest(%(namespaces)s::text[], %(ids)s::text[]))
 ORDER BY w.task_path, w.task_id, w.idx
"""

# DeleteCheckpoints: the conversations it deletes from, locked (in key order) against
# puts and copies until it commits, so that a value it finds unnamed is not named by a
# put that stored nothing because the value was there.
LOCK_BY_RUNS = """
SELECT v.conversation_key FROM transcript.conversations AS v
 WHERE v.namespace = %(namespace)s
   AND v.conversation_key IN (SELECT c.conversation_key FROM transcript.checkpoints AS c
                               WHERE c.run_id = ANY(%(run_ids)s::text[]))
 ORDER BY v.conversation_key
   FOR UPDATE
"""

LOCK_BY_IDS = """
SELECT conversation_key FROM transcript.conversations
 WHERE namespace = %(namespace)s AND conversation_id = ANY(%(conversation_ids)s::uuid[])
 ORDER BY conversation_key
   FOR UPDATE
"""

DELETE_RUNS = """
DELETE FROM transcript.checkpoints
 WHERE conversation_key = ANY(%(keys)s::bigint[]) AND run_id = ANY(%(run_ids)s::text[])
"""

DELETE_OF_CONVERSATIONS = """
DELETE FROM transcript.checkpoints AS c
 WHERE c.conversation_key = ANY(%(keys)s::bigint[])
   AND (NOT %(keep_latest)s OR c.checkpoint_id < (
        SELECT max(m.checkpoint_id) FROM transcript.checkpoints AS m
         WHERE m.conversation_key = c.conversation_key
           AND m.checkpoint_ns = c.checkpoint_ns))
"""

# The writes and values no checkpoint of these conversations names any more (a value
# that is the base of another's delta stays while that one does: run until none goes).
DELETE_ORPHAN_WRITES = """
DELETE FROM transcript.checkpoint_writes AS w
 WHERE w.conversation_key = ANY(%(keys)s::bigint[])
   AND NOT EXISTS (SELECT 1 FROM transcript.checkpoints AS c
                    WHERE c.conversation_key = w.conversation_key
                      AND c.checkpoint_ns = w.checkpoint_ns
                      AND c.checkpoint_id = w.checkpoint_id)
"""

DELETE_ORPHAN_VALUES = """
DELETE FROM transcript.checkpoint_blobs AS b
 WHERE b.conversation_key = ANY(%(keys)s::bigint[])
   AND NOT EXISTS (SELECT 1 FROM transcript.checkpoints AS c
                    CROSS JOIN LATERAL unnest(c.channels, c.versions) AS n(channel, version)
                    WHERE c.conversation_key = b.conversation_key
                      AND c.checkpoint_ns = b.checkpoint_ns
                      AND n.channel = b.channel AND n.version = b.version)
   AND NOT EXISTS (SELECT 1 FROM transcript.checkpoint_blobs AS d
                    WHERE d.conversation_key = b.conversation_key
                      AND d.checkpoint_ns = b.checkpoint_ns
                      AND d.channel = b.channel AND d.base_version = b.version)
"""

# CopyCheckpoints: both conversations held against erasure and deletions (key order).
LOCK_PAIR = """
SELECT conversation_id, conversation_key FROM transcript.conversations
 WHERE namespace = %(namespace)s AND conversation_id IN (%(source)s, %(target)s)
 ORDER BY conversation_key
   FOR KEY SHARE
"""

COPY_CHECKPOINTS = """
INSERT INTO transcript.checkpoints
       (conversation_key, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
        checkpoint_type, checkpoint, metadata, run_id, channels, versions, create_time)
SELECT %(target)s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint_type,
       checkpoint, metadata, run_id, channels, versions, create_time
  FROM transcript.checkpoints WHERE conversation_key = %(source)s
ON CONFLICT DO NOTHING
"""

COPY_VALUES = """
INSERT INTO transcript.checkpoint_blobs
       (conversation_key, checkpoint_ns, channel, version, type, blob, full_length,
        base_version, head_length, base_offset, base_length, depth)
SELECT %(target)s, checkpoint_ns, channel, version, type, blob, full_length,
       base_version, head_length, base_offset, base_length, depth
  FROM transcript.checkpoint_blobs WHERE conversation_key = %(source)s
ON CONFLICT DO NOTHING
"""

COPY_WRITES = """
INSERT INTO transcript.checkpoint_writes
       (conversation_key, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob,
        task_path)
SELECT %(target)s, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob,
       task_path
  FROM transcript.checkpoint_writes WHERE conversation_key = %(source)s
ON CONFLICT DO NOTHING
"""

# Erasure (conversations/store.py): everything of the erased conversations and forks.
ERASE = (
    "DELETE FROM transcript.checkpoint_writes WHERE conversation_key = ANY(%s)",
    "DELETE FROM transcript.checkpoint_blobs WHERE conversation_key = ANY(%s)",
)
# Last, and apart: its row count is the erasure receipt's "checkpoints".
ERASE_CHECKPOINTS = "DELETE FROM transcript.checkpoints WHERE conversation_key = ANY(%s)"
