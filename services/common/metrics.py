"""Prometheus metrics: the standard gRPC server metrics and every domain metric.

All metrics are defined here, in one place, so that dashboards and alert rules
(deploy/prometheus/) have one source of names. Label values are bounded:
service and method names, status codes, store names, fixed enums. Never a
namespace, a conversation id or any content.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# -- standard gRPC server metrics (go-grpc-prometheus names) -------------------
RPC_STARTED = Counter(
    "grpc_server_started_total",
    "RPCs started on the server.",
    ["grpc_type", "grpc_service", "grpc_method"],
)
RPC_HANDLED = Counter(
    "grpc_server_handled_total",
    "RPCs completed on the server, by status code.",
    ["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
)
RPC_SECONDS = Histogram(
    "grpc_server_handling_seconds",
    "Time to handle an RPC on the server.",
    ["grpc_type", "grpc_service", "grpc_method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

# -- health ------------------------------------------------------------------------
SERVICE_SERVING = Gauge(
    "runifold_service_serving",
    "1 when a hosted service reports SERVING on gRPC health (its store reachable and "
    "its schema current), 0 otherwise.",
    ["runifold_service"],
)

# -- stores ------------------------------------------------------------------------
STORE_ERRORS = Counter(
    "runifold_store_errors_total",
    "Operations that failed because a store or peer was unavailable.",
    ["store"],
)

# -- load shedding (services/common/admission.py, services/common/shedding.py) ------
REQUESTS_SHED = Counter(
    "runifold_requests_shed_total",
    "Calls refused with RESOURCE_EXHAUSTED before any work: a namespace at its "
    "concurrency limit for a kind of call (reason=NAMESPACE_CONCURRENCY_LIMIT, "
    "resource=search|turn|summarize|upsert), over its share of the embedding model "
    "(reason=NAMESPACE_SHARE_EXCEEDED), a full queue in front of a slow resource "
    "(reason=OVERLOADED, resource=embeddings|model), or WatchConversation streams beyond "
    "a limit (reason=WATCHER_LIMIT, resource=watchers).",
    ["resource", "reason"],
)
WORK_ABANDONED = Counter(
    "runifold_work_abandoned_total",
    "Queued work dropped before it ran because its caller had left: cancelled "
    "(cause=cancelled) or past its deadline (cause=deadline).",
    ["resource", "cause"],
)
WORK_QUEUED = Gauge(
    "runifold_work_queued",
    "Work waiting in front of a slow resource: texts for the embedding model "
    "(resource=embeddings), calls for a chat model (resource=model).",
    ["resource"],
)
ADMITTED_IN_FLIGHT = Gauge(
    "runifold_admitted_in_flight",
    "Admission-controlled calls in flight, all namespaces together, by kind "
    "(resource=search|turn|summarize|upsert).",
    ["resource"],
)

# -- transcript --------------------------------------------------------------------
APPEND_CONFLICTS = Counter(
    "runifold_append_conflicts_total",
    "Appends rejected because their expected version was not current.",
)

# -- turn leases (transcript) --------------------------------------------------------
TURN_BUSY_REFUSALS = Counter(
    "runifold_turn_busy_refusals_total",
    "Refused with CONVERSATION_BUSY: a turn asking for an exclusive lease while another "
    "ran (where=lease), or an append without the holder's fencing token (where=append).",
    ["where"],
)
TURN_QUEUE_FULL = Counter(
    "runifold_turn_queue_full_total",
    "Queued turns refused with TURN_QUEUE_FULL (the conversation's queue was full).",
)
TURNS_WAITING = Gauge(
    "runifold_turns_waiting",
    "Turns waiting in this process for a lease: in a conversation's queue (why=queue) or "
    "for a running turn with the same turn_id (why=same_turn).",
    ["why"],
)
TURN_LEASE_EXPIRIES = Counter(
    "runifold_turn_lease_expiries_total",
    "Turn leases that lapsed and were taken over (the holder died or stalled).",
)
TURN_FENCE_REFUSALS = Counter(
    "runifold_turn_fence_refusals_total",
    "Appends refused because the turn lease they quoted expired or was taken over "
    "(TURN_LEASE_LOST): a turn that lost its lease tried to commit.",
)

# -- change feed: WatchConversation (transcript) --------------------------------------
WATCHERS = Gauge(
    "runifold_watchers",
    "WatchConversation streams open in this process.",
)
WATCH_EVENTS = Counter(
    "runifold_watch_events_total",
    "Events delivered to WatchConversation streams "
    "(event=appended|turn_started|turn_finished|heartbeat|erased).",
    ["event"],
)
WATCH_DELIVERY_SECONDS = Histogram(
    "runifold_watch_delivery_seconds",
    "From an append's commit (the database's clock) to the delivery of its entries on a "
    "live stream (this host's clock): notification lag plus the read.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
WATCH_STREAMS_CUT = Counter(
    "runifold_watch_streams_cut_total",
    "WatchConversation streams the server ended: a reader that took nothing for "
    "RUNIFOLD_WATCH_SEND_TIMEOUT_S (reason=WATCHER_TOO_SLOW), a shutdown "
    "(reason=SERVER_SHUTTING_DOWN). Clients resume from their last sequence.",
    ["reason"],
)
WATCH_ANNOUNCE_FAILURES = Counter(
    "runifold_watch_announce_failures_total",
    "Writes to watched conversations whose NOTIFY to the other processes failed (their "
    "streams see the writes at the next pulse, RUNIFOLD_WATCH_POLL_S).",
)

# -- agent -------------------------------------------------------------------------
TURN_CONFLICTS = Counter(
    "runifold_turn_conflicts_total",
    "Turns whose append lost the race after the model call (TURN_CONFLICT).",
)
SUMMARY_REQUIRED = Counter(
    "runifold_summary_required_total",
    "Turns refused with SUMMARY_REQUIRED or SUMMARY_BACKLOG.",
    ["reason"],
)
TURNS = Counter(
    "runifold_turns_total",
    "Turns run, by outcome.",
    ["outcome"],
)
MODEL_OUTPUT_INVALID = Counter(
    "runifold_model_output_invalid_total",
    "Turns whose model reply broke the transcript's limits (MODEL_OUTPUT_INVALID).",
)

# -- summary -----------------------------------------------------------------------
SUMMARY_JOBS_DEPTH = Gauge(
    "runifold_summary_jobs_depth",
    "Summary jobs waiting or running.",
)
SUMMARY_JOBS_OLDEST_AGE = Gauge(
    "runifold_summary_jobs_oldest_age_seconds",
    "Age of the oldest waiting or running summary job.",
)
SUMMARY_JOBS_FAILED = Gauge(
    "runifold_summary_jobs_failed",
    "Summary jobs parked after too many failed attempts.",
)
SUMMARY_JOB_FAILURES = Counter(
    "runifold_summary_job_failures_total",
    "Failed summary job attempts (retried, or parked after the last attempt).",
    ["outcome"],
)
SUMMARY_JOBS_COMPLETED = Counter(
    "runifold_summary_jobs_completed_total",
    "Summary jobs completed by the background workers.",
)
SUMMARY_PASSES = Counter(
    "runifold_summary_passes_total",
    "Summarizer passes that committed a summary.",
)

# -- memory ------------------------------------------------------------------------
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

# -- models (summarizer, agent model, embeddings) ----------------------------------
MODEL_SECONDS = Histogram(
    "runifold_model_request_seconds",
    "Latency of calls to models.",
    ["purpose", "provider"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
MODEL_TOKENS = Counter(
    "runifold_model_tokens_total",
    "Tokens sent to and received from models.",
    ["purpose", "provider", "direction"],
)
MODEL_ERRORS = Counter(
    "runifold_model_errors_total",
    "Failed model calls.",
    ["purpose", "provider"],
)

# Exported for compatibility only, each beside the metric that replaces it.
DEPRECATED = frozenset({"runifold_memory_index_lag"})
