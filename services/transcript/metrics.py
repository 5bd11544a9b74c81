"""TranscriptService's metrics: appends, turn leases and the change feed (names and
labels bounded, as services/common/metrics.py says)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
TURNS_INTERRUPTED = Counter(
    "runifold_turns_interrupted_total",
    "Turns whose holder lost its lease after it began its model call, before it committed: "
    "ended as TURN_INTERRUPTED (never run again under their turn_id; their outcome is lost). "
    "Holders paused or cut off longer than their lease's TTL.",
)
TURN_LEASE_RETRIES = Counter(
    "runifold_turn_lease_retries_total",
    "Tries of a call waiting for a turn lease, by what started them: a change of its "
    "conversation heard here or announced by another replica (cause=woken), or the "
    "safety net every RUNIFOLD_TURN_WAIT_POLL_S (cause=poll).",
    ["cause"],
)
TURNS_WAITING = Gauge(
    "runifold_turns_waiting",
    "Turns waiting in this process for a lease: in a conversation's queue (why=queue) or "
    "for a running turn with the same turn_id (why=same_turn).",
    ["why"],
)
TURN_LEASE_EXPIRIES = Counter(
    "runifold_turn_lease_expiries_total",
    "Turn leases that lapsed (the holder died or stalled): taken over, or, when the "
    "holder had begun its model call, interrupted (runifold_turns_interrupted_total).",
)
TURN_FENCING_TOKEN_REFUSALS = Counter(
    "runifold_turn_fencing_token_refusals_total",
    "Appends refused because the turn lease they quoted expired or was taken over "
    "(TURN_LEASE_LOST): a turn that lost its lease tried to commit.",
)

# -- change feed: WatchConversation ----------------------------------------------------
WATCHERS = Gauge(
    "runifold_watchers",
    "WatchConversation streams open in this process.",
)
WATCH_EVENTS = Counter(
    "runifold_watch_events_total",
    "Events delivered to WatchConversation streams "
    "(event=appended|retracted|turn_started|turn_finished|heartbeat|erased).",
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
WATCH_BUFFERED_BYTES = Gauge(
    "runifold_watch_buffered_bytes",
    "Bytes of entries WatchConversation streams hold in this process: read and not yet "
    "taken by the transport (at most RUNIFOLD_WATCH_MAX_BUFFERED_BYTES, and "
    "RUNIFOLD_WATCH_MAX_BUFFERED_BYTES_PER_NAMESPACE a namespace).",
)
WATCH_BUDGET_WAITS = Counter(
    "runifold_watch_budget_waits_total",
    "Reads of WatchConversation streams that had to wait for room in the byte budget "
    "(their namespace's or the process's: readers that do not take what they were sent).",
)
WATCH_BUDGET_WAITING = Gauge(
    "runifold_watch_budget_waiting",
    "WatchConversation streams waiting now for room in the byte budget before a read.",
)
