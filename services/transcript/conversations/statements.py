"""The SQL of conversations (store.py): creating one with its initial state, and the
fragments every feature's statements share: the conversation key of a (namespace, id),
whether a replica watches it, and the state a write leaves in a user's or the
namespace's document.

Values always travel as bound parameters; the only interpolations are the
column lists and subqueries defined here.
"""

from __future__ import annotations

import functools

# A fork's origin and shared prefix (migration 0011), after the other columns.
FORK_COLUMNS = (
    "fork_origin_id, fork_through, prefix_keys, prefix_through, prefix_versions, head_digest"
)
CONVERSATION_COLUMNS = (
    "conversation_id, namespace, version, last_sequence, create_time, update_time, labels, "
    f"incarnation, user_id, state::text, curated_through, {FORK_COLUMNS}"
)
# The same without the state (CONVERSATION_VIEW_BASIC listings): '' in its place.
CONVERSATION_BASIC_COLUMNS = (
    "conversation_id, namespace, version, last_sequence, create_time, update_time, labels, "
    f"incarnation, user_id, '', curated_through, {FORK_COLUMNS}"
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


# How far curation read the conversation (MarkCurated): monotonic, never past the last
# entry, only for the incarnation named (0: the current one). Nothing is written when
# the conversation is elsewhere, another incarnation, or shorter than asked (the store
# then reads it to say which).
MARK_CURATED = f"""
UPDATE transcript.conversations
   SET curated_through = greatest(curated_through, %(curated_through)s)
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   AND (%(incarnation)s::bigint = 0 OR incarnation = %(incarnation)s::bigint)
   AND %(curated_through)s <= last_sequence
RETURNING {CONVERSATION_COLUMNS}
"""

# -- listings ------------------------------------------------------------------------

# A page of a namespace's conversations (of one user, when `{user}` adds its filter),
# each with its preview: the first standing user message among its first
# %(preview_entries)s entries, at most %(preview_chars)s characters of it. The page is
# one index range scan (in id order: conversations_namespace_id or conversations_user;
# newest first: conversations_newest or conversations_user_newest, migration 0010), and
# each preview one range of at most %(preview_entries)s rows of the entries' primary key:
# the cost is the page's, never the namespace's or a conversation's length. The outer
# ORDER BY sorts the page itself (at most 1001 rows), which the join may not keep.
_LISTING = """
SELECT c.*, p.text
  FROM (SELECT conversation_key, {columns}
          FROM transcript.conversations
         WHERE namespace = %(namespace)s{user}{after}
         ORDER BY {order}
         LIMIT %(limit)s) AS c
  LEFT JOIN LATERAL (
        SELECT left(e.text, %(preview_chars)s) AS text
          FROM transcript.entries AS e
         WHERE e.conversation_key = c.conversation_key
           AND e.sequence <= %(preview_entries)s
           AND e.role = 1
           AND e.retracted_version IS NULL
         ORDER BY e.sequence
         LIMIT 1) AS p ON true
 ORDER BY {outer_order}
"""


@functools.cache
def list_conversations(
    *, with_state: bool, by_user: bool, newest_first: bool, after_cursor: bool
) -> str:
    """The listing statement of one shape. One statement per shape rather than `IS NULL
    OR` filters: a prepared statement's generic plan could not use such a filter as an
    index condition, and every page would read the namespace from its start."""
    if newest_first:
        # After the previous page's last row (create_time, id), going down.
        after = " AND (create_time, conversation_id) < (%(after_time)s, %(after)s)"
        order = "create_time DESC, conversation_id DESC"
        outer = "c.create_time DESC, c.conversation_id DESC"
    else:
        after = " AND conversation_id > %(after)s"
        order, outer = "conversation_id", "c.conversation_id"
    return _LISTING.format(
        columns=CONVERSATION_COLUMNS if with_state else CONVERSATION_BASIC_COLUMNS,
        user=" AND user_id = %(user_id)s" if by_user else "",
        after=after if after_cursor else "",
        order=order,
        outer_order=outer,
    )


# The namespaces that hold conversations, after a cursor, in name order: a loose index
# scan of conversations_namespace_id (one probe for the next namespace each, at most
# %(limit)s probes) rather than a DISTINCT, which would read every conversation.
LIST_NAMESPACES = """
WITH RECURSIVE found(namespace, n) AS (
    (SELECT namespace, 1 FROM transcript.conversations
      WHERE namespace > %(after)s ORDER BY namespace LIMIT 1)
    UNION ALL
    SELECT (SELECT c.namespace FROM transcript.conversations AS c
             WHERE c.namespace > f.namespace ORDER BY c.namespace LIMIT 1), f.n + 1
      FROM found AS f
     WHERE f.namespace IS NOT NULL AND f.n < %(limit)s
)
SELECT namespace FROM found WHERE namespace IS NOT NULL ORDER BY namespace
"""

# The same among some namespaces (an identity's grants): one probe for each of them.
LIST_GRANTED_NAMESPACES = """
SELECT g.namespace FROM unnest(%(among)s::text[]) AS g(namespace)
 WHERE g.namespace > %(after)s
   AND EXISTS (SELECT 1 FROM transcript.conversations AS c WHERE c.namespace = g.namespace)
 ORDER BY g.namespace
 LIMIT %(limit)s
"""

# Erasure: the forks of the conversations just erased (one level of their descendants),
# removed. Each level is a statement of its own, so that a fork made while the level
# above was being erased (it held its source until it committed) is found by the next.
ERASE_FORKS = """
DELETE FROM transcript.conversations
 WHERE fork_source_key = ANY(%(keys)s::bigint[])
RETURNING conversation_key, coalesce(watched_until >= now(), false), conversation_id,
          incarnation
"""
