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


# The oldest due job (by run_after), or a running job whose lease expired, through
# their partial indexes (jobs_due, jobs_leases): services/common/queue/statements.py.
CLAIM = queue.claim("summary.jobs", JOB_COLUMNS, "run_after", "run_after")


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
