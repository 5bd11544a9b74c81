"""The SQL of WatchConversation (store.py): opening a stream, one wake-up's read of a
conversation in one snapshot, a page of entries, and the pulse over every
conversation a process watches.

Values always travel as bound parameters; the only interpolations are the
fragments defined here.
"""

from __future__ import annotations

from services.common.statements import statement
from services.transcript.views.statements import PREFIX_ENTRIES

# The running turns of a conversation `c`: their fencing tokens, compared only.
_RUNNING_TOKENS = """ARRAY(
    SELECT t.fencing_token FROM transcript.turns AS t
     WHERE t.conversation_key = c.conversation_key
       AND t.state = 'running' AND t.lease_until >= now()
     ORDER BY t.fencing_token)"""

# The mark is written only when it would lapse soon (opening a stream on a
# conversation this or another process watches already writes nothing), and only
# for a stream that will open: one refused for its sequence or incarnation writes
# nothing.
OPEN_WATCH = f"""
WITH c AS MATERIALIZED (
    SELECT conversation_key, version, last_sequence, incarnation, watched_until
      FROM transcript.conversations
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
), marked AS (
    UPDATE transcript.conversations AS u
       SET watched_until = now() + make_interval(secs => %(ttl_s)s)
      FROM c
     WHERE u.conversation_key = c.conversation_key
       AND (c.watched_until IS NULL
            OR c.watched_until < now() + make_interval(secs => %(renew_before_s)s))
       AND %(after)s <= c.last_sequence
       AND (%(incarnation)s = 0 OR c.incarnation = %(incarnation)s)
)
SELECT c.conversation_key, c.version, c.last_sequence, c.incarnation, now(), {_RUNNING_TOKENS}
  FROM c
"""


# A page of entries after %(after)s through `through` (an SQL expression), with the
# append (version) that wrote each: at most `limit` entries, and past the first no
# more than about `max_bytes` of content. The append of an entry is the first whose
# last_sequence reaches it (an index probe on appends_last_sequence).
def _entry_page(through: str) -> str:
    return f"""
e AS (
    SELECT sequence, role, text, tool_calls, tool_call_id, metadata, created_at,
           native_json, retracted_version, retract_time,
           octet_length(text) + coalesce(octet_length(tool_calls::text), 0)
             + coalesce(octet_length(metadata::text), 0)
             + coalesce(octet_length(native_json), 0) AS size
      FROM transcript.entries
     WHERE conversation_key = %(key)s AND sequence > %(after)s AND sequence <= {through}
     ORDER BY sequence
     LIMIT %(limit)s
), page AS (
    SELECT e.*, sum(size) OVER (ORDER BY sequence) - size AS before FROM e
), entry_rows AS (
    SELECT a.version, a.last_sequence, p.sequence, p.role, p.text, p.tool_calls,
           p.tool_call_id, p.metadata, p.created_at, p.native_json, p.retracted_version,
           p.retract_time, p.size
      FROM page AS p
     CROSS JOIN LATERAL (
           SELECT version, last_sequence FROM transcript.appends
            WHERE conversation_key = %(key)s AND last_sequence >= p.sequence
              -- not an append of no entries (state or retractions only) ending there
              AND first_sequence <= p.sequence
            ORDER BY last_sequence
            LIMIT 1) AS a
     WHERE p.before < %(max_bytes)s
)"""


READ_ENTRIES = f"""
WITH {_entry_page("%(through)s")}
SELECT * FROM entry_rows ORDER BY sequence
"""

# One wake-up of a stream in one snapshot: the counters; the running turns and what
# became of the turns the stream reported (by turn id and fencing token: index
# probes on turns and appends by their (conversation_key, turn_id / request_id)
# keys); and the first page of entries after what it delivered. Three kinds of rows
# in one result (`kind`), so that a live append costs the stream one round trip.
READ_STATE = statement(f"""
WITH c AS MATERIALIZED (
    SELECT version, last_sequence, incarnation, now() AS read_time
      FROM transcript.conversations
     WHERE conversation_key = %(key)s
), turn_rows AS (
    SELECT 'running' AS kind, t.turn_id, t.fencing_token, t.exclusive, t.create_time,
           NULL::text AS state, NULL::bigint AS row_fencing_token, NULL::text AS reason,
           NULL::bigint AS committed_version
      FROM transcript.turns AS t
     WHERE t.conversation_key = %(key)s AND t.state = 'running' AND t.lease_until >= now()
    UNION ALL
    SELECT 'traced', r.turn_id, r.fencing_token, NULL, NULL, t.state, t.fencing_token,
           t.outcome ->> 'reason', a.version
      FROM unnest(%(turn_ids)s::text[], %(fencing_tokens)s::bigint[])
           AS r(turn_id, fencing_token)
      LEFT JOIN transcript.turns AS t
             ON t.conversation_key = %(key)s AND t.turn_id = r.turn_id
      LEFT JOIN transcript.appends AS a
             ON a.conversation_key = %(key)s AND a.request_id = r.turn_id
), since AS (
    -- The version after which the stream reports retractions: the one it reached, or
    -- at its start (%(since)s < 0) the version of the append that wrote %(after)s (none
    -- before it delivers an entry: the conversation's version).
    SELECT CASE WHEN %(since)s >= 0 THEN %(since)s
                WHEN %(after)s = 0 THEN (SELECT version FROM c)
                ELSE coalesce((SELECT a.version FROM transcript.appends AS a
                                WHERE a.conversation_key = %(key)s
                                  AND a.last_sequence >= %(after)s
                                  AND a.first_sequence <= %(after)s
                                ORDER BY a.last_sequence LIMIT 1), 0) END AS version
), retracting AS (
    -- The first %(limit)s writes since then that retracted an entry already delivered
    -- (a range of the appends_retracted index: only the writes that retracted any)...
    SELECT a.version, a.commit_time, a.retracted,
           sum(cardinality(a.retracted)) OVER (ORDER BY a.version)
             - cardinality(a.retracted) AS before
      FROM transcript.appends AS a, since, c
     WHERE a.conversation_key = %(key)s AND a.version > since.version
       AND a.version <= c.version AND a.retracted IS NOT NULL
       AND (SELECT min(s) FROM unnest(a.retracted) AS s) <= %(after)s
     ORDER BY a.version
     LIMIT %(limit)s
), retraction_rows AS (
    -- ...and, past the first, no more than about %(limit)s sequences in all.
    SELECT version, commit_time, retracted FROM retracting WHERE before < %(limit)s
), {_entry_page("(SELECT last_sequence FROM c)")}
SELECT c.version, c.last_sequence, c.incarnation, c.read_time, t.*, NULL::bigint[],
       NULL::bigint, NULL::bigint, NULL::bigint, NULL::smallint, NULL::text, NULL::jsonb,
       NULL::text, NULL::jsonb, NULL::timestamptz, NULL::text, NULL::bigint,
       NULL::timestamptz, NULL::bigint
  FROM c LEFT JOIN turn_rows AS t ON true
UNION ALL
SELECT c.version, c.last_sequence, c.incarnation, c.read_time, 'retracted', NULL, NULL, NULL,
       r.commit_time, NULL, NULL, NULL, r.version, r.retracted,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
  FROM c, retraction_rows AS r
UNION ALL
SELECT c.version, c.last_sequence, c.incarnation, c.read_time, 'entry', NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, x.*
  FROM c, entry_rows AS x
""")


# Every watched conversation of a process in one statement: renew the marks that
# would lapse soon (skipping a row a writer holds: it is renewed next time, well
# before it lapses), and read the counters.
PULSE = f"""
WITH due AS (
    SELECT conversation_key FROM transcript.conversations
     WHERE conversation_key = ANY(%(keys)s::bigint[])
       AND (watched_until IS NULL
            OR watched_until < now() + make_interval(secs => %(renew_before_s)s))
       FOR NO KEY UPDATE SKIP LOCKED
), renewed AS (
    UPDATE transcript.conversations AS u
       SET watched_until = now() + make_interval(secs => %(ttl_s)s)
      FROM due
     WHERE u.conversation_key = due.conversation_key
)
SELECT c.conversation_key, c.version, c.last_sequence, c.incarnation, now(), {_RUNNING_TOKENS}
  FROM transcript.conversations AS c
 WHERE c.conversation_key = ANY(%(keys)s::bigint[])
"""


# A fork's shared prefix (its lineage's rows): a page as READ_ENTRIES reads one, from
# the pieces of views/statements.PREFIX_ENTRIES.
READ_PREFIX = f"""
WITH e AS ({PREFIX_ENTRIES}
), page AS (
    SELECT e.*, sum(size) OVER (ORDER BY sequence) - size AS before FROM e
)
SELECT version, append_last, sequence, role, text, tool_calls, tool_call_id, metadata,
       created_at, native_json, retracted_version, retract_time, size
  FROM page
 WHERE before < %(max_bytes)s
 ORDER BY sequence
"""

# A conversation's shared prefix (NULL: no fork), which never changes.
PREFIX = """
SELECT prefix_keys, prefix_through, prefix_versions FROM transcript.conversations
 WHERE conversation_key = %(key)s
"""
