"""The SQL of digests: the digest before a chain's first append, and ListAppends (store.py).

Values always travel as bound parameters; the only interpolations are the fragments
defined here.
"""

from __future__ import annotations

# 32 zero bytes: the digest before a chain's first append.
GENESIS = "'\\x" + "00" * 32 + "'::bytea"

# A conversation's key and shared prefix (a fork's appends through its fork point lie in
# its lineage's rows).
CONVERSATION = """
SELECT conversation_key, prefix_keys, prefix_through, prefix_versions
  FROM transcript.conversations
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
"""

# Appends in version pieces (key, low, high): a range scan of the appends' primary key
# per piece, at most `limit` rows.
APPENDS = """
SELECT a.version, a.first_sequence, a.last_sequence, a.digest, a.commit_time, a.retracted
  FROM unnest(%(keys)s::bigint[], %(lows)s::bigint[], %(highs)s::bigint[])
       AS p(key, low, high)
 CROSS JOIN LATERAL (
        SELECT * FROM transcript.appends AS a
         WHERE a.conversation_key = p.key AND a.version BETWEEN p.low AND p.high
         ORDER BY a.version
         LIMIT %(limit)s) AS a
 ORDER BY a.version
 LIMIT %(limit)s
"""
