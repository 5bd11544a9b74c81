"""The SQL of the memory outbox: claims under a lease, the state of what a claim names,
completion and release."""

from __future__ import annotations

from services.memory.statements import COLUMNS, LIVE_M

# Claim the oldest rows no live claim holds: the rows themselves carry the
# claim (token, expiry), so no transaction stays open while the indexer embeds
# and writes the index, and several indexers take disjoint batches. The scan
# follows the primary key and passes over at most the rows of live claims
# (indexers x batch); FOR UPDATE SKIP LOCKED keeps two claims from racing for
# one row.
CLAIM_OUTBOX = """
WITH c AS (
    SELECT seq FROM memory.outbox
     WHERE claim_until IS NULL OR claim_until < now()
     ORDER BY seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE memory.outbox AS o
   SET claim_token = %(token)s, claim_until = now() + make_interval(secs => %(lease_s)s)
  FROM c
 WHERE o.seq = c.seq
RETURNING o.seq, o.namespace, o.memory_id
"""


# The state of the claimed memories in one snapshot: the live row, else the
# last revision recorded (a deletion's tombstone, or the write of a memory
# that expired and awaits the sweeper). Read apart, a re-create between the
# two reads would pass as the revision of a deletion.
OUTBOX_STATE = f"""
SELECT k.namespace, k.memory_id,
       (SELECT max(r.revision) FROM memory.revisions AS r
         WHERE r.namespace = k.namespace AND r.memory_id = k.memory_id),
       {", ".join("m." + c.strip() for c in COLUMNS.split(","))}
  FROM unnest(%s::text[], %s::uuid[]) AS k(namespace, memory_id)
  LEFT JOIN memory.memories AS m
    ON m.namespace = k.namespace AND m.memory_id = k.memory_id AND {LIVE_M}
"""


COMPLETE_OUTBOX = """
DELETE FROM memory.outbox WHERE seq = ANY(%(seqs)s) AND claim_token = %(token)s
"""


RELEASE_OUTBOX = """
UPDATE memory.outbox SET claim_token = NULL, claim_until = NULL
 WHERE seq = ANY(%(seqs)s) AND claim_token = %(token)s
"""
