"""The SQL every durable job queue shares (summary.jobs, memory.curation_jobs): the
lease's statements and the gauges' read, on the table the queue names (a constant of
its statements.py, never a value of a request). What differs stays in each queue's
statements.py: the claim's order (the summary queue's by age, curation's fair order by
namespace), what a completion and a failure move, the columns of a job.

Values always travel as bound parameters.
"""

from __future__ import annotations

ACTIVE = "('pending', 'running')"


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
