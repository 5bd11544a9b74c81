"""The SQL of the reads of entries (store.py): a turn's view in one statement, the
ranges of entries around a tool call group, and a page of entries.

Values always travel as bound parameters; the only interpolations are the
column lists and subqueries defined here and in conversations/statements.py.
"""

from __future__ import annotations

from services.transcript.conversations.statements import FORK_COLUMNS

ENTRY_COLUMNS = (
    "e.sequence, e.role, e.text, e.tool_calls, e.tool_call_id, e.metadata, e.created_at, "
    "e.native_json, e.retracted_version, e.retract_time"
)


# Entries of a conversation in two sequence ranges (the window and the summary
# buffer; an empty range when they merged), with the shared prefix of a fork (whose
# entries lie in other conversations' rows: read by PREFIX_ENTRIES). Each range is an
# index range scan on the (conversation_key, sequence) primary key: the cost is the
# number of entries returned, whatever the transcript's length.
VIEW_ENTRIES_SQL = f"""
WITH c AS MATERIALIZED (
    SELECT conversation_key, prefix_keys, prefix_through, prefix_versions
      FROM transcript.conversations
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
)
SELECT c.conversation_key, c.prefix_keys, c.prefix_through, c.prefix_versions, e.*
  FROM c LEFT JOIN LATERAL (
        SELECT {ENTRY_COLUMNS}
          FROM transcript.entries AS e
         WHERE e.conversation_key = c.conversation_key
           AND e.sequence BETWEEN %(low1)s AND %(high1)s
        UNION ALL
        SELECT {ENTRY_COLUMNS}
          FROM transcript.entries AS e
         WHERE e.conversation_key = c.conversation_key
           AND e.sequence BETWEEN %(low2)s AND %(high2)s) AS e ON true
 ORDER BY e.sequence
"""


# Everything a view needs in ONE statement and one snapshot: the counters, the
# prior append of a request id, and the two ranges of model.view_ranges (the
# window [low, last] and the naive summary buffer [through + 1, min(through +
# batch + 1, low - 1)]), computed here from the `last` this statement reads. The conversation row
# is an InitPlan, so each entry range is an index range scan on the
# (conversation_key, sequence) primary key: the cost is the number of entries
# returned, whatever the transcript's length (tests/transcript/views/test_views_store.py
# checks the plan).
VIEW_SQL = f"""
WITH c AS MATERIALIZED (
    SELECT conversation_key, version, last_sequence, incarnation,
           greatest(1, last_sequence - %(window)s + 1) AS low,
           conversation_id, namespace, create_time, update_time, labels, user_id,
           state::text AS state_text, curated_through, {FORK_COLUMNS}
      FROM transcript.conversations
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
), a AS MATERIALIZED (
    SELECT version, first_sequence, last_sequence, input_tokens, output_tokens, model_calls,
           commit_time, payload_hash
      FROM transcript.appends
     WHERE conversation_key = (SELECT conversation_key FROM c)
       AND request_id = %(request_id)s
), e AS (
    SELECT {ENTRY_COLUMNS}
      FROM transcript.entries AS e
     WHERE e.conversation_key = (SELECT conversation_key FROM c)
       AND e.sequence BETWEEN (SELECT low FROM c) AND (SELECT last_sequence FROM c)
    UNION ALL
    SELECT {ENTRY_COLUMNS}
      FROM transcript.entries AS e
     WHERE e.conversation_key = (SELECT conversation_key FROM c)
       AND e.sequence BETWEEN %(through)s + 1
                          AND least(%(through)s + %(batch)s + 1, (SELECT low FROM c) - 1)
)
SELECT c.version, c.last_sequence, c.incarnation, a.*, e.*,
       c.conversation_id, c.namespace, c.version, c.last_sequence, c.create_time,
       c.update_time, c.labels, c.incarnation, c.user_id, c.state_text, c.curated_through,
       c.fork_origin_id, c.fork_through, c.prefix_keys, c.prefix_through, c.prefix_versions,
       c.head_digest, c.conversation_key
  FROM c LEFT JOIN a ON true LEFT JOIN e ON true
 ORDER BY e.sequence
"""


# A page of entries after a sequence, through another (a range scan of the primary key),
# after the conversation's shared prefix when it is a fork (NULL when it is none; no row
# when the conversation does not exist).
LIST_ENTRIES = f"""
WITH c AS MATERIALIZED (
    SELECT conversation_key, prefix_keys, prefix_through, prefix_versions
      FROM transcript.conversations
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
)
SELECT c.prefix_keys, c.prefix_through, c.prefix_versions, e.*
  FROM c LEFT JOIN LATERAL (
        SELECT {ENTRY_COLUMNS}
          FROM transcript.entries AS e
         WHERE e.conversation_key = c.conversation_key
           AND e.sequence > %(after)s AND e.sequence <= %(through)s
         ORDER BY e.sequence
         LIMIT %(limit)s) AS e ON true
 ORDER BY e.sequence
"""


# The entries of a fork's shared prefix in pieces (key, low, high, cap): each piece a
# range scan of the primary key of the conversation holding it; a retraction counts only
# when its version is at most the piece's cap (what the source retracted after the fork
# point is not the fork's). With the append that wrote each entry: the holder's, at most
# the cap (one ending inside the segment: a probe of appends_last_sequence), else the next
# holder's (the fork append of the next segment, or of the fork
# itself, which holds the entries its fork point cut from an append).
PREFIX_ENTRIES = """
SELECT coalesce(a.version, f.version) AS version,
       coalesce(a.last_sequence, f.last_sequence) AS append_last,
       e.sequence, e.role, e.text, e.tool_calls, e.tool_call_id, e.metadata, e.created_at,
       e.native_json,
       CASE WHEN e.retracted_version <= p.cap THEN e.retracted_version END
           AS retracted_version,
       CASE WHEN e.retracted_version <= p.cap THEN e.retract_time END AS retract_time,
       octet_length(e.text) + coalesce(octet_length(e.tool_calls::text), 0)
         + coalesce(octet_length(e.metadata::text), 0)
         + coalesce(octet_length(e.native_json), 0) AS size
  FROM unnest(%(keys)s::bigint[], %(lows)s::bigint[], %(highs)s::bigint[],
              %(caps)s::bigint[], %(ends)s::bigint[], %(next_keys)s::bigint[])
           AS p(key, low, high, cap, seg_end, next_key)
 CROSS JOIN LATERAL (
        SELECT * FROM transcript.entries AS e
         WHERE e.conversation_key = p.key AND e.sequence BETWEEN p.low AND p.high
         ORDER BY e.sequence
         LIMIT %(limit)s) AS e
  LEFT JOIN LATERAL (
        SELECT version, last_sequence FROM transcript.appends
         WHERE %(with_versions)s AND conversation_key = p.key AND version <= p.cap
           AND last_sequence BETWEEN e.sequence AND p.seg_end
           AND first_sequence <= e.sequence
         ORDER BY last_sequence
         LIMIT 1) AS a ON true
  LEFT JOIN LATERAL (
        SELECT version, last_sequence FROM transcript.appends
         WHERE %(with_versions)s AND a.version IS NULL AND conversation_key = p.next_key
           AND last_sequence >= e.sequence AND first_sequence <= e.sequence
         ORDER BY last_sequence
         LIMIT 1) AS f ON true
 ORDER BY e.sequence
 LIMIT %(limit)s
"""


# A page of the entries that writes after a version retracted: the writes found through
# appends_retracted (only those that retracted anything, after the version), their
# sequences looked up by the entries' primary key. The cost grows with those writes and
# the entries returned, never with the transcript's length.
LIST_RETRACTED_ENTRIES = f"""
WITH c AS MATERIALIZED (
    SELECT conversation_key, prefix_keys, prefix_through, prefix_versions
      FROM transcript.conversations
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
), s AS (
    SELECT DISTINCT unnest(a.retracted) AS sequence
      FROM transcript.appends AS a
     WHERE a.conversation_key = (SELECT conversation_key FROM c)
       AND a.version > %(retracted_after)s AND a.retracted IS NOT NULL
)
SELECT c.prefix_keys, c.prefix_through, c.prefix_versions, e.*
  FROM c LEFT JOIN LATERAL (
        SELECT {ENTRY_COLUMNS}
          FROM transcript.entries AS e JOIN s USING (sequence)
         WHERE e.conversation_key = c.conversation_key
           AND e.sequence > %(after)s AND e.sequence <= %(through)s
         ORDER BY e.sequence
         LIMIT %(limit)s) AS e ON true
 ORDER BY e.sequence
"""
