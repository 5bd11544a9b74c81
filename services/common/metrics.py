"""Prometheus metrics: the standard gRPC server metrics and shared domain metrics.

Label values are bounded: service and method names, status codes, store names.
Never a namespace, a conversation id or any content.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

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
STORE_ERRORS = Counter(
    "runifold_store_errors_total",
    "Store operations that failed because a store was unavailable.",
    ["store"],
)
