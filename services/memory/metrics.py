"""MemoryService's metrics: the index outbox and degraded searches (names and labels
bounded, as services/common/metrics.py says)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

MEMORY_OUTBOX_DEPTH = Gauge(
    "runifold_memory_outbox_depth",
    "Memory index writes waiting in the outbox (rows).",
)
# The same value under its old name, kept for one release (docs/operations.md): it is a
# row count, not a time. Deprecated series appear on no dashboard and in no rule.
MEMORY_INDEX_LAG = Gauge(
    "runifold_memory_index_lag",
    "Deprecated: runifold_memory_outbox_depth (memory index writes waiting in the outbox).",
)
MEMORY_INDEX_OLDEST_AGE = Gauge(
    "runifold_memory_index_oldest_age_seconds",
    "Age of the oldest memory index write waiting in the outbox.",
)
MEMORY_DEGRADED_SEARCHES = Counter(
    "runifold_memory_degraded_searches_total",
    "Searches answered from PostgreSQL full-text search because the vector index was down.",
)

# Exported for compatibility only, each beside the metric that replaces it.
DEPRECATED = frozenset({"runifold_memory_index_lag"})
