"""The SQL of the summary store: summaries, their history, erasure tombstones (the
job queue's is jobs/statements.py).

Values always travel as bound parameters; the only interpolations are the
column lists and subqueries defined here.
"""

from __future__ import annotations

SUMMARY_COLUMNS = (
    "conversation_id, namespace, text, through_sequence, revision, create_time, incarnation"
)


# One conversation's commits, enqueues and erasures, one at a time.
LOCK_CONVERSATION = """
SELECT pg_advisory_xact_lock(hashtextextended(%(namespace)s || '/' || %(conversation_id)s::text, 0))
"""


ERASED = """
SELECT 1 FROM summary.erasures
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   AND incarnation = %(incarnation)s
"""


GET_SUMMARY = f"""
SELECT {SUMMARY_COLUMNS} FROM summary.summaries
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
"""


INSERT_FIRST_SUMMARY = f"""
INSERT INTO summary.summaries
       (namespace, conversation_id, revision, through_sequence, text, incarnation)
VALUES (%(namespace)s, %(conversation_id)s, 1, %(through_sequence)s, %(text)s,
        %(incarnation)s)
ON CONFLICT (namespace, conversation_id) DO NOTHING
RETURNING {SUMMARY_COLUMNS}
"""


# Replace the locked current summary: the old row goes to the history, which
# keeps the newest `history_limit` replaced revisions. One statement, one snapshot.
REPLACE_SUMMARY = f"""
WITH kept AS (
    INSERT INTO summary.summary_history
           (namespace, conversation_id, revision, through_sequence, text, create_time,
            incarnation)
    SELECT namespace, conversation_id, revision, through_sequence, text, create_time, incarnation
      FROM summary.summaries
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
), trimmed AS (
    DELETE FROM summary.summary_history
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
       AND revision <= %(current_revision)s - %(history_limit)s
)
UPDATE summary.summaries
   SET revision = revision + 1, through_sequence = %(through_sequence)s, text = %(text)s,
       create_time = now(), incarnation = %(incarnation)s
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
RETURNING {SUMMARY_COLUMNS}
"""


# An erasure's tombstone: the incarnation it erased (services/summary/tombstones.py), and
# what every erasure of it erased so far.
INSERT_TOMBSTONE = """
INSERT INTO summary.erasures AS e (namespace, conversation_id, incarnation, summaries, jobs)
VALUES (%(namespace)s, %(conversation_id)s, %(incarnation)s, %(summaries)s, %(jobs)s)
ON CONFLICT (namespace, conversation_id, incarnation) DO UPDATE
   SET summaries = e.summaries + excluded.summaries, jobs = e.jobs + excluded.jobs
RETURNING summaries, jobs
"""


PRUNE_TOMBSTONES = """
DELETE FROM summary.erasures WHERE erase_time < now() - make_interval(secs => %(retention_s)s)
"""
