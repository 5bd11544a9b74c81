"""The model calls' metrics (chat models, and the embedding model through the same
names): latency, tokens, failures, by purpose and provider."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

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
