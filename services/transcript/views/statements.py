"""The SQL of the reads of entries (store.py): a turn's view in one statement, the
ranges of entries around a tool call group, and a page of entries.

Values always travel as bound parameters; the only interpolations are the
column lists and subqueries defined here and in conversations/statements.py.
"""

from __future__ import annotations

from services.transcript.conversations.statements import KEY

ENTRY_COLUMNS = (
    "e.sequence, e.role, e.text, e.tool_calls, e.tool_call_id, e.metadata, e.created_at, "
    "e.native_json, e.retracted_version, e.retract_time"
)


# Entries of a conversation in two sequence ranges (the window and the summary
# buffer; an empty range when they merged). The conversation key is an InitPlan
# parameter, so each range is an index range scan on the (conversation_key,
# sequence) primary key: the cost is the number of entries returned, whatever
# the transcript's length (tests/transcript/views/test_views_store.py checks the plan).
VIEW_ENTRIES_SQL = f"""
WITH c AS MATERIALIZED (
    SELECT conversation_key FROM transcript.conversations
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
)
SELECT {ENTRY_COLUMNS}
  FROM transcript.entries AS e
 WHERE e.conversation_key = (SELECT conversation_key FROM c)
   AND e.sequence BETWEEN %(low1)s AND %(high1)s
UNION ALL
SELECT {ENTRY_COLUMNS}
  FROM transcript.entries AS e
 WHERE e.conversation_key = (SELECT conversation_key FROM c)
   AND e.sequence BETWEEN %(low2)s AND %(high2)s
 ORDER BY 1
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
           state::text AS state_text, curated_through
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
       c.update_time, c.labels, c.incarnation, c.user_id, c.state_text, c.curated_through
  FROM c LEFT JOIN a ON true LEFT JOIN e ON true
 ORDER BY e.sequence
"""


# A page of entries after a sequence, through another (a range scan of the primary key).
LIST_ENTRIES = f"""
SELECT {ENTRY_COLUMNS}
  FROM transcript.entries AS e
 WHERE e.conversation_key = {KEY}
   AND e.sequence > %(after)s AND e.sequence <= %(through)s
 ORDER BY e.sequence
 LIMIT %(limit)s
"""


# A page of the entries that writes after a version retracted: the writes found through
# appends_retracted (only those that retracted anything, after the version), their
# sequences looked up by the entries' primary key. The cost grows with those writes and
# the entries returned, never with the transcript's length.
LIST_RETRACTED_ENTRIES = f"""
WITH c AS MATERIALIZED ({KEY.strip()[1:-1]}
), s AS (
    SELECT DISTINCT unnest(a.retracted) AS sequence
      FROM transcript.appends AS a
     WHERE a.conversation_key = (SELECT conversation_key FROM c)
       AND a.version > %(retracted_after)s AND a.retracted IS NOT NULL
)
SELECT {ENTRY_COLUMNS}
  FROM transcript.entries AS e JOIN s USING (sequence)
 WHERE e.conversation_key = (SELECT conversation_key FROM c)
   AND e.sequence > %(after)s AND e.sequence <= %(through)s
 ORDER BY e.sequence
 LIMIT %(limit)s
"""
