"""The SQL of the degraded (full-text) search."""

from __future__ import annotations

from services.memory.statements import COLUMNS, LIVE, VALID_AT

# Degraded search: any query word may match (plainto_tsquery ANDs them, which
# finds almost nothing for a question); ts_rank orders the hits.
TEXT_SEARCH = f"""
SELECT {COLUMNS}, ts_rank(content_tsv, q.query) AS score
  FROM memory.memories,
       (SELECT replace(plainto_tsquery('english', %(query)s)::text, ' & ', ' | ')::tsquery
               AS query) AS q
 WHERE namespace = %(namespace)s AND {LIVE} AND metadata @> %(metadata)s AND {VALID_AT}
   AND content_tsv @@ q.query
 ORDER BY score DESC, memory_id
 LIMIT %(limit)s
"""
