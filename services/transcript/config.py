"""TranscriptService settings, from environment variables (documented in docs/transcript.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from services.common import jsonb
from services.common.messages import MAX_MESSAGE_BYTES, MessageLimits
from services.common.settings import Env, SettingsError, env_float, env_int
from services.transcript.checkpoints.model import CheckpointLimits

# RUNIFOLD_MAX_STATE_BYTES: one state document's limit.
DEFAULT_STATE_BYTES = 64 * 1024
# Entries one write may retract.
MAX_RETRACTIONS = 256
# WatchConversation's byte budget (RUNIFOLD_WATCH_MAX_BUFFERED_BYTES*): 64 MiB for the
# process, 16 MiB a namespace. docs/operations.md turns them into the pod's memory.
DEFAULT_BUFFERED_BYTES = 64 * 1024 * 1024
DEFAULT_BUFFERED_BYTES_PER_NAMESPACE = 16 * 1024 * 1024
# What a page holds per entry beside its content, charged with it: the entry's Python
# objects (Entry, Message, their fields) and its framing on the wire.
ENTRY_OVERHEAD_BYTES = 1024


@dataclass(frozen=True)
class WatchLimits:
    """The limits of WatchConversation (services/transcript/watch/; docs/transcript.md)."""

    # Streams open at once in this process, and per namespace in this process.
    max_watchers: int = 512
    max_watchers_per_namespace: int = 128
    # A quiet stream gets a heartbeat this often (a request may ask for 1 s to 5 min).
    heartbeat_s: float = 30.0
    # How often the process looks at every watched conversation without being woken (the
    # safety net of a missed notification) and renews their `watched_until`.
    poll_s: float = 5.0
    # A message the client has not taken within this time ends the stream
    # (RESOURCE_EXHAUSTED / WATCHER_TOO_SLOW); the client resumes from its last sequence.
    send_timeout_s: float = 30.0
    # One read of a watcher: at most this many entries, and about this many bytes.
    page_entries: int = 256
    page_bytes: int = 512 * 1024
    # The retry delay (RetryInfo) of a stream refused beyond a watcher limit.
    retry_after_s: float = 5.0
    # The bytes of the pages streams hold at once (read and not yet taken by the
    # transport), in this process and per namespace in it; a stream waits for room
    # before it reads (services/common/byte_budget.py).
    max_buffered_bytes: int = DEFAULT_BUFFERED_BYTES
    max_buffered_bytes_per_namespace: int = DEFAULT_BUFFERED_BYTES_PER_NAMESPACE
    # The largest entry a page may end with (RUNIFOLD_MAX_MESSAGE_BYTES).
    max_entry_bytes: int = MAX_MESSAGE_BYTES

    @property
    def page_charge(self) -> int:
        """The most bytes one page is charged (what a stream reserves before it reads):
        `page_bytes` of entries, then the entry that crosses it, and each entry's share
        of what the stream holds beside its content."""
        return self.page_bytes + self.max_entry_bytes + self.page_entries * ENTRY_OVERHEAD_BYTES

    @classmethod
    def from_env(cls, env: Env, max_entry_bytes: int = MAX_MESSAGE_BYTES) -> WatchLimits:
        per_namespace = env_int(
            env,
            "RUNIFOLD_WATCH_MAX_BUFFERED_BYTES_PER_NAMESPACE",
            DEFAULT_BUFFERED_BYTES_PER_NAMESPACE,
            minimum=1,
        )
        total = env_int(env, "RUNIFOLD_WATCH_MAX_BUFFERED_BYTES", DEFAULT_BUFFERED_BYTES, minimum=1)
        limits = cls(
            max_watchers=env_int(
                env, "RUNIFOLD_WATCH_MAX_WATCHERS", 512, minimum=1, maximum=100_000
            ),
            max_watchers_per_namespace=env_int(
                env, "RUNIFOLD_WATCH_MAX_WATCHERS_PER_NAMESPACE", 128, minimum=1, maximum=100_000
            ),
            heartbeat_s=env_float(
                env, "RUNIFOLD_WATCH_HEARTBEAT_S", 30.0, minimum=1.0, maximum=300.0
            ),
            poll_s=env_float(env, "RUNIFOLD_WATCH_POLL_S", 5.0, minimum=0.1, maximum=3600.0),
            send_timeout_s=env_float(
                env, "RUNIFOLD_WATCH_SEND_TIMEOUT_S", 30.0, minimum=0.1, maximum=3600.0
            ),
            max_buffered_bytes=total,
            max_buffered_bytes_per_namespace=per_namespace,
            max_entry_bytes=max_entry_bytes,
        )
        # A namespace must have room for one page, and the process for a namespace's share.
        if per_namespace < limits.page_charge:
            raise SettingsError(
                f"RUNIFOLD_WATCH_MAX_BUFFERED_BYTES_PER_NAMESPACE ({per_namespace}) must be at "
                f"least one page of a stream, {limits.page_charge} bytes (512 KiB, the "
                "largest entry, RUNIFOLD_MAX_MESSAGE_BYTES, and 256 entries' overhead)"
            )
        if total < per_namespace:
            raise SettingsError(
                f"RUNIFOLD_WATCH_MAX_BUFFERED_BYTES ({total}) must be at least "
                f"RUNIFOLD_WATCH_MAX_BUFFERED_BYTES_PER_NAMESPACE ({per_namespace})"
            )
        return limits


@dataclass(frozen=True)
class TranscriptLimits:
    """Explicit limits of the transcript and its turn leases; each breach is refused."""

    max_messages_per_append: int = 256
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_append_bytes: int = 4 * 1024 * 1024
    max_tool_calls_per_message: int = 64
    # How deep a client's JSON document may nest (native_json, state deltas).
    max_json_depth: int = jsonb.MAX_DEPTH
    # Turns that may wait on one conversation (TURN_LEASE_MODE_QUEUED).
    turn_queue_depth: int = 16
    # How long the outcome of a turn that ended without committing is kept.
    turn_outcome_retention_s: float = 24 * 3600.0
    # How long an erasure receipt is kept after it was first recorded (a year).
    erasure_receipt_retention_s: float = 365 * 24 * 3600.0
    # How often a waiting turn looks again when nothing woke it: the safety net of a
    # missed notification (and what keeps its place in a queue, which lapses after 10 s).
    turn_wait_poll_s: float = 2.0
    # Calls waiting for a lease in this process, per conversation and per namespace.
    turn_waiters_per_conversation: int = 32
    turn_waiters_per_namespace: int = 64
    # The longest a turn waits for a lease when its caller set no earlier deadline.
    turn_wait_max_s: float = 600.0
    # Each state document (a conversation's, a user's, a namespace's) once changed.
    max_state_bytes: int = DEFAULT_STATE_BYTES
    watch: WatchLimits = field(default_factory=WatchLimits)
    # LangGraph checkpoints (services/transcript/checkpoints/).
    checkpoints: CheckpointLimits = field(default_factory=CheckpointLimits)
    messages: MessageLimits = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "messages",
            MessageLimits(
                self.max_messages_per_append,
                self.max_message_bytes,
                self.max_append_bytes,
                self.max_tool_calls_per_message,
                self.max_json_depth,
            ),
        )

    @property
    def write_extras_bytes(self) -> int:
        """The most a write carries beside its messages: three state deltas (each at
        most a state document) and the retracted sequences (tag and varint each)."""
        return 3 * (self.max_state_bytes + 8) + MAX_RETRACTIONS * 11

    @property
    def tool_group_bound(self) -> int:
        """Most entries one tool call group spans: the call plus one result per call."""
        return self.max_tool_calls_per_message + 1

    @classmethod
    def from_env(cls, env: Env | None = None) -> TranscriptLimits:
        env = os.environ if env is None else env
        messages = MessageLimits.from_env(env)
        return cls(
            max_messages_per_append=messages.max_messages_per_append,
            max_message_bytes=messages.max_message_bytes,
            max_append_bytes=messages.max_append_bytes,
            max_tool_calls_per_message=messages.max_tool_calls_per_message,
            max_json_depth=messages.max_json_depth,
            turn_queue_depth=env_int(env, "RUNIFOLD_TURN_QUEUE_DEPTH", 16, minimum=1, maximum=1024),
            turn_outcome_retention_s=env_float(
                env, "RUNIFOLD_TURN_OUTCOME_RETENTION_S", 24 * 3600.0, minimum=60.0
            ),
            erasure_receipt_retention_s=env_float(
                env, "RUNIFOLD_ERASURE_RECEIPT_RETENTION_S", 365 * 24 * 3600.0, minimum=60.0
            ),
            turn_wait_poll_s=env_float(
                env, "RUNIFOLD_TURN_WAIT_POLL_S", 2.0, minimum=0.005, maximum=5.0
            ),
            turn_waiters_per_conversation=env_int(
                env, "RUNIFOLD_TURN_MAX_WAITERS_PER_CONVERSATION", 32, minimum=1, maximum=10_000
            ),
            turn_waiters_per_namespace=env_int(
                env, "RUNIFOLD_TURN_MAX_WAITERS_PER_NAMESPACE", 64, minimum=1, maximum=100_000
            ),
            turn_wait_max_s=env_float(
                env, "RUNIFOLD_TURN_WAIT_MAX_S", 600.0, minimum=1.0, maximum=3600.0
            ),
            max_state_bytes=env_int(
                env,
                "RUNIFOLD_MAX_STATE_BYTES",
                DEFAULT_STATE_BYTES,
                minimum=1024,
                maximum=1024 * 1024,
            ),
            watch=WatchLimits.from_env(env, messages.max_message_bytes),
            checkpoints=checkpoint_limits_from_env(env, messages.max_append_bytes),
        )


def checkpoint_limits_from_env(env: Env, append: int) -> CheckpointLimits:
    """The limits of checkpoints (RUNIFOLD_CHECKPOINT_*)."""
    blob = env_int(
        env,
        "RUNIFOLD_CHECKPOINT_MAX_BLOB_BYTES",
        2 * 1024 * 1024,
        minimum=1024,
        maximum=64 * 1024 * 1024,
    )
    whole = env_int(
        env,
        "RUNIFOLD_CHECKPOINT_MAX_BYTES",
        8 * 1024 * 1024,
        minimum=1024,
        maximum=256 * 1024 * 1024,
    )
    if blob > append:
        # A value is carried by one put, which carries at most an append's bytes.
        raise SettingsError(
            f"RUNIFOLD_CHECKPOINT_MAX_BLOB_BYTES ({blob}) must be at most "
            f"RUNIFOLD_MAX_APPEND_BYTES ({append})"
        )
    if whole < blob:
        raise SettingsError(
            f"RUNIFOLD_CHECKPOINT_MAX_BYTES ({whole}) must be at least "
            f"RUNIFOLD_CHECKPOINT_MAX_BLOB_BYTES ({blob})"
        )
    return CheckpointLimits(
        max_blob_bytes=blob,
        max_metadata_bytes=env_int(
            env,
            "RUNIFOLD_CHECKPOINT_MAX_METADATA_BYTES",
            64 * 1024,
            minimum=1024,
            maximum=1024 * 1024,
        ),
        max_values_per_call=env_int(
            env, "RUNIFOLD_CHECKPOINT_MAX_VALUES_PER_CALL", 256, minimum=1, maximum=10_000
        ),
        max_checkpoint_bytes=whole,
        max_page_size=env_int(
            env, "RUNIFOLD_CHECKPOINT_MAX_PAGE_SIZE", 100, minimum=1, maximum=1000
        ),
    )
