"""The SQL every durable job queue shares (summary.jobs, memory.curation_jobs): the
lease's statements and the gauges' read, on the table the queue names (a constant of
its statements.py, never a value of a request). What differs stays in each queue's
statements.py: the claim's order (the summary queue's by age, curation's fair order by
namespace), what a completion and a failure move, the columns of a job.

Values always travel as bound parameters.
"""

from __future__ import annotations

ACTIVE = "('pending', 'running')"


def claim(table: str, columns: str, order: str, expired_order: str) -> str:
    """The first due job by `order` (a column), skipping rows other workers hold, or a
    running job whose lease expired (the first by `expired_order`): whichever comes first
    by `order`. The taken job runs under a new lease; a dead attempt (an expired lease)
    counts as a failure. Returns the job's `columns`.

    Each kind of candidate is found through its own partial index (the queue's due jobs,
    its leases), then the earlier of the two is taken: one `WHERE (pending AND due) OR
    (running AND expired)` cannot use either index and became a sequential scan plus a
    sort of every pending job. `due` reads one index entry past any rows other workers
    hold; `expired` reads only the expired leases, which are never more than the workers
    that held them. The candidate not taken is locked only until this statement ends."""
    returned = ", ".join("j." + column.strip() for column in columns.split(","))
    return f"""
WITH due AS (
    SELECT job_id, {order} FROM {table}
     WHERE state = 'pending' AND run_after <= now()
     ORDER BY {order}
     LIMIT 1
     FOR UPDATE SKIP LOCKED
), expired AS (
    SELECT job_id, {order} FROM {table}
     WHERE state = 'running' AND lease_until < now()
     ORDER BY {expired_order}
     LIMIT 1
     FOR UPDATE SKIP LOCKED
), next AS (
    SELECT job_id FROM (SELECT * FROM due UNION ALL SELECT * FROM expired) AS candidates
     ORDER BY {order}
     LIMIT 1
)
UPDATE {table} AS j
   SET state = 'running',
       attempts = j.attempts + 1,
       failures = j.failures + (j.state = 'running')::int,
       last_error = CASE WHEN j.state = 'running' THEN 'LEASE_EXPIRED' ELSE j.last_error END,
       lease_token = %(lease_token)s,
       lease_until = now() + make_interval(secs => %(lease_s)s),
       claimed_by = %(worker)s
  FROM next
 WHERE j.job_id = next.job_id
RETURNING {returned}
"""


def extend(table: str) -> str:
    """Push a held lease forward."""
    return f"""
UPDATE {table} SET lease_until = now() + make_interval(secs => %(lease_s)s)
 WHERE job_id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
"""


def release(table: str) -> str:
    """Give a claimed job back untouched (shutdown): waiting, due now, its attempt not
    counted."""
    return f"""
UPDATE {table}
   SET state = 'pending', attempts = greatest(attempts - 1, 0), run_after = now(),
       lease_token = NULL, lease_until = NULL
 WHERE job_id = %(job_id)s AND lease_token = %(lease_token)s AND state = 'running'
"""


def backlog(table: str) -> str:
    """The queue of a namespace (or of all, when %(namespace)s is NULL): its active jobs,
    the age of the oldest, the parked, the running."""
    return f"""
SELECT count(*) FILTER (WHERE state IN {ACTIVE}),
       coalesce(extract(epoch FROM now() - min(enqueue_time) FILTER (WHERE state IN {ACTIVE})),
                0)::float8,
       count(*) FILTER (WHERE state = 'failed'),
       count(*) FILTER (WHERE state = 'running')
  FROM {table}
 WHERE state <> 'done' AND (%(namespace)s::text IS NULL OR namespace = %(namespace)s::text)
"""
