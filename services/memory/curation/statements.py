"""The SQL of automatic curation: the job queue (memory.curation_jobs) in fair order, the
cursors, the namespaces' clocks and hourly budgets.

Values always travel as bound parameters; the only interpolations are the column lists
and fragments defined here.
"""

from __future__ import annotations

from services.common.queue import statements as queue
from services.common.queue.statements import ACTIVE

JOB_COLUMNS = """job_id, namespace, conversation_id, incarnation, state, attempts, failures,
                  create_time, enqueue_time, lease_token, claimed_by, last_error, batches,
                  facts"""


# Each namespace's waiting jobs are this far apart on the queue's virtual clock: two
# namespaces with jobs waiting take turns, one job each, whatever their numbers.
FAIR_STEP = "interval '1 second'"

# The fair time of a namespace's next waiting job: one step after its latest, but never
# before the head of the queue (a namespace that waited nothing starts at the head, not
# behind the others' backlog) nor after now (a head pushed into the future by jobs
# waiting for their budget must not hold a fresh namespace back). The head is the
# first entry of curation_jobs_due.
NEXT_FAIR_TIME = f"""greatest(
    least((SELECT coalesce(min(fair_time), now()) FROM memory.curation_jobs
            WHERE state = 'pending'), now()),
    coalesce((SELECT fair_time + {FAIR_STEP} FROM memory.curation_namespaces
               WHERE namespace = %(namespace)s), '-infinity'::timestamptz))"""

# Advance a namespace's clock to the fair time of the job it just queued.
ADVANCE_CLOCK = """
INSERT INTO memory.curation_namespaces AS n (namespace, fair_time)
SELECT namespace, fair_time FROM {source}
ON CONFLICT (namespace) DO UPDATE SET fair_time = greatest(n.fair_time, excluded.fair_time)"""


INSERT_JOB = f"""
WITH inserted AS (
    INSERT INTO memory.curation_jobs
           (job_id, namespace, conversation_id, incarnation, fair_time)
    SELECT %(job_id)s, %(namespace)s, %(conversation_id)s, %(incarnation)s, {NEXT_FAIR_TIME}
     WHERE (SELECT count(*) FROM (
                SELECT 1 FROM memory.curation_jobs
                 WHERE namespace = %(namespace)s AND state IN {ACTIVE}
                 LIMIT %(max_pending)s) AS waiting) < %(max_pending)s
    ON CONFLICT (namespace, conversation_id) WHERE state IN {ACTIVE} DO NOTHING
    RETURNING {JOB_COLUMNS}, fair_time
), clock AS ({ADVANCE_CLOCK.format(source="inserted")}
)
SELECT {JOB_COLUMNS} FROM inserted
"""


# The repeat of a request: a running job is marked to run again when it finishes (the
# entries this request is about may have come after its last read).
REPEAT_JOB = f"""
UPDATE memory.curation_jobs
   SET requested_again = CASE WHEN state = 'running' THEN coalesce(requested_again, now())
                              ELSE requested_again END
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   AND state IN {ACTIVE}
RETURNING {JOB_COLUMNS}
"""


# Enqueues of one namespace, one at a time: its cap of waiting jobs is counted by one
# enqueue at a time (each sees the jobs the ones before it queued).
LOCK_NAMESPACE_QUEUE = "SELECT pg_advisory_xact_lock(hashtextextended('curation/' || %s, 0))"


ACTIVE_COUNT = f"""
SELECT count(*) FROM (SELECT 1 FROM memory.curation_jobs
                       WHERE namespace = %(namespace)s AND state IN {ACTIVE}
                       LIMIT %(max_pending)s) AS waiting
"""


# The first due job in fair order, or a running job whose lease expired (the longest
# expired first), whichever comes first. Each kind of candidate is found through its own
# partial index (curation_jobs_due, curation_jobs_leases), as the summary queue does
# (services/common/queue/statements.py): the cost of a claim does not grow with the
# queue (tests/memory/curation/test_curation_claim_plan.py).
CLAIM = queue.claim("memory.curation_jobs", JOB_COLUMNS, "fair_time", "lease_until")


EXTEND = queue.extend("memory.curation_jobs")


# An attempt that succeeded: DONE, or waiting again (asked to, or asked for meanwhile),
# then as a newly queued job of its namespace (its fair time, its clock).
COMPLETE = f"""
WITH finished AS (
    UPDATE memory.curation_jobs
       SET state = CASE WHEN %(requeue)s OR requested_again IS NOT NULL
                        THEN 'pending' ELSE 'done' END,
           finish_time = CASE WHEN %(requeue)s OR requested_again IS NOT NULL
                              THEN NULL ELSE now() END,
           fair_time = CASE WHEN %(requeue)s OR requested_again IS NOT NULL
                            THEN {NEXT_FAIR_TIME} ELSE fair_time END,
           enqueue_time = coalesce(requested_again, enqueue_time),
           requested_again = NULL,
           failures = 0,
           last_error = '',
           run_after = now(),
           lease_token = NULL,
           lease_until = NULL
     WHERE job_id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
    RETURNING state, namespace, fair_time
), clock AS ({ADVANCE_CLOCK.format(source="(SELECT * FROM finished WHERE state = 'pending') AS f")}
)
SELECT state FROM finished
"""


# An attempt that failed: waiting again after `retry_in_s` (its fair time moves with it,
# so that jobs not due stay behind the due ones in the claim's index), or parked.
FAIL = """
UPDATE memory.curation_jobs
   SET state = CASE WHEN %(park)s THEN 'failed' ELSE 'pending' END,
       finish_time = CASE WHEN %(park)s THEN now() END,
       failures = failures + %(counted)s::int,
       last_error = %(reason)s,
       run_after = now() + make_interval(secs => %(retry_in_s)s),
       fair_time = greatest(fair_time, now() + make_interval(secs => %(retry_in_s)s)),
       lease_token = NULL,
       lease_until = NULL
 WHERE job_id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
RETURNING state
"""


# A namespace over its hourly budget: its other waiting jobs wait too, in one statement
# (at most RUNIFOLD_CURATION_MAX_PENDING_PER_NAMESPACE rows), so that the claim does not
# take them one by one only to give them back.
DEFER_NAMESPACE = """
UPDATE memory.curation_jobs
   SET run_after = now() + make_interval(secs => %(retry_in_s)s),
       fair_time = greatest(fair_time, now() + make_interval(secs => %(retry_in_s)s)),
       last_error = %(reason)s
 WHERE namespace = %(namespace)s AND state = 'pending'
   AND run_after < now() + make_interval(secs => %(retry_in_s)s)
"""


RELEASE = queue.release("memory.curation_jobs")


BACKLOG = queue.backlog("memory.curation_jobs")


USAGE = """
SELECT model_calls, tokens, facts FROM memory.curation_usage
 WHERE namespace = %(namespace)s AND window_start = %(window_start)s
"""


# Reserve one model call and the tokens it may use in the namespace's hour, unless that
# would pass a limit (0: none). Nothing is returned when it would.
RESERVE = """
INSERT INTO memory.curation_usage AS u (namespace, window_start, model_calls, tokens)
SELECT %(namespace)s, %(window_start)s, 1, %(tokens)s
 WHERE (%(max_calls)s = 0 OR 1 <= %(max_calls)s)
   AND (%(max_tokens)s = 0 OR %(tokens)s <= %(max_tokens)s)
ON CONFLICT (namespace, window_start) DO UPDATE
   SET model_calls = u.model_calls + 1, tokens = u.tokens + excluded.tokens
 WHERE (%(max_calls)s = 0 OR u.model_calls + 1 <= %(max_calls)s)
   AND (%(max_tokens)s = 0 OR u.tokens + excluded.tokens <= %(max_tokens)s)
RETURNING model_calls, tokens
"""


# After the call: the tokens it used in place of the tokens reserved.
SETTLE = """
UPDATE memory.curation_usage SET tokens = greatest(0, tokens + %(delta)s)
 WHERE namespace = %(namespace)s AND window_start = %(window_start)s
"""


CURSOR = """
SELECT incarnation, curated_through, curated_version FROM memory.curation_cursors
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
"""


# --- a batch's transaction (store.apply_batch), in this order ---------------------

# The job still held by this lease (and locked: a claim that would take it over waits
# until the batch commits, or skips it).
HOLD_JOB = """
SELECT 1 FROM memory.curation_jobs
 WHERE job_id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
   FOR UPDATE
"""

CURSOR_FOR_UPDATE = CURSOR + "   FOR UPDATE"

# The curated memories of the conversation with a source overlapping a retracted entry.
RETRACTED_VICTIMS = """
SELECT namespace, memory_id FROM memory.memories
 WHERE namespace = %(namespace)s
   AND sources @> %(containment)s
   AND metadata @> %(origin)s
   AND EXISTS (SELECT 1 FROM jsonb_array_elements(sources) AS s
                WHERE s->>'c' = %(conversation)s
                  AND EXISTS (SELECT 1 FROM unnest(%(retracted)s::bigint[]) AS r(sequence)
                               WHERE r.sequence BETWEEN (s->>'f')::bigint
                                                    AND (s->>'t')::bigint))
"""

SAVE_CURSOR = """
INSERT INTO memory.curation_cursors AS c
       (namespace, conversation_id, incarnation, curated_through, curated_version)
VALUES (%(namespace)s, %(conversation_id)s, %(incarnation)s, %(through)s, %(version)s)
ON CONFLICT (namespace, conversation_id) DO UPDATE
   SET incarnation = excluded.incarnation, curated_through = excluded.curated_through,
       curated_version = excluded.curated_version, update_time = now()
"""

COUNT_BATCH = """
UPDATE memory.curation_jobs SET batches = batches + 1, facts = facts + %(facts)s
 WHERE job_id = %(job_id)s
"""

# Last in the batch: the memories stored this hour.
COUNT_FACTS = """
INSERT INTO memory.curation_usage AS u (namespace, window_start, facts)
VALUES (%(namespace)s, %(window_start)s, %(facts)s)
ON CONFLICT (namespace, window_start) DO UPDATE SET facts = u.facts + excluded.facts
"""


# The latest open curated memories of a conversation (with the batch's metadata): shown
# to the proposer beside what the search finds, because the index may not have them yet
# (a fact stated one turn ago, changed now).
RECENT_CURATED = """
SELECT {columns} FROM memory.memories
 WHERE namespace = %(namespace)s
   AND sources @> %(containment)s
   AND metadata @> %(metadata)s
   AND valid_until_time IS NULL
   AND {live}
 ORDER BY memory_id DESC
 LIMIT %(limit)s
"""
