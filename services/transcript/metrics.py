"""TranscriptService's metrics: appends and turn leases (names and labels bounded, as
services/common/metrics.py says)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

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
