"""The SQL of AppendEntries (store.py): the one statement of an append (with the state
documents and retractions a write changes, under a turn lease when it quotes one), and
the read of why an append wrote nothing.

Values always travel as bound parameters; the only interpolations are the
fragments defined here and in conversations/statements.py.
"""

from __future__ import annotations

from services.common.statements import statement
from services.transcript.conversations.statements import (
    NAMESPACE_STATE_AFTER,
    UPSERT_SCOPED,
    USER_STATE_AFTER,
)
from services.transcript.digests.statements import GENESIS

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


APPEND = statement(f"""
WITH locked AS (
    -- The conversation first, then the turn: the order every lease decision takes
    -- them in (services/transcript/leases/store.py), so that an append and a lease
    -- decision never wait for each other in a circle.
    SELECT conversation_key FROM transcript.conversations
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
       AND %(fencing_token)s::bigint IS NOT NULL
       FOR NO KEY UPDATE
), lease AS (
    -- The turn lease the append commits under, locked: an UPDATE of the row by a
    -- takeover that committed meanwhile is seen here, not an older snapshot.
    SELECT t.turn_id FROM transcript.turns AS t
     WHERE t.conversation_key = (SELECT conversation_key FROM locked)
       AND t.turn_id = %(request_id)s AND t.fencing_token = %(fencing_token)s::bigint
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
           -- The digest chain (digests/model.py): the previous digest, this append's header
           -- (version, sequences, commit time in microseconds) and its body (retractions
           -- and messages, encoded by the service).
           head_digest = CASE WHEN %(digest_body)s::bytea IS NULL THEN head_digest
                              ELSE sha256(coalesce(head_digest, {GENESIS})
                                          || int8send(version + 1)
                                          || int8send(last_sequence + 1)
                                          || int8send(last_sequence + %(count)s)
                                          || int8send((extract(epoch FROM now()) * 1000000)::bigint)
                                          || %(digest_body)s::bytea) END,
           lease_turn_id = CASE WHEN lease_fencing_token = %(fencing_token)s::bigint
                                THEN NULL ELSE lease_turn_id END,
           lease_until = CASE WHEN lease_fencing_token = %(fencing_token)s::bigint
                              THEN NULL ELSE lease_until END,
           lease_fencing_token = CASE WHEN lease_fencing_token = %(fencing_token)s::bigint
                                      THEN NULL ELSE lease_fencing_token END
     WHERE namespace = %(namespace)s
       AND conversation_id = %(conversation_id)s
       AND (%(expected_version)s::bigint IS NULL OR version = %(expected_version)s::bigint)
       -- No other turn holds the conversation exclusively (re-checked on the newest
       -- row version when a lease was granted while this statement waited).
       AND (lease_until IS NULL OR lease_until < now()
            OR lease_fencing_token = %(fencing_token)s::bigint)
       AND (%(fencing_token)s::bigint IS NULL OR EXISTS (SELECT 1 FROM lease))
       -- A change of the user's state needs a user; retractions name standing
       -- entries; every changed state document stays within its limit.
       AND (%(user_state)s::jsonb IS NULL OR c.user_id IS NOT NULL)
       AND {RETRACTABLE}
       AND {STATE_FITS}
 RETURNING c.conversation_key, c.version, c.last_sequence, c.update_time, c.user_id,
           coalesce(c.watched_until >= now(), false) AS watched,
           -- The state after a write that changed it, kept on its append record: a fork
           -- copies the state as it was at its fork point (forks/).
           CASE WHEN %(conversation_state)s::jsonb IS NOT NULL THEN c.state END AS state_after,
           CASE WHEN %(digest_body)s::bytea IS NOT NULL THEN c.head_digest END AS digest
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
            payload_hash, input_tokens, output_tokens, model_calls, commit_time, retracted,
            state, digest)
    SELECT conversation_key, version, last_sequence - %(count)s + 1, last_sequence,
           %(request_id)s, %(payload_hash)s, %(input_tokens)s, %(output_tokens)s,
           %(model_calls)s, update_time, %(retract)s::bigint[], state_after, digest
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
), user_state AS ({UPSERT_SCOPED.format(user="b.user_id", delta="user_state", source="bumped")}
), namespace_state AS ({UPSERT_SCOPED.format(user="''", delta="namespace_state", source="bumped")}
)
SELECT version, last_sequence, update_time,
       (SELECT version FROM user_state), (SELECT version FROM namespace_state),
       conversation_key, watched, digest
  FROM bumped
""")


# Why an append wrote nothing: the version, a prior append of the request id, the
# exclusive lease holder, and whether the quoted lease is still held.
WHY_NOT_APPENDED = f"""
SELECT c.version, a.version, a.first_sequence, a.last_sequence, a.input_tokens,
       a.output_tokens, a.model_calls, a.commit_time, a.payload_hash,
       c.lease_turn_id, coalesce(c.lease_until >= now(), false), c.lease_fencing_token,
       EXISTS (SELECT 1 FROM transcript.turns AS t
                WHERE t.conversation_key = c.conversation_key
                  AND t.turn_id = %(request_id)s AND t.fencing_token = %(fencing_token)s::bigint
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
           AND octet_length({NAMESPACE_STATE_AFTER}::text) > %(max_state_bytes)s,
       a.digest
  FROM transcript.conversations AS c
  LEFT JOIN LATERAL (
        SELECT * FROM transcript.appends AS a
         WHERE a.conversation_key = c.conversation_key AND a.request_id = %(request_id)s
  ) AS a ON true
 WHERE c.namespace = %(namespace)s AND c.conversation_id = %(conversation_id)s
"""
