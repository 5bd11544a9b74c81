"""The SQL of conversations (store.py): creating one with its initial state, and the
fragments every feature's statements share: the conversation key of a (namespace, id),
whether a replica watches it, and the state a write leaves in a user's or the
namespace's document.

Values always travel as bound parameters; the only interpolations are the
column lists and subqueries defined here.
"""

from __future__ import annotations

# A fork's origin and shared prefix (migration 0011), after the other columns.
FORK_COLUMNS = (
    "fork_origin_id, fork_through, prefix_keys, prefix_through, prefix_versions, head_digest"
)
CONVERSATION_COLUMNS = (
    "conversation_id, namespace, version, last_sequence, create_time, update_time, labels, "
    f"incarnation, user_id, state::text, {FORK_COLUMNS}"
)
# The same without the state (CONVERSATION_VIEW_BASIC listings): '' in its place.
CONVERSATION_BASIC_COLUMNS = (
    "conversation_id, namespace, version, last_sequence, create_time, update_time, labels, "
    f"incarnation, user_id, '', {FORK_COLUMNS}"
)

# The state a write would leave in a user's (user_id = the conversation's) or the
# namespace's (user_id '') document: its current one with the delta's keys replaced.
SCOPED_AFTER = """(coalesce((SELECT s.state FROM transcript.scoped_states AS s
                  WHERE s.namespace = %(namespace)s AND s.user_id = {user}), '{{}}'::jsonb)
         || %({delta})s::jsonb)"""
USER_STATE_AFTER = SCOPED_AFTER.format(user="c.user_id", delta="user_state")
NAMESPACE_STATE_AFTER = SCOPED_AFTER.format(user="''", delta="namespace_state")

# Adds a write's delta to a user's or the namespace's document (made at version 1).
UPSERT_SCOPED = """
    INSERT INTO transcript.scoped_states AS s (namespace, user_id, state, version, update_time)
    SELECT %(namespace)s, {user}, %({delta})s::jsonb, 1, b.update_time
      FROM {source} AS b
     WHERE %({delta})s::jsonb IS NOT NULL
    ON CONFLICT (namespace, user_id) DO UPDATE
       SET state = s.state || excluded.state, version = s.version + 1,
           update_time = excluded.update_time
    RETURNING s.version"""

# The conversation key as a scalar subquery: keeps every entry, append and turn lookup
# an index scan on the child table's primary key (the stores use it too).
KEY = """(SELECT conversation_key FROM transcript.conversations
          WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s)"""

# Whether a replica watches the conversation (WatchConversation): its writes then NOTIFY.
WATCHED = "coalesce(watched_until >= now(), false) AS watched"


# A conversation with its initial state, and the changes of its user's and the
# namespace's state, in one statement: nothing is written when it exists (or a
# changed document would exceed its limit: CREATED_STATE_TOO_LARGE tells which).
CREATE_CONVERSATION = f"""
WITH created AS (
    INSERT INTO transcript.conversations AS c
           (namespace, conversation_id, labels, user_id, state, initial_state)
    SELECT %(namespace)s, %(conversation_id)s, %(labels)s, %(user_id)s,
           coalesce(%(conversation_state)s::jsonb, '{{}}'), %(conversation_state)s::jsonb
     WHERE (%(user_state)s::jsonb IS NULL
            OR octet_length({SCOPED_AFTER.format(user="%(user_id)s", delta="user_state")}::text)
               <= %(max_state_bytes)s)
       AND (%(namespace_state)s::jsonb IS NULL
            OR octet_length({NAMESPACE_STATE_AFTER}::text) <= %(max_state_bytes)s)
    ON CONFLICT (namespace, conversation_id) DO NOTHING
    RETURNING {CONVERSATION_COLUMNS}
), user_state AS ({UPSERT_SCOPED.format(user="%(user_id)s", delta="user_state", source="created")}
), namespace_state AS ({UPSERT_SCOPED.format(user="''", delta="namespace_state", source="created")}
)
SELECT {CONVERSATION_COLUMNS} FROM created
"""


CREATED_STATE_TOO_LARGE = f"""
SELECT %(user_state)s::jsonb IS NOT NULL
           AND octet_length({SCOPED_AFTER.format(user="%(user_id)s", delta="user_state")}::text)
               > %(max_state_bytes)s,
       %(namespace_state)s::jsonb IS NOT NULL
           AND octet_length({NAMESPACE_STATE_AFTER}::text) > %(max_state_bytes)s
"""


# Erasure: the forks of the conversations just erased (one level of their descendants),
# removed. Each level is a statement of its own, so that a fork made while the level
# above was being erased (it held its source until it committed) is found by the next.
ERASE_FORKS = """
DELETE FROM transcript.conversations
 WHERE fork_source_key = ANY(%(keys)s::bigint[])
RETURNING conversation_key, coalesce(watched_until >= now(), false)
"""
