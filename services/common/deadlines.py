"""The inbound request's deadline, for domain code that calls out or waits.

The server interceptor records each RPC's deadline here; domain code bounds
every outbound call and every wait by what is left of it. No transport
import: the domain layers use this without knowing gRPC.
"""

from __future__ import annotations

import contextvars
import time

from services.common.errors import Code, DomainError

# Absolute time.monotonic() deadline of the inbound RPC being served, if any.
deadline_var: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "deadline", default=None
)

DEFAULT_PEER_TIMEOUT_S = 10.0


def deadline_exceeded(message: str = "the request deadline passed") -> DomainError:
    """DEADLINE_EXCEEDED: the caller's time is up."""
    return DomainError(Code.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", message)


def remaining(timeout: float = DEFAULT_PEER_TIMEOUT_S) -> float:
    """Seconds an outbound call may take: `timeout`, capped by the inbound deadline."""
    deadline = deadline_var.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise deadline_exceeded()
    return min(timeout, left)


def time_left() -> float | None:
    """Seconds left of the inbound call's deadline (0 once passed), None without one."""
    deadline = deadline_var.get()
    return None if deadline is None else max(0.0, deadline - time.monotonic())
