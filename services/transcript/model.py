"""Domain records of the transcript service."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from services.common.domain import Entry, Message, Usage
from services.common.errors import Code, DomainError, aborted, resource_exhausted


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation and its counters."""

    conversation_id: uuid.UUID
    namespace: str
    version: int
    last_sequence: int
    create_time: datetime
    update_time: datetime
    labels: Mapping[str, str] = field(default_factory=dict)
    # Identifies this creation of the id (erasure fencing); grows across re-creation.
    incarnation: int = 0
    # The user it belongs to (None: none), and its state as JSON text ("" when not read).
    user_id: str | None = None
    state_json: str = "{}"


@dataclass(frozen=True, slots=True)
class StateChange:
    """The state changes of a write: each a JSON object's text, already validated (its
    top-level keys replace the stored ones), or None for no change of that scope."""

    conversation: str | None = None
    user: str | None = None
    namespace: str | None = None

    def __bool__(self) -> bool:
        return any(part is not None for part in (self.conversation, self.user, self.namespace))


NO_STATE_CHANGE = StateChange()


@dataclass(frozen=True, slots=True)
class ScopedState:
    """The state of a namespace (user_id "") or of one of its users."""

    user_id: str
    state_json: str = "{}"
    version: int = 0
    update_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class NewAppend:
    """An append as the store receives it (already validated)."""

    namespace: str
    conversation_id: uuid.UUID
    expected_version: int | None
    messages: Sequence[Message]
    request_id: str | None
    payload_hash: bytes
    usage: Usage
    encoded: str  # canonical JSON of `messages` (domain.canonical_json)
    fencing_token: int | None = None  # the turn lease it commits under (request_id = turn id)
    state: StateChange = NO_STATE_CHANGE
    retract: tuple[int, ...] = ()  # sequences of standing entries (with expected_version)
    max_state_bytes: int = 64 * 1024  # each state document once changed


@dataclass(frozen=True, slots=True)
class AppendRecord:
    """A committed append: what one version of a conversation added."""

    version: int
    first_sequence: int
    last_sequence: int
    usage: Usage
    commit_time: datetime
    payload_hash: bytes | None = None


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The result of AppendEntries, first time or replayed."""

    record: AppendRecord
    replayed: bool
    # The versions of the user's and the namespace's state after the write (0: unchanged,
    # or a replay, which does not read them).
    user_state_version: int = 0
    namespace_state_version: int = 0


@dataclass(frozen=True, slots=True)
class ViewRead:
    """What the store reads for a view in one round trip (see TranscriptStore.read_view)."""

    version: int
    last_sequence: int
    entries: Sequence[Entry]
    prior_append: AppendRecord | None
    incarnation: int = 0
    conversation: Conversation | None = None


def view_ranges(
    last: int, window: int, summary_batch: int, summarized_through: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two sequence ranges a view reads at a transcript's `last` sequence: the window
    [low, last] with low = max(1, last - window + 1), and the naive summary buffer
    [summarized_through + 1, min(summarized_through + summary_batch + 1, low - 1)] (one
    entry past the batch, to see whether its end cuts a tool group). An empty range has
    low > high. The PostgreSQL store computes the same in SQL (store.VIEW_SQL), inside the
    statement that reads `last`, so that a view stays one round trip."""
    low = max(1, last - window + 1)
    return (low, last), (
        summarized_through + 1,
        min(summarized_through + summary_batch + 1, low - 1),
    )


@dataclass(frozen=True, slots=True)
class View:
    """The bounded context of a turn, consistent with `version`."""

    version: int
    last_sequence: int
    window: Sequence[Entry]
    summary_buffer: Sequence[Entry]
    summary_backlog: int
    prior_append: AppendRecord | None
    incarnation: int = 0
    conversation: Conversation | None = None


# -- turn leases -------------------------------------------------------------------------


class LeaseMode(enum.IntEnum):
    """How a turn lease shares the conversation. Values equal TurnLeaseMode's."""

    SHARED = 1
    EXCLUSIVE = 2
    QUEUED = 3


@dataclass(frozen=True, slots=True)
class TurnLease:
    """A lease held by a turn: quoted by its append, renewals and release."""

    conversation_id: uuid.UUID
    turn_id: str
    fencing_token: int
    expire_time: datetime
    exclusive: bool
    created: bool = False


@dataclass(frozen=True, slots=True)
class EndedTurn:
    """A turn that ended without appending after its model work completed."""

    output: Sequence[Message]
    usage: Usage
    reason: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    end_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """AcquireTurnLease as the store receives it (validated)."""

    namespace: str
    conversation_id: uuid.UUID
    turn_id: str
    mode: LeaseMode
    ttl_s: float
    payload_hash: bytes
    create_if_missing: bool
    queue_depth: int
    # The waiting row this caller already holds in the queue (QUEUED), if any.
    ticket: int | None = None


@dataclass(frozen=True, slots=True)
class TurnRow:
    """A row of the turns table as the lease rule sees it."""

    turn_id: str
    state: str  # "waiting", "running", "ended" or "committed"
    exclusive: bool
    ticket: int
    payload_hash: bytes
    live: bool  # lease_until has not passed (meaningless for "ended")
    ended: EndedTurn | None = None


@dataclass(frozen=True, slots=True)
class Granted:
    """Grant the lease (EXCLUSIVE when `exclusive`); `takeover` names an expired row replaced."""

    exclusive: bool
    takeover: bool = False


@dataclass(frozen=True, slots=True)
class Enqueue:
    """Take a place in the queue: insert a waiting row."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait (for the turns ahead, or a running turn of the same id), then try again."""

    same_turn: bool


LeaseDecision = Granted | Enqueue | Wait | AppendRecord | EndedTurn


@dataclass(frozen=True, slots=True)
class Waiting:
    """What AcquireTurnLease's store call says when the caller must wait and try again:
    its place in the queue (`ticket`, QUEUED) or None (a running turn of the same id),
    and the conversation's key (what its change notifications name)."""

    same_turn: bool
    ticket: int | None
    key: int = 0


# What one attempt to take a lease comes to.
LeaseAttempt = TurnLease | AppendRecord | EndedTurn | Waiting


def ended_to_json(ended: EndedTurn) -> dict[str, object]:
    """The stored form of an ended turn's outcome."""
    usage = ended.usage
    return {
        "output": [m.canonical() for m in ended.output],
        "usage": [usage.input_tokens, usage.output_tokens, usage.model_calls],
        "reason": ended.reason,
        "metadata": dict(ended.metadata),
    }


def ended_from_json(document: Mapping[str, Any], end_time: datetime | None) -> EndedTurn:
    """An ended turn's outcome read back."""
    return EndedTurn(
        output=tuple(Message.from_canonical(m) for m in document["output"]),
        usage=Usage(*document["usage"]),
        reason=document["reason"],
        metadata=document.get("metadata") or {},
        end_time=end_time,
    )


# Why a waiting caller waits: the metric label and the progress it reports.
WAIT_QUEUE = Wait(same_turn=False)
WAIT_SAME_TURN = Wait(same_turn=True)


def conversation_busy(running_turn_id: str) -> DomainError:
    """ABORTED: another turn runs or waits on the conversation (exclusive leases)."""
    return aborted(
        "CONVERSATION_BUSY",
        "another turn is running on this conversation",
        running_turn_id=running_turn_id,
    )


def turn_lease_lost() -> DomainError:
    """ABORTED: the lease expired or was taken over; the turn can no longer commit."""
    return aborted(
        "TURN_LEASE_LOST", "the turn's lease expired or was taken over; it can no longer commit"
    )


def turn_queue_full(depth: int, retry_after_s: float) -> DomainError:
    """RESOURCE_EXHAUSTED: the conversation's queue of waiting turns is full."""
    return resource_exhausted(
        "TURN_QUEUE_FULL",
        f"{depth} turns already wait on this conversation",
        retry_after_s=retry_after_s,
        queue_depth=depth,
    )


def conversation_not_found() -> DomainError:
    """The one NOT_FOUND of this service; the same whether it never existed or is elsewhere."""
    return DomainError(Code.NOT_FOUND, "CONVERSATION_NOT_FOUND", "conversation not found")


def no_user() -> DomainError:
    """FAILED_PRECONDITION: a write changes the user's state of a conversation without one."""
    return DomainError(
        Code.FAILED_PRECONDITION,
        "NO_USER",
        "the conversation has no user_id, so a write to it cannot change a user's state",
        field="state_delta.user_json",
    )


def entry_not_retractable(sequence: int) -> DomainError:
    """FAILED_PRECONDITION: a retraction names an entry that is missing, already
    retracted, or part of a tool call group."""
    return DomainError(
        Code.FAILED_PRECONDITION,
        "ENTRY_NOT_RETRACTABLE",
        f"entry {sequence} cannot be retracted: it does not exist, is already retracted, "
        "or holds tool calls or a tool result",
        metadata={"sequence": sequence},
        field="retract_sequences",
    )


def state_too_large(scope: str, limit: int) -> DomainError:
    """INVALID_ARGUMENT: a state document would exceed its limit once changed."""
    return DomainError(
        Code.INVALID_ARGUMENT,
        "STATE_TOO_LARGE",
        f"the {scope} state would exceed {limit} bytes",
        metadata={"limit_bytes": limit, "scope": scope},
        field=f"state_delta.{scope}_json",
    )


def request_id_reused(field_name: str = "request_id") -> DomainError:
    """The request (or turn) id was used before with another payload."""
    return DomainError(
        Code.INVALID_ARGUMENT,
        "REQUEST_ID_REUSED",
        f"{field_name} was already used with a different payload",
        field=field_name,
    )


def decide_lease(
    request: LeaseRequest,
    own: TurnRow | None,
    others: Sequence[TurnRow],
    prior: AppendRecord | None,
) -> LeaseDecision:
    """The lease rule, applied by a store while it holds the conversation locked.

    `own` is the row of the requested turn id (any state); `others` the live
    waiting and running rows of other turn ids. One turn id runs once: a committed
    turn replays (`prior`), an ended one returns its outcome, a live one is waited
    for; an expired one is taken over. Then the mode: SHARED is granted at once;
    EXCLUSIVE only when nothing else runs or waits (else CONVERSATION_BUSY);
    QUEUED waits in ticket order, bounded by `queue_depth` (else TURN_QUEUE_FULL).
    """
    if prior is not None:
        return prior
    takeover = False
    mine_waiting = False
    if own is not None:
        if own.payload_hash != request.payload_hash:
            raise request_id_reused("turn_id")
        if own.state == "ended":
            assert own.ended is not None
            return own.ended
        if own.state == "committed":  # its append is not visible to this read yet
            return WAIT_SAME_TURN
        if own.live and not (own.state == "waiting" and own.ticket == request.ticket):
            return WAIT_SAME_TURN
        mine_waiting = own.live
        takeover = not own.live
    if request.mode == LeaseMode.SHARED:
        return Granted(exclusive=False, takeover=takeover)
    running = [row for row in others if row.state == "running"]
    waiting = sorted((row for row in others if row.state == "waiting"), key=lambda r: r.ticket)
    if request.mode == LeaseMode.EXCLUSIVE:
        if running or waiting:
            raise conversation_busy((running or waiting)[0].turn_id)
        return Granted(exclusive=True, takeover=takeover)
    if not mine_waiting:
        if not running and not waiting:
            return Granted(exclusive=True, takeover=takeover)
        if len(waiting) >= request.queue_depth:
            raise turn_queue_full(len(waiting), retry_after_s=1.0)
        return Enqueue()
    assert request.ticket is not None
    if running or any(row.ticket < request.ticket for row in waiting):
        return WAIT_QUEUE
    return Granted(exclusive=True, takeover=takeover)
