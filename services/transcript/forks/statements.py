"""The SQL of ForkConversation (store.py): the replay of a fork's request id, the source
held against erasure while its fork is made, the fork point's version and state, and the
fork with its fork append. Every read is an index probe: a fork's cost does not grow
with the prefix it shares.

Values always travel as bound parameters; the only interpolations are the column lists
defined in conversations/statements.py.
"""

from __future__ import annotations

from services.transcript.conversations.statements import CONVERSATION_COLUMNS

_FORK_COLUMNS = ", ".join(f"f.{column.strip()}" for column in CONVERSATION_COLUMNS.split(","))

# The fork a request id of a source made, and what it asked for.
REPLAY = f"""
SELECT {_FORK_COLUMNS}, f.fork_payload_hash
  FROM transcript.conversations AS s
  JOIN transcript.conversations AS f
    ON f.fork_source_key = s.conversation_key AND f.fork_request_id = %(request_id)s
 WHERE s.namespace = %(namespace)s AND s.conversation_id = %(source_id)s
"""

# The source, held until the fork commits: its erasure (a DELETE of this row) waits, and
# then finds the fork and erases it too.
SOURCE = """
SELECT conversation_key, last_sequence, labels, user_id, prefix_keys, prefix_through,
       prefix_versions
  FROM transcript.conversations
 WHERE namespace = %(namespace)s AND conversation_id = %(source_id)s
   FOR KEY SHARE
"""

# The last append of one segment of the lineage whose entries all lie at or before the
# fork point: the newest (version) of those ending at the latest sequence at or before it
# (two probes of appends_last_sequence).
FORK_POINT = """
SELECT version, last_sequence, digest FROM transcript.appends
 WHERE conversation_key = %(key)s AND version <= %(cap)s
   AND last_sequence = (SELECT max(last_sequence) FROM transcript.appends
                         WHERE conversation_key = %(key)s AND version <= %(cap)s
                           AND last_sequence <= %(through)s)
 ORDER BY version DESC
 LIMIT 1
"""

# The state after the newest write of one segment, at most the fork point's version, that
# changed it (a probe of appends_state).
STATE_AT = """
SELECT state::text FROM transcript.appends
 WHERE conversation_key = %(key)s AND version <= %(cap)s AND state IS NOT NULL
 ORDER BY version DESC
 LIMIT 1
"""

INITIAL_STATE = """
SELECT coalesce(initial_state, '{}'::jsonb)::text FROM transcript.conversations
 WHERE conversation_key = %(key)s
"""

# The fork, unless its id exists, and its fork append (version: the fork point's + 1).
CREATE_FORK = f"""
WITH created AS (
    INSERT INTO transcript.conversations AS c
           (namespace, conversation_id, labels, user_id, state, initial_state, version,
            last_sequence, fork_origin_id, fork_through, fork_source_key, prefix_keys,
            prefix_through, prefix_versions, fork_request_id, fork_payload_hash, head_digest)
    VALUES (%(namespace)s, %(conversation_id)s, %(labels)s, %(user_id)s, %(state)s::jsonb,
            %(state)s::jsonb, %(version)s + 1, %(through)s, %(source_id)s, %(through)s,
            %(source_key)s, %(prefix_keys)s, %(prefix_through)s, %(prefix_versions)s,
            %(request_id)s, %(payload_hash)s,
            -- The fork's chain goes on from the source's digest at the fork point.
            sha256(%(previous)s::bytea || int8send(%(version)s + 1) || int8send(%(cut_from)s)
                   || int8send(%(through)s)
                   || int8send((extract(epoch FROM now()) * 1000000)::bigint)
                   || %(digest_body)s::bytea))
    ON CONFLICT (namespace, conversation_id) DO NOTHING
    RETURNING {CONVERSATION_COLUMNS}, conversation_key, update_time AS commit_time,
              head_digest AS digest
), recorded AS (
    INSERT INTO transcript.appends
           (conversation_key, version, first_sequence, last_sequence, payload_hash,
            commit_time, state, digest)
    SELECT conversation_key, %(version)s + 1, %(cut_from)s, %(through)s, %(payload_hash)s,
           commit_time, %(state)s::jsonb, digest
      FROM created
)
SELECT {CONVERSATION_COLUMNS} FROM created
"""

# A page of the forks of a conversation and theirs (ListForks): an index probe of
# conversations_forks per fork of the tree, then the page after the cursor in key order.
# A fork's key is larger than its source's (an identity, and the source existed first),
# so key order puts a fork before its own forks. The walk cannot start at the cursor (a
# fork made later may hang below an early one): a page costs a probe per fork of the
# tree; its reply is at most `limit` rows.
LIST_FORKS = """
WITH RECURSIVE tree (conversation_key, conversation_id, incarnation, source_id, through) AS (
    SELECT f.conversation_key, f.conversation_id, f.incarnation, s.conversation_id,
           f.fork_through
      FROM transcript.conversations AS s
      JOIN transcript.conversations AS f ON f.fork_source_key = s.conversation_key
     WHERE s.namespace = %(namespace)s AND s.conversation_id = %(conversation_id)s
    UNION ALL
    SELECT f.conversation_key, f.conversation_id, f.incarnation, t.conversation_id,
           f.fork_through
      FROM tree AS t
      JOIN transcript.conversations AS f ON f.fork_source_key = t.conversation_key
)
SELECT conversation_id, incarnation, source_id, through, conversation_key FROM tree
 WHERE conversation_key > %(after_key)s
 ORDER BY conversation_key
 LIMIT %(limit)s
"""
