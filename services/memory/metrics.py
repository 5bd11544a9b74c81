"""MemoryService's metrics: the index outbox, degraded searches, automatic curation
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


# -- automatic curation (services/memory/curation/) ---------------------------------
CURATION_JOBS_DEPTH = Gauge(
    "runifold_memory_curation_jobs_depth",
    "Curation jobs waiting or running.",
)
CURATION_JOBS_OLDEST_AGE = Gauge(
    "runifold_memory_curation_jobs_oldest_age_seconds",
    "Age of the oldest waiting or running curation job.",
)
CURATION_JOBS_FAILED = Gauge(
    "runifold_memory_curation_jobs_failed",
    "Curation jobs parked after too many failed attempts.",
)
CURATION_JOBS = Counter(
    "runifold_memory_curation_jobs_total",
    "Curation job attempts by outcome: done, requeued (entries left, or asked again), "
    "ended (the conversation was erased or is gone), retried, parked, lost (the lease).",
    ["outcome"],
)
CURATION_MODEL_CALLS = Counter(
    "runifold_memory_curation_model_calls_total",
    "Proposer calls made by curation jobs.",
)
CURATION_TOKENS = Counter(
    "runifold_memory_curation_tokens_total",
    "Tokens of the proposer calls made by curation jobs (kind=input|output).",
    ["kind"],
)
CURATION_FACTS = Counter(
    "runifold_memory_curation_facts_total",
    "What curation batches did with the facts proposed: added (a new memory), "
    "superseding (a new memory that replaced one), duplicate (skipped), dropped (a "
    "proposal that failed its checks), forgotten (a curated memory whose entry was "
    "retracted).",
    ["action"],
)
CURATION_REFUSED = Counter(
    "runifold_memory_curation_refused_total",
    "Curation refused for a namespace's limits: CURATION_QUEUE_FULL (RequestCuration), "
    "CURATION_BUDGET_EXHAUSTED (a job waits for the next hour).",
    ["reason"],
)
CURATION_JOB_FACTS = Histogram(
    "runifold_memory_curation_job_facts",
    "Memories stored by one attempt of a curation job.",
    buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128),
)
CURATION_JOB_MODEL_CALLS = Histogram(
    "runifold_memory_curation_job_model_calls",
    "Proposer calls made by one attempt of a curation job.",
    buckets=(0, 1, 2, 4, 8, 16, 32),
)
CURATION_JOB_TOKENS = Histogram(
    "runifold_memory_curation_job_tokens",
    "Tokens (input and output) of the proposer calls of one attempt of a curation job.",
    buckets=(0, 500, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000),
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
