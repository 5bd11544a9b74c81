"""Turn leases: one model call per turn id, exclusive and queued turns. The records of a
lease, its errors, and the rule that decides one (`decide_lease`, applied by a store
while it holds the conversation). Pure rules: no I/O.

Two numbers, never one for the other: a lease's fencing token (`fencing_token`,
random per grant), which its append, renewals and release quote (one that quotes
another is refused); and a waiting turn's ticket (`ticket`), its place in the
conversation's queue (from one sequence for every conversation, never shown to
clients).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from services.common.domain import Message, Usage
from services.common.errors import DomainError, aborted, resource_exhausted
from services.transcript.conversations.model import AppendRecord, request_id_reused


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
    # How long an interrupted turn's outcome is kept (RUNIFOLD_TURN_OUTCOME_RETENTION_S).
    outcome_retention_s: float = 24 * 3600.0
    # The conversation a waiting caller found first (its key): one found under the same
    # id later is another conversation (the first was erased), and the wait ends.
    conversation_key: int | None = None


@dataclass(frozen=True, slots=True)
class TurnRow:
    """A row of the turns table as the lease rule sees it."""

    turn_id: str
    state: str  # "waiting", "running", "ended" or "committed"
    exclusive: bool
    ticket: int | None  # its place in the queue: "waiting" only
    fencing_token: int | None  # its grant's: every state but "waiting"
    payload_hash: bytes
    live: bool  # lease_until has not passed (meaningless for "ended")
    ended: EndedTurn | None = None
    # Its holder said it began the model call (running rows only).
    model_called: bool = False


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


# The reason an interrupted turn ended with: its holder began the model call, then lost
# its lease before it committed. Its outcome is unknown, and nobody runs it again.
TURN_INTERRUPTED = "TURN_INTERRUPTED"


def interrupted() -> EndedTurn:
    """The outcome of a turn whose holder lost its lease during its model call."""
    return EndedTurn(output=(), usage=Usage(), reason=TURN_INTERRUPTED)


def turn_queue_full(depth: int, retry_after_s: float) -> DomainError:
    """RESOURCE_EXHAUSTED: the conversation's queue of waiting turns is full."""
    return resource_exhausted(
        "TURN_QUEUE_FULL",
        f"{depth} turns already wait on this conversation",
        retry_after_s=retry_after_s,
        queue_depth=depth,
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
    for; an expired one is taken over, unless its holder had begun its model call
    (then it is interrupted: `interrupted()`, which the store keeps as its outcome, so
    that the model never runs twice for one turn id). Then the mode: SHARED is granted
    at once;
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
        if own.state == "running" and own.model_called:
            return interrupted()
        mine_waiting = own.live
        takeover = not own.live
    if request.mode == LeaseMode.SHARED:
        return Granted(exclusive=False, takeover=takeover)
    running = [row for row in others if row.state == "running"]
    waiting = sorted((row for row in others if row.state == "waiting"), key=_place)
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
    if running or any(_place(row) < request.ticket for row in waiting):
        return WAIT_QUEUE
    return Granted(exclusive=True, takeover=takeover)


def _place(row: TurnRow) -> int:
    """A waiting turn's place in the queue (every waiting row has a ticket)."""
    assert row.ticket is not None
    return row.ticket
