"""Conversations: the records every feature of the transcript service reads or writes,
and their rules. No I/O.

A conversation with its counters; the record of each version it committed
(`AppendRecord`: what appends return, views report and turn leases replay); the
state of a conversation, of its user and of its namespace; and the errors every
feature answers with (CONVERSATION_NOT_FOUND, REQUEST_ID_REUSED, STATE_TOO_LARGE).
The features (appends/, views/, leases/, watch/) build on this one and never on
each other in a circle.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from services.common import jsonb, validation
from services.common.domain import Usage
from services.common.errors import Code, DomainError, invalid_argument
from services.transcript.receipts.model import ErasureReceipt

# A user id: like a label value, short and without NUL.
MAX_USER_ID_CHARS = 128

# A listing's preview of a conversation (Conversation.preview): its first user message
# among its first PREVIEW_ENTRIES entries, clipped to PREVIEW_CHARS characters. The
# search stops at PREVIEW_ENTRIES so that a preview is one bounded index probe, whatever
# the conversation holds (one made only of tool traffic would be a scan otherwise).
PREVIEW_ENTRIES = 16
PREVIEW_CHARS = 200
PREVIEW_ELLIPSIS = "\u2026"


class ConversationOrder(enum.IntEnum):
    """The order of a listing of conversations (values as in the proto's enum)."""

    ID = 1
    NEWEST_FIRST = 2


@dataclass(frozen=True, slots=True)
class ForkOrigin:
    """Where a fork came from: its source, and the last sequence of the source it shares."""

    conversation_id: uuid.UUID
    through_sequence: int


@dataclass(frozen=True, slots=True)
class Segment:
    """A part of a fork's shared prefix held by a conversation of its lineage: the entries
    through `through_sequence` and the appends through `through_version` (each after the
    previous segment's). `key` is the store's name of the conversation holding them."""

    key: int
    through_sequence: int
    through_version: int


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
    # Identifies this creation of the id (what an erasure's tombstone names); grows across
    # re-creation.
    incarnation: int = 0
    # The user it belongs to (None: none), and its state as JSON text ("" when not read).
    user_id: str | None = None
    state_json: str = "{}"
    # Entries through this sequence were read by automatic curation (MarkCurated).
    curated_through: int = 0
    # Listings only: the start of its first user message (see preview()); "" elsewhere.
    preview: str = ""
    # Set on a fork (ForkConversation): where it came from, and the segments of the prefix
    # it shares with its lineage (the store reads its entries there).
    fork_origin: ForkOrigin | None = None
    prefix: tuple[Segment, ...] = ()
    # The digest of its newest append (b"": none yet, or only appends from before digests).
    head_digest: bytes = b""

    @property
    def prefix_end(self) -> int:
        """The last sequence of the shared prefix (0: no fork, every entry is its own)."""
        return self.prefix[-1].through_sequence if self.prefix else 0


@dataclass(frozen=True, slots=True)
class AppendRecord:
    """A committed append: what one version of a conversation added."""

    version: int
    first_sequence: int
    last_sequence: int
    usage: Usage
    commit_time: datetime
    payload_hash: bytes | None = None
    # Its digest in the conversation's chain (b"": recorded before digests, or not read).
    digest: bytes = b""


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
class Deletion:
    """What DeleteConversation did: whether it deleted the conversation, the entries and
    appends it erased, and the erasure receipt it recorded (when asked for one)."""

    deleted: bool
    entries: int = 0
    appends: int = 0
    receipt: ErasureReceipt | None = None
    forks: int = 0  # its forks (and theirs) erased with it
    checkpoints: int = 0  # its LangGraph checkpoints, and its forks'


def user_id(value: str, field: str = "user_id") -> str:
    """A user id: 1..128 characters without NUL (INVALID_USER_ID)."""
    if not 1 <= len(value) <= MAX_USER_ID_CHARS or "\x00" in value:
        raise invalid_argument(
            "INVALID_USER_ID",
            f"{field} must be 1..{MAX_USER_ID_CHARS} characters without NUL",
            field=field,
        )
    return value


def preview(text: str | None) -> str:
    """A listing's preview of a message text: its whitespace runs made single spaces, at
    most PREVIEW_CHARS characters, an ellipsis in place of what was cut. The text is the
    user's, untrusted: it is clipped, never interpreted."""
    if not text:
        return ""
    # The store reads one character more than is shown, to know whether it was cut.
    flat = " ".join(text.split())
    if len(flat) <= PREVIEW_CHARS and len(text) <= PREVIEW_CHARS:
        return flat
    return flat[: PREVIEW_CHARS - 1].rstrip() + PREVIEW_ELLIPSIS


def state_change(
    conversation_json: str,
    user_json: str,
    namespace_json: str,
    max_bytes: int,
    field: str,
    max_depth: int = jsonb.MAX_DEPTH,
) -> StateChange:
    """A write's state changes: each a JSON object by jsonb's rules, of at most
    `max_bytes` and `max_depth` levels (empty: none)."""
    parts: list[str | None] = []
    for scope, text in (
        ("conversation", conversation_json),
        ("user", user_json),
        ("namespace", namespace_json),
    ):
        if not text:
            parts.append(None)
            continue
        name = f"{field}.{scope}_json"
        if len(text.encode("utf-8", "surrogatepass")) > max_bytes:
            raise invalid_argument(
                "STATE_TOO_LARGE",
                f"{name} exceeds {max_bytes} bytes",
                field=name,
                limit_bytes=max_bytes,
                scope=scope,
            )
        validation.json_object(text, name, "INVALID_STATE", max_depth=max_depth)
        parts.append(text)
    return StateChange(*parts)


def conversation_not_found() -> DomainError:
    """The one NOT_FOUND of this service; the same whether it never existed or is elsewhere."""
    return DomainError(Code.NOT_FOUND, "CONVERSATION_NOT_FOUND", "conversation not found")


def conversation_erased() -> DomainError:
    """NOT_FOUND: the conversation a call waited on was erased meanwhile (it may have been
    made again under its id: that is another conversation)."""
    return DomainError(
        Code.NOT_FOUND,
        "CONVERSATION_ERASED",
        "the conversation was erased while this call waited for its turn lease",
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


def curated_through_out_of_range(last_sequence: int) -> DomainError:
    """INVALID_ARGUMENT: MarkCurated names a sequence past the transcript's end."""
    return invalid_argument(
        "SEQUENCE_OUT_OF_RANGE",
        f"curated_through is past the last entry ({last_sequence})",
        field="curated_through",
        last_sequence=last_sequence,
    )


def incarnation_erased() -> DomainError:
    """NOT_FOUND: the incarnation a call names is no longer the conversation's (it was
    erased, perhaps made again under its id: that is another conversation)."""
    return DomainError(
        Code.NOT_FOUND,
        "CONVERSATION_ERASED",
        "the incarnation named was erased (the conversation may have been made again)",
    )
