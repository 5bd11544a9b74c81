"""The SQL of turn leases (store.py): locking the conversation for a lease
decision, granting, queueing, renewing and ending leases, and sweeping what is done.

Values always travel as bound parameters; the only interpolations are the
fragments defined here and in conversations/statements.py.
"""

from __future__ import annotations

from services.transcript.conversations.statements import KEY, WATCHED

NO_LIVE_TURN = """NOT EXISTS (
    SELECT 1 FROM transcript.turns AS t
     WHERE t.conversation_key = c.conversation_key
       AND t.state IN ('waiting', 'running') AND t.lease_until >= now())"""


# The turn's row a lease decision saw, and no other: a lapsed lease (by its fencing
# token) or this caller's place in line (by its ticket). When the decision saw none, a
# row that a racing one-statement grant inserted meanwhile is never overwritten.
SEEN_ROW = """transcript.turns.ticket IS NOT DISTINCT FROM %(seen_ticket)s::bigint
   AND transcript.turns.fencing_token IS NOT DISTINCT FROM %(seen_fencing_token)s::bigint
   AND (%(seen_ticket)s::bigint IS NOT NULL OR %(seen_fencing_token)s::bigint IS NOT NULL)"""


# Exclusive and queued lease decisions lock the conversation row against every other
# lease decision (and appends); shared ones take SHARE_CONVERSATION.
LOCK_CONVERSATION = f"""
SELECT conversation_key, {WATCHED} FROM transcript.conversations
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   FOR UPDATE
"""


# A shared lease for a turn id that has no row and no append yet, in one statement.
GRANT_NEW_SHARED = f"""
WITH c AS (
    SELECT conversation_key, {WATCHED} FROM transcript.conversations
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
       FOR KEY SHARE
), granted AS (
    INSERT INTO transcript.turns
           (conversation_key, turn_id, state, exclusive, fencing_token, payload_hash,
            lease_until)
    SELECT c.conversation_key, %(turn_id)s, 'running', false, transcript.random_token(),
           %(payload_hash)s, now() + make_interval(secs => %(ttl_s)s)
      FROM c
     WHERE NOT EXISTS (SELECT 1 FROM transcript.appends AS a
                        WHERE a.conversation_key = c.conversation_key
                          AND a.request_id = %(turn_id)s)
    ON CONFLICT (conversation_key, turn_id) DO NOTHING
    RETURNING fencing_token, lease_until
)
SELECT g.fencing_token, g.lease_until, c.conversation_key, c.watched FROM granted AS g, c
"""


SHARE_CONVERSATION = f"""
SELECT conversation_key, {WATCHED} FROM transcript.conversations
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   FOR KEY SHARE
"""


# Serializes the lease decisions of one turn id (shared ones run side by side).
LOCK_TURN_ID = """
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s::text || '/' || %(turn_id)s, 0))
"""


# create_if_missing: the conversation, marked as made by this turn.
INSERT_PROVISIONAL = """
INSERT INTO transcript.conversations (namespace, conversation_id, provisional_turn_id)
VALUES (%(namespace)s, %(conversation_id)s, %(turn_id)s)
ON CONFLICT (namespace, conversation_id) DO NOTHING
RETURNING conversation_key, false
"""


# Running turns of other ids whose holder began its model call and then lost its lease:
# interrupted, not dropped (a repeat of such an id must not run the model again).
INTERRUPT_LAPSED = """
UPDATE transcript.turns
   SET state = 'ended', outcome = %(interrupted)s, end_time = now(),
       lease_until = now() + make_interval(secs => %(retention_s)s)
 WHERE conversation_key = %(key)s AND turn_id <> %(turn_id)s
   AND state = 'running' AND lease_until < now() AND model_call_time IS NOT NULL
"""


DROP_LAPSED = """
DELETE FROM transcript.turns
 WHERE conversation_key = %(key)s AND turn_id <> %(turn_id)s
   AND state IN ('waiting', 'running') AND lease_until < now()
RETURNING state
"""


# The requested turn's row (any state), and every live waiting or running row.
TURN_ROWS = """
SELECT turn_id, state, exclusive, ticket, fencing_token, payload_hash, lease_until >= now(),
       outcome, end_time, model_call_time IS NOT NULL
  FROM transcript.turns
 WHERE conversation_key = %(key)s
   AND (turn_id = %(turn_id)s OR (state IN ('waiting', 'running') AND lease_until >= now()))
"""


PRIOR_APPEND = """
SELECT version, first_sequence, last_sequence, input_tokens, output_tokens, model_calls,
       commit_time, payload_hash
  FROM transcript.appends
 WHERE conversation_key = %(key)s AND request_id = %(turn_id)s
"""


# A place in the queue: the next ticket (of one sequence for every conversation).
ENQUEUE = f"""
INSERT INTO transcript.turns
       (conversation_key, turn_id, state, exclusive, ticket, payload_hash, lease_until)
VALUES (%(key)s, %(turn_id)s, 'waiting', true, nextval('transcript.turn_tickets'),
        %(payload_hash)s, now() + make_interval(secs => %(wait_s)s))
ON CONFLICT (conversation_key, turn_id) DO UPDATE
   SET state = 'waiting', exclusive = true, ticket = excluded.ticket, fencing_token = NULL,
       payload_hash = excluded.payload_hash, lease_until = excluded.lease_until,
       outcome = NULL, end_time = NULL, create_time = now()
 WHERE {SEEN_ROW}
RETURNING ticket
"""


# A conversation with turns waiting is marked as watched (as WatchConversation marks
# it), so that its writes through any replica announce themselves and wake the waiters.
MARK_WAITED = """
UPDATE transcript.conversations
   SET watched_until = now() + make_interval(secs => %(mark_s)s)
 WHERE conversation_key = %(key)s
   AND (watched_until IS NULL
        OR watched_until < now() + make_interval(secs => %(renew_before_s)s))
"""


KEEP_PLACE = """
UPDATE transcript.turns SET lease_until = now() + make_interval(secs => %(wait_s)s)
 WHERE conversation_key = %(key)s AND turn_id = %(turn_id)s AND ticket = %(ticket)s
   AND state = 'waiting'
"""


# The lease: a new fencing token, the turn's row (replacing a waiting place or a
# lapsed lease) and, when exclusive, the lease's copy on the conversation row (which
# fences other appends out).
GRANT = f"""
WITH granted AS (
    INSERT INTO transcript.turns
           (conversation_key, turn_id, state, exclusive, fencing_token, payload_hash,
            lease_until)
    VALUES (%(key)s, %(turn_id)s, 'running', %(exclusive)s, transcript.random_token(),
            %(payload_hash)s, now() + make_interval(secs => %(ttl_s)s))
    ON CONFLICT (conversation_key, turn_id) DO UPDATE
       SET state = 'running', exclusive = excluded.exclusive, ticket = NULL,
           fencing_token = excluded.fencing_token, payload_hash = excluded.payload_hash,
           lease_until = excluded.lease_until, outcome = NULL, end_time = NULL,
           create_time = now()
     WHERE {SEEN_ROW}
    RETURNING fencing_token, lease_until
), exclusive_lease AS (
    UPDATE transcript.conversations AS c
       SET lease_turn_id = %(turn_id)s, lease_fencing_token = g.fencing_token,
           lease_until = g.lease_until
      FROM granted AS g
     WHERE c.conversation_key = %(key)s AND %(exclusive)s
)
SELECT fencing_token, lease_until FROM granted
"""


RENEW = f"""
WITH renewed AS (
    UPDATE transcript.turns
       SET lease_until = now() + make_interval(secs => %(ttl_s)s),
           model_call_time = CASE WHEN %(calling_model)s THEN coalesce(model_call_time, now())
                                  ELSE model_call_time END
     WHERE conversation_key = {KEY} AND turn_id = %(turn_id)s
       AND fencing_token = %(fencing_token)s AND state = 'running' AND lease_until >= now()
 RETURNING conversation_key, exclusive, lease_until
), exclusive_lease AS (
    UPDATE transcript.conversations AS c SET lease_until = r.lease_until
      FROM renewed AS r
     WHERE c.conversation_key = r.conversation_key AND r.exclusive
       AND c.lease_fencing_token = %(fencing_token)s
)
SELECT exclusive, lease_until FROM renewed
"""


# A running turn whose holder began its model call and then lost its lease: ended as
# interrupted (the row the decision saw, by its fencing token), so that no repeat of its
# id runs the model again; its exclusive lease on the conversation goes with it.
INTERRUPT = """
WITH ended AS (
    UPDATE transcript.turns
       SET state = 'ended', outcome = %(outcome)s, end_time = now(),
           lease_until = now() + make_interval(secs => %(retention_s)s)
     WHERE conversation_key = %(key)s AND turn_id = %(turn_id)s
       AND fencing_token = %(seen_fencing_token)s AND state = 'running'
 RETURNING fencing_token
)
UPDATE transcript.conversations AS c
   SET lease_turn_id = NULL, lease_fencing_token = NULL, lease_until = NULL
  FROM ended AS e
 WHERE c.conversation_key = %(key)s AND c.lease_fencing_token = e.fencing_token
"""


# Ends the turn's row if it still holds the lease (expired but not taken over
# counts: nobody else holds it): kept as 'ended' with its outcome, or deleted.
END_TURN = """
WITH ended AS (
    -- Kept: with the outcome given, or, when none is given but the holder had begun
    -- its model call (and does not say it failed), as interrupted: a repeat must not
    -- call the model again.
    UPDATE transcript.turns
       SET state = 'ended', outcome = coalesce(%(outcome)s, %(interrupted)s),
           end_time = now(), lease_until = now() + make_interval(secs => %(retention_s)s)
     WHERE conversation_key = %(key)s AND turn_id = %(turn_id)s
       AND fencing_token = %(fencing_token)s AND state = 'running'
       AND (%(outcome)s::jsonb IS NOT NULL
            OR (model_call_time IS NOT NULL AND NOT %(model_call_failed)s))
 RETURNING false
), dropped AS (
    DELETE FROM transcript.turns
     WHERE conversation_key = %(key)s AND turn_id = %(turn_id)s
       AND fencing_token = %(fencing_token)s AND state = 'running'
       AND %(outcome)s::jsonb IS NULL
       AND (model_call_time IS NULL OR %(model_call_failed)s)
 RETURNING true
)
SELECT * FROM ended UNION ALL SELECT * FROM dropped
"""


DROP_EXCLUSIVE = """
UPDATE transcript.conversations
   SET lease_turn_id = NULL, lease_fencing_token = NULL, lease_until = NULL
 WHERE conversation_key = %(key)s AND lease_fencing_token = %(fencing_token)s
"""


# A conversation that holds LangGraph checkpoints (checkpoints/: a thread's first put
# may come under a lease that created the conversation) is a thread, not a provisional
# conversation to drop: dropping it would leave its checkpoints with no conversation to
# erase them with.
NO_CHECKPOINT = """NOT EXISTS (SELECT 1 FROM transcript.checkpoints AS k
                    WHERE k.conversation_key = c.conversation_key)"""

DROP_PROVISIONAL = f"""
WITH gone AS (
    DELETE FROM transcript.conversations AS c
     WHERE c.conversation_key = %(key)s AND c.provisional_turn_id = %(turn_id)s
       AND c.version = 0 AND {NO_LIVE_TURN} AND {NO_CHECKPOINT}
 RETURNING conversation_key
)
DELETE FROM transcript.turns WHERE conversation_key IN (SELECT conversation_key FROM gone)
"""


# The sweep's part of INTERRUPT_LAPSED, for conversations nobody asked for a lease since.
SWEEP_INTERRUPTED = """
UPDATE transcript.turns
   SET state = 'ended', outcome = %(interrupted)s, end_time = now(),
       lease_until = now() + make_interval(secs => %(retention_s)s)
 WHERE ctid = ANY(ARRAY(
       SELECT ctid FROM transcript.turns
        WHERE state = 'running' AND model_call_time IS NOT NULL
          AND lease_until < now() - make_interval(secs => %(grace_s)s)
        LIMIT %(limit)s))
"""


SWEEP_TURNS = """
DELETE FROM transcript.turns
 WHERE ctid = ANY(ARRAY(
       SELECT ctid FROM transcript.turns
        WHERE lease_until < now() - CASE WHEN state IN ('ended', 'committed') THEN interval '0'
                                         ELSE make_interval(secs => %(grace_s)s) END
        ORDER BY lease_until
        LIMIT %(limit)s))
"""


# Empty conversations whose creating turn vanished without appending or releasing.
SWEEP_PROVISIONAL = f"""
DELETE FROM transcript.conversations AS c
 WHERE c.conversation_key = ANY(ARRAY(
       SELECT c.conversation_key FROM transcript.conversations AS c
        WHERE c.provisional_turn_id IS NOT NULL AND c.version = 0
          AND c.create_time < now() - make_interval(secs => %(grace_s)s)
          AND {NO_LIVE_TURN} AND {NO_CHECKPOINT}
        LIMIT %(limit)s))
"""
