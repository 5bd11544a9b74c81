"""AppendEntries: what a write carries besides its messages (its state changes, the
entries it retracts, and the digest that binds them to its request id), the append as
the store receives it, and the errors of its rules. Pure rules: no I/O.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from services.common.domain import Message, Usage, payload_hash
from services.common.errors import Code, DomainError, invalid_argument
from services.transcript.config import MAX_RETRACTIONS
from services.transcript.conversations.model import NO_STATE_CHANGE, AppendRecord, StateChange


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
    # Its canonical bytes after the header (digests.model.body); None: no digest (the
    # benchmark's baseline only).
    digest_body: bytes | None = None


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The result of AppendEntries, first time or replayed."""

    record: AppendRecord
    replayed: bool
    # The versions of the user's and the namespace's state after the write (0: unchanged,
    # or a replay, which does not read them).
    user_state_version: int = 0
    namespace_state_version: int = 0


def write_digest(encoded: str, state: StateChange, retract: Sequence[int]) -> bytes:
    """What a request id's payload is: the messages, and the state changes and
    retractions when there are any (a write with neither hashes as it always did)."""
    if not state and not retract:
        return payload_hash(encoded)
    extras = json.dumps(
        [state.conversation, state.user, state.namespace, list(retract)], separators=(",", ":")
    )
    return payload_hash(encoded + "\n" + extras)


def retractions(retract: Sequence[int], expected_version: int | None) -> tuple[int, ...]:
    """The sequences a write retracts, checked: distinct, positive, at most
    MAX_RETRACTIONS, and only with an expected version."""
    if not retract:
        return ()
    if len(retract) > MAX_RETRACTIONS:
        raise invalid_argument(
            "TOO_MANY_RETRACTIONS",
            f"retract_sequences holds at most {MAX_RETRACTIONS} sequences",
            field="retract_sequences",
            limit=MAX_RETRACTIONS,
        )
    if min(retract) < 1 or len(set(retract)) != len(retract):
        raise invalid_argument(
            "INVALID_SEQUENCE",
            "retract_sequences must be distinct sequences of the transcript (1-based)",
            field="retract_sequences",
        )
    if expected_version is None:
        raise invalid_argument(
            "EXPECTED_VERSION_REQUIRED",
            "a write that retracts entries names the version it read (expected_version)",
            field="expected_version",
        )
    return tuple(sorted(retract))


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
