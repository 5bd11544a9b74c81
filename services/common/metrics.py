"""Prometheus metrics of the floor: the standard gRPC server metrics, health, stores and
load shedding, which every process exports.

Each service's domain metrics live with it (services/<service>/metrics.py, the model
calls' in services/llm/metrics.py): a metric is registered, and exported on /metrics,
in every process that imports its service, the all-in-one server included. The names
are what dashboards and alert rules (deploy/) query; tests/ops checks them against
every metrics module. Label values are bounded: service and method names, status
codes, store names, fixed enums. Never a namespace, a conversation id or any content.
A module's DEPRECATED set names the series it exports for compatibility only.
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
    "resource=search|turn|summarize|upsert|propose|curate|turn_wait), over its share of the "
    "embedding model (reason=NAMESPACE_SHARE_EXCEEDED), a full queue in front of a slow "
    "resource (reason=OVERLOADED, resource=embeddings|model), WatchConversation and "
    "WatchMemories streams beyond a limit (reason=WATCHER_LIMIT, resource=watchers), or "
    "calls waiting for a turn "
    "lease beyond a limit (reason=TURN_WAITERS_LIMIT, resource=lease_wait).",
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
    "(resource=embeddings), calls for a chat model (resource=model), calls for a "
    "PostgreSQL connection when every one of the pool's is busy (resource=database).",
    ["resource"],
)
ADMITTED_IN_FLIGHT = Gauge(
    "runifold_admitted_in_flight",
    "Admission-controlled calls in flight, all namespaces together, by kind "
    "(resource=search|turn|summarize|upsert|propose), and turns waiting for their lease "
    "(resource=turn_wait).",
    ["resource"],
)
