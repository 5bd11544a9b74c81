"""MemoryService's metrics: the index outbox, degraded searches and the change feed
(names and labels bounded, as services/common/metrics.py says)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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

# -- change feed: WatchMemories -----------------------------------------------------------
WATCHERS = Gauge(
    "runifold_memory_watchers",
    "WatchMemories streams open in this process.",
)
WATCH_EVENTS = Counter(
    "runifold_memory_watch_events_total",
    "Events delivered to WatchMemories streams "
    "(event=created|updated|superseded|deleted|expired|erased|heartbeat).",
    ["event"],
)
WATCH_DELIVERY_SECONDS = Histogram(
    "runifold_memory_watch_delivery_seconds",
    "From a change's record time (its transaction's, the database's clock) to its delivery "
    "on a live stream (this host's clock): the write's commit, the notification, the read.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
WATCH_STREAMS_CUT = Counter(
    "runifold_memory_watch_streams_cut_total",
    "WatchMemories streams the server ended: a reader that took nothing for "
    "RUNIFOLD_MEMORY_WATCH_SEND_TIMEOUT_S (reason=WATCHER_TOO_SLOW), a shutdown "
    "(reason=SERVER_SHUTTING_DOWN). Clients resume from their last change sequence.",
    ["reason"],
)
WATCH_ANNOUNCE_FAILURES = Counter(
    "runifold_memory_watch_announce_failures_total",
    "Writes to watched namespaces whose NOTIFY to the other processes failed (their "
    "streams see the changes at the next pulse, RUNIFOLD_MEMORY_WATCH_POLL_S).",
)
WATCH_BUFFERED_BYTES = Gauge(
    "runifold_memory_watch_buffered_bytes",
    "Bytes of changes WatchMemories streams hold in this process: read and not yet taken "
    "by the transport (at most RUNIFOLD_MEMORY_WATCH_MAX_BUFFERED_BYTES, and "
    "RUNIFOLD_MEMORY_WATCH_MAX_BUFFERED_BYTES_PER_NAMESPACE a namespace).",
)
WATCH_BUDGET_WAITS = Counter(
    "runifold_memory_watch_budget_waits_total",
    "Reads of WatchMemories streams that had to wait for room in the byte budget "
    "(their namespace's or the process's: readers that do not take what they were sent).",
)
WATCH_BUDGET_WAITING = Gauge(
    "runifold_memory_watch_budget_waiting",
    "WatchMemories streams waiting now for room in the byte budget before a read.",
)

# Exported for compatibility only, each beside the metric that replaces it.
DEPRECATED = frozenset({"runifold_memory_index_lag"})
