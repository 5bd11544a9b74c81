"""The SQL of erasure receipts (values always bound)."""

from __future__ import annotations

COLUMNS = (
    "receipt_id, namespace, conversation_id, incarnation, counts, remaining, create_time, "
    "complete_time"
)


# Make the receipt of an incarnation, or merge a report into it (model.merge): the larger
# of each count, the parts both still list, complete once nothing remains (and for good).
RECORD = f"""
INSERT INTO transcript.erasure_receipts AS r
       (receipt_id, namespace, conversation_id, incarnation, counts, remaining, complete_time)
VALUES (%(receipt_id)s, %(namespace)s, %(conversation_id)s, %(incarnation)s, %(counts)s,
        %(remaining)s::text[],
        CASE WHEN cardinality(%(remaining)s::text[]) = 0 THEN now() END)
ON CONFLICT (namespace, conversation_id, incarnation) DO UPDATE
   SET counts = (
           SELECT coalesce(
                      jsonb_object_agg(k, greatest(coalesce((r.counts ->> k)::bigint, 0),
                                                   coalesce((excluded.counts ->> k)::bigint, 0))),
                      '{{}}'::jsonb)
             FROM (SELECT jsonb_object_keys(r.counts)
                   UNION SELECT jsonb_object_keys(excluded.counts)) AS names (k)),
       remaining = ARRAY(SELECT unnest(r.remaining) INTERSECT SELECT unnest(excluded.remaining)
                          ORDER BY 1),
       complete_time = coalesce(r.complete_time,
                                CASE WHEN NOT (r.remaining && excluded.remaining) THEN now() END),
       update_time = now()
RETURNING {COLUMNS}
"""


# A receipt may be made for an incarnation that exists, or merged into once made.
RECORDABLE = """
SELECT 1 FROM transcript.conversations
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   AND incarnation = %(incarnation)s
UNION ALL
SELECT 1 FROM transcript.erasure_receipts
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   AND incarnation = %(incarnation)s
LIMIT 1
"""


KEPT = """
SELECT 1 FROM transcript.erasure_receipts
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   AND incarnation = %(incarnation)s
"""


BY_ID = f"""
SELECT {COLUMNS} FROM transcript.erasure_receipts
 WHERE namespace = %(namespace)s AND receipt_id = %(receipt_id)s
"""


# The latest receipt of a conversation id (it may have been erased, made again and erased).
LATEST = f"""
SELECT {COLUMNS} FROM transcript.erasure_receipts
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
 ORDER BY create_time DESC, receipt_id DESC
 LIMIT 1
"""


SWEEP = """
DELETE FROM transcript.erasure_receipts
 WHERE receipt_id IN (
       SELECT receipt_id FROM transcript.erasure_receipts
        WHERE create_time <= now() - make_interval(secs => %(retention_s)s)
        ORDER BY create_time
        LIMIT %(limit)s)
"""
