"""The SQL of the transcript store (store.py): conversations, appends (with the state
documents and retractions a write changes) and views. The turn leases' statements
are in lease_statements.py; the feed's in feed_store.py.

Values always travel as bound parameters; the only interpolations are the
column lists and subqueries defined here.
"""

from __future__ import annotations

from services.common.statements import statement

CONVERSATION_COLUMNS = (
    "conversation_id, namespace, version, last_sequence, create_time, update_time, labels, "
    "incarnation, user_id, state::text"
)
# The same without the state (CONVERSATION_VIEW_BASIC listings): '' in its place.
CONVERSATION_BASIC_COLUMNS = (
    "conversation_id, namespace, version, last_sequence, create_time, update_time, labels, "
    "incarnation, user_id, ''"
)

ENTRY_COLUMNS = (
    "e.sequence, e.role, e.text, e.tool_calls, e.tool_call_id, e.metadata, e.created_at, "
    "e.native_json, e.retracted_version, e.retract_time"
)

# The state a write would leave in a user's (user_id = the conversation's) or the
# namespace's (user_id '') document: its current one with the delta's keys replaced.
_SCOPED_AFTER = """(coalesce((SELECT s.state FROM transcript.scoped_states AS s
                  WHERE s.namespace = %(namespace)s AND s.user_id = {user}), '{{}}'::jsonb)
         || %({delta})s::jsonb)"""
USER_STATE_AFTER = _SCOPED_AFTER.format(user="c.user_id", delta="user_state")
NAMESPACE_STATE_AFTER = _SCOPED_AFTER.format(user="''", delta="namespace_state")

# Whether every sequence a write retracts names a standing entry without tool calls
# or a tool result (role 3) of conversation `c`.
RETRACTABLE = """(%(retract)s::bigint[] IS NULL OR cardinality(%(retract)s::bigint[]) = (
    SELECT count(*) FROM transcript.entries AS r
     WHERE r.conversation_key = c.conversation_key
       AND r.sequence = ANY(%(retract)s::bigint[])
       AND r.retracted_version IS NULL AND r.role <> 3 AND r.tool_calls IS NULL))"""

# Whether each state document the write changes stays within its limit.
STATE_FITS = f"""(%(conversation_state)s::jsonb IS NULL
       OR octet_length((c.state || %(conversation_state)s::jsonb)::text) <= %(max_state_bytes)s)
   AND (%(user_state)s::jsonb IS NULL
       OR octet_length({USER_STATE_AFTER}::text) <= %(max_state_bytes)s)
   AND (%(namespace_state)s::jsonb IS NULL
       OR octet_length({NAMESPACE_STATE_AFTER}::text) <= %(max_state_bytes)s)"""

# Adds a write's delta to a user's or the namespace's document (made at version 1).
_UPSERT_SCOPED = """
    INSERT INTO transcript.scoped_states AS s (namespace, user_id, state, version, update_time)
    SELECT %(namespace)s, {user}, %({delta})s::jsonb, 1, b.update_time
      FROM {source} AS b
     WHERE %({delta})s::jsonb IS NOT NULL
    ON CONFLICT (namespace, user_id) DO UPDATE
       SET state = s.state || excluded.state, version = s.version + 1,
           update_time = excluded.update_time
    RETURNING s.version"""

# The conversation key as a scalar subquery: keeps every entry, append and turn lookup
# an index scan on the child table's primary key (store.py uses it too).
KEY = """(SELECT conversation_key FROM transcript.conversations
          WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s)"""

# Whether a replica watches the conversation (WatchConversation): its writes then NOTIFY.
WATCHED = "coalesce(watched_until >= now(), false) AS watched"


APPEND = statement(f"""
WITH lease AS (
    -- The turn lease the append commits under, locked: an UPDATE of the row by a
    -- takeover that committed meanwhile is seen here, not an older snapshot.
    SELECT t.turn_id FROM transcript.turns AS t
     WHERE t.conversation_key = (SELECT conversation_key FROM transcript.conversations
                                  WHERE namespace = %(namespace)s
                                    AND conversation_id = %(conversation_id)s)
       AND t.turn_id = %(request_id)s AND t.ticket = %(fencing_token)s::bigint
       AND t.state = 'running' AND t.lease_until >= now()
       FOR UPDATE
), bumped AS (
    UPDATE transcript.conversations AS c
       SET version = version + 1,
           last_sequence = last_sequence + %(count)s,
           update_time = now(),
           state = CASE WHEN %(conversation_state)s::jsonb IS NULL THEN state
                        ELSE state || %(conversation_state)s::jsonb END,
           provisional_turn_id = NULL,
           lease_turn_id = CASE WHEN lease_token = %(fencing_token)s::bigint
                                THEN NULL ELSE lease_turn_id END,
           lease_until = CASE WHEN lease_token = %(fencing_token)s::bigint
                              THEN NULL ELSE lease_until END,
           lease_token = CASE WHEN lease_token = %(fencing_token)s::bigint
                              THEN NULL ELSE lease_token END
     WHERE namespace = %(namespace)s
       AND conversation_id = %(conversation_id)s
       AND (%(expected_version)s::bigint IS NULL OR version = %(expected_version)s::bigint)
       -- No other turn holds the conversation exclusively (re-checked on the newest
       -- row version when a lease was granted while this statement waited).
       AND (lease_until IS NULL OR lease_until < now() OR lease_token = %(fencing_token)s::bigint)
       AND (%(fencing_token)s::bigint IS NULL OR EXISTS (SELECT 1 FROM lease))
       -- A change of the user's state needs a user; retractions name standing
       -- entries; every changed state document stays within its limit.
       AND (%(user_state)s::jsonb IS NULL OR c.user_id IS NOT NULL)
       AND {RETRACTABLE}
       AND {STATE_FITS}
 RETURNING c.conversation_key, c.version, c.last_sequence, c.update_time, c.user_id,
           coalesce(c.watched_until >= now(), false) AS watched
), finished AS (
    -- The commit ends the turn's lease. The row stays a while (the sweep removes it):
    -- it keeps a one-statement grant whose snapshot predates this commit (and so does
    -- not see the append below) from granting the committed turn id again.
    UPDATE transcript.turns AS t
       SET state = 'committed', lease_until = now() + interval '1 minute'
      FROM bumped AS b
     WHERE t.conversation_key = b.conversation_key AND t.turn_id = %(request_id)s
       AND %(fencing_token)s::bigint IS NOT NULL
), recorded AS (
    INSERT INTO transcript.appends
           (conversation_key, version, first_sequence, last_sequence, request_id,
            payload_hash, input_tokens, output_tokens, model_calls, commit_time, retracted)
    SELECT conversation_key, version, last_sequence - %(count)s + 1, last_sequence,
           %(request_id)s, %(payload_hash)s, %(input_tokens)s, %(output_tokens)s,
           %(model_calls)s, update_time, %(retract)s::bigint[]
      FROM bumped
), written AS (
    INSERT INTO transcript.entries
           (conversation_key, sequence, role, text, tool_calls, tool_call_id, metadata,
            created_at, native_json)
    SELECT b.conversation_key, b.last_sequence - %(count)s + m.ord, m.role, m.text,
           NULLIF(m.tool_calls, '[]'), NULLIF(m.tool_call_id, ''), NULLIF(m.metadata, '{{}}'),
           b.update_time, m.native_json
      FROM bumped AS b,
           ROWS FROM (jsonb_to_recordset(%(messages)s::jsonb)
                      AS (role smallint, text text, tool_calls jsonb, tool_call_id text,
                          metadata jsonb, native_json text))
               WITH ORDINALITY AS m(role, text, tool_calls, tool_call_id, metadata, native_json,
                                    ord)
), retracted AS (
    UPDATE transcript.entries AS e
       SET retracted_version = b.version, retract_time = b.update_time
      FROM bumped AS b
     WHERE e.conversation_key = b.conversation_key
       AND e.sequence = ANY(%(retract)s::bigint[]) AND e.retracted_version IS NULL
), user_state AS ({_UPSERT_SCOPED.format(user="b.user_id", delta="user_state", source="bumped")}
), namespace_state AS ({_UPSERT_SCOPED.format(user="''", delta="namespace_state", source="bumped")}
)
SELECT version, last_sequence, update_time,
       (SELECT version FROM user_state), (SELECT version FROM namespace_state),
       conversation_key, watched
  FROM bumped
""")


# Why an append wrote nothing: the version, a prior append of the request id, the
# exclusive lease holder, and whether the quoted lease is still held.
WHY_NOT_APPENDED = f"""
SELECT c.version, a.version, a.first_sequence, a.last_sequence, a.input_tokens,
       a.output_tokens, a.model_calls, a.commit_time, a.payload_hash,
       c.lease_turn_id, coalesce(c.lease_until >= now(), false), c.lease_token,
       EXISTS (SELECT 1 FROM transcript.turns AS t
                WHERE t.conversation_key = c.conversation_key
                  AND t.turn_id = %(request_id)s AND t.ticket = %(fencing_token)s::bigint
                  AND t.state = 'running' AND t.lease_until >= now()),
       c.user_id IS NULL,
       -- The first retracted sequence that names no standing, retractable entry.
       (SELECT min(q) FROM unnest(%(retract)s::bigint[]) AS q
         WHERE NOT EXISTS (SELECT 1 FROM transcript.entries AS r
                            WHERE r.conversation_key = c.conversation_key AND r.sequence = q
                              AND r.retracted_version IS NULL AND r.role <> 3
                              AND r.tool_calls IS NULL)),
       %(conversation_state)s::jsonb IS NOT NULL
           AND octet_length((c.state || %(conversation_state)s::jsonb)::text)
               > %(max_state_bytes)s,
       %(user_state)s::jsonb IS NOT NULL AND c.user_id IS NOT NULL
           AND octet_length({USER_STATE_AFTER}::text) > %(max_state_bytes)s,
       %(namespace_state)s::jsonb IS NOT NULL
           AND octet_length({NAMESPACE_STATE_AFTER}::text) > %(max_state_bytes)s
  FROM transcript.conversations AS c
  LEFT JOIN LATERAL (
        SELECT * FROM transcript.appends AS a
         WHERE a.conversation_key = c.conversation_key AND a.request_id = %(request_id)s
  ) AS a ON true
 WHERE c.namespace = %(namespace)s AND c.conversation_id = %(conversation_id)s
"""


# Entries of a conversation in two sequence ranges (the window and the summary
# buffer; an empty range when they merged). The conversation key is an InitPlan
# parameter, so each range is an index range scan on the (conversation_key,
# sequence) primary key: the cost is the number of entries returned, whatever
# the transcript's length (tests/integration checks the plan).
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
# returned, whatever the transcript's length (tests/integration checks the plan).
VIEW_SQL = f"""
WITH c AS MATERIALIZED (
    SELECT conversation_key, version, last_sequence, incarnation,
           greatest(1, last_sequence - %(window)s + 1) AS low,
           conversation_id, namespace, create_time, update_time, labels, user_id,
           state::text AS state_text
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
       c.update_time, c.labels, c.incarnation, c.user_id, c.state_text
  FROM c LEFT JOIN a ON true LEFT JOIN e ON true
 ORDER BY e.sequence
"""


# A conversation with its initial state, and the changes of its user's and the
# namespace's state, in one statement: nothing is written when it exists (or a
# changed document would exceed its limit: CREATED_STATE_TOO_LARGE tells which).
CREATE_CONVERSATION = f"""
WITH created AS (
    INSERT INTO transcript.conversations AS c
           (namespace, conversation_id, labels, user_id, state)
    SELECT %(namespace)s, %(conversation_id)s, %(labels)s, %(user_id)s,
           coalesce(%(conversation_state)s::jsonb, '{{}}')
     WHERE (%(user_state)s::jsonb IS NULL
            OR octet_length({_SCOPED_AFTER.format(user="%(user_id)s", delta="user_state")}::text)
               <= %(max_state_bytes)s)
       AND (%(namespace_state)s::jsonb IS NULL
            OR octet_length({NAMESPACE_STATE_AFTER}::text) <= %(max_state_bytes)s)
    ON CONFLICT (namespace, conversation_id) DO NOTHING
    RETURNING {CONVERSATION_COLUMNS}
), user_state AS ({_UPSERT_SCOPED.format(user="%(user_id)s", delta="user_state", source="created")}
), namespace_state AS ({_UPSERT_SCOPED.format(user="''", delta="namespace_state", source="created")}
)
SELECT {CONVERSATION_COLUMNS} FROM created
"""


CREATED_STATE_TOO_LARGE = f"""
SELECT %(user_state)s::jsonb IS NOT NULL
           AND octet_length({_SCOPED_AFTER.format(user="%(user_id)s", delta="user_state")}::text)
               > %(max_state_bytes)s,
       %(namespace_state)s::jsonb IS NOT NULL
           AND octet_length({NAMESPACE_STATE_AFTER}::text) > %(max_state_bytes)s
"""
