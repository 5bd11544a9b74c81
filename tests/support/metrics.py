"""Samples of this process's own Prometheus registry (metrics of in-process servers and
parts; a service process's /metrics: process.py)."""

from __future__ import annotations

from prometheus_client import REGISTRY


def shed(resource: str, reason: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "runifold_requests_shed_total", {"resource": resource, "reason": reason}
        )
        or 0.0
    )
