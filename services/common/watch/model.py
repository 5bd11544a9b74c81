"""The rules and errors every change feed shares (WatchConversation's,
services/transcript/watch/; WatchMemories', services/memory/watch/): the heartbeat
interval a request may ask for, and the refusals of a stream (their reasons are the
same for both; their messages name the RPC and where a client resumes from). No I/O.
"""

from __future__ import annotations

from services.common.errors import Code, DomainError, invalid_argument, resource_exhausted

# A request may ask for heartbeats this often, at the most and at the least.
HEARTBEAT_RANGE_S = (1.0, 300.0)


def heartbeat_interval(heartbeat_s: float, default_s: float) -> float:
    """The heartbeat interval a request asks for (0: the server's `default_s`)."""
    if heartbeat_s == 0:
        return default_s
    low, high = HEARTBEAT_RANGE_S
    if not low <= heartbeat_s <= high:
        raise invalid_argument(
            "INVALID_HEARTBEAT_INTERVAL",
            f"heartbeat_interval must be {low:g} s to {high:g} s (0: the server's default)",
            field="heartbeat_interval",
        )
    return heartbeat_s


def watcher_limit(rpc: str, scope: str, limit: int, retry_after_s: float) -> DomainError:
    """RESOURCE_EXHAUSTED: as many `rpc` streams are open as this process allows (in all,
    or for the namespace: `scope`)."""
    return resource_exhausted(
        "WATCHER_LIMIT",
        f"{limit} {rpc} streams are open on this server"
        + (" for this namespace" if scope == "namespace" else "")
        + ", its limit; retry after the delay in RetryInfo (another replica may have room)",
        retry_after_s=retry_after_s,
        scope=scope,
        limit=limit,
    )


def watcher_too_slow(timeout_s: float, position: str) -> DomainError:
    """RESOURCE_EXHAUSTED: the reader took nothing for too long (it resumes where it was:
    from the last `position` it received)."""
    return resource_exhausted(
        "WATCHER_TOO_SLOW",
        f"the stream took no event for {timeout_s:g} s; watch again from the last "
        f"{position} received to resume",
    )


def shutting_down(position: str) -> DomainError:
    """UNAVAILABLE: this server is stopping; resume on another replica (from the last
    `position` received)."""
    return DomainError(
        Code.UNAVAILABLE,
        "SERVER_SHUTTING_DOWN",
        f"the server is shutting down; watch again from the last {position} received to resume",
    )
