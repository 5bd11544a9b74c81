"""The SQL of the summary job queue (table summary.jobs).

Values always travel as bound parameters; the only interpolations are the
column lists defined here.
"""

from __future__ import annotations

from services.common.queue import statements as queue
from services.common.queue.statements import ACTIVE

JOB_COLUMNS = """job_id, namespace, conversation_id, window_size, summary_batch, state, attempts,
                  failures, create_time, enqueue_time, lease_token, claimed_by, last_error,
                  incarnation"""


INSERT_JOB = f"""
INSERT INTO summary.jobs
       (job_id, namespace, conversation_id, window_size, summary_batch, incarnation)
VALUES (%(job_id)s, %(namespace)s, %(conversation_id)s, %(window)s, %(summary_batch)s,
        %(incarnation)s)
ON CONFLICT (namespace, conversation_id) WHERE state IN {ACTIVE} DO NOTHING
RETURNING {JOB_COLUMNS}
"""


# The repeat of a request: a running job is marked to run again when it
# finishes (its last view may predate the entries this request is about). The job
# keeps the smaller of the two windows, so that it reaches as far as each request
# asked (a turn refused with a narrow window while a job ahead with a wider one
# waits: docs/summary.md); a running job's next run uses it.
REPEAT_JOB = f"""
UPDATE summary.jobs
   SET requested_again = CASE WHEN state = 'running' THEN coalesce(requested_again, now())
                              ELSE requested_again END,
       window_size = LEAST(window_size, %(window)s)
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   AND state IN {ACTIVE}
RETURNING {JOB_COLUMNS}
"""


# The oldest due job, skipping rows other workers hold. A running job whose
# lease expired is taken over; its dead attempt counts as a failure.
#
# Each kind of candidate is found through its own partial index (jobs_due,
# jobs_leases), then the older of the two (by run_after) is taken: one
# `WHERE (pending AND due) OR (running AND expired)` cannot use either index
# and became a sequential scan plus a sort of every pending job. `due` reads
# one index entry past any rows other workers hold; `expired` reads only the
# expired leases, which are never more than the workers that held them. The
# candidate not taken is locked only until this statement ends.
CLAIM = f"""
WITH due AS (
    SELECT job_id, run_after FROM summary.jobs
     WHERE state = 'pending' AND run_after <= now()
     ORDER BY run_after
     LIMIT 1
     FOR UPDATE SKIP LOCKED
), expired AS (
    SELECT job_id, run_after FROM summary.jobs
     WHERE state = 'running' AND lease_until < now()
     ORDER BY run_after
     LIMIT 1
     FOR UPDATE SKIP LOCKED
), next AS (
    SELECT job_id FROM (SELECT * FROM due UNION ALL SELECT * FROM expired) AS candidates
     ORDER BY run_after
     LIMIT 1
)
UPDATE summary.jobs AS j
   SET state = 'running',
       attempts = j.attempts + 1,
       failures = j.failures + (j.state = 'running')::int,
       last_error = CASE WHEN j.state = 'running' THEN 'LEASE_EXPIRED' ELSE j.last_error END,
       lease_token = %(lease_token)s,
       lease_until = now() + make_interval(secs => %(lease_s)s),
       claimed_by = %(worker)s
  FROM next
 WHERE j.job_id = next.job_id
RETURNING {", ".join("j." + c.strip() for c in JOB_COLUMNS.split(","))}
"""


EXTEND = queue.extend("summary.jobs")


COMPLETE = """
UPDATE summary.jobs
   SET state = CASE WHEN %(requeue)s OR requested_again IS NOT NULL THEN 'pending' ELSE 'done' END,
       finish_time = CASE WHEN %(requeue)s OR requested_again IS NOT NULL THEN NULL ELSE now() END,
       enqueue_time = coalesce(requested_again, enqueue_time),
       requested_again = NULL,
       failures = 0,
       last_error = '',
       run_after = now(),
       lease_token = NULL,
       lease_until = NULL
 WHERE job_id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
RETURNING state
"""


FAIL = """
UPDATE summary.jobs
   SET state = CASE WHEN %(park)s THEN 'failed' ELSE 'pending' END,
       finish_time = CASE WHEN %(park)s THEN now() END,
       failures = failures + %(counted)s::int,
       last_error = %(reason)s,
       run_after = now() + make_interval(secs => %(retry_in_s)s),
       lease_token = NULL,
       lease_until = NULL
 WHERE job_id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
RETURNING state
"""


RELEASE = queue.release("summary.jobs")


BACKLOG = queue.backlog("summary.jobs")
