"""Domain records of the orchestrator."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from services.common.domain import Budget, Entry, Message, ToolCall, ToolDefinition, Usage
from services.common.errors import Code, DomainError


class ConcurrencyMode(enum.IntEnum):
    """How a turn shares its conversation with other turns; values equal ConcurrencyMode's."""

    RACE = 1
    REJECT = 2
    ENQUEUE = 3


class SummaryMode(enum.IntEnum):
    """What a turn does with unsummarized entries outside the window."""

    REQUIRE = 1
    AUTO = 2


class CurationMode(enum.IntEnum):
    """Whether a turn's entries are curated into memory after it commits; values equal
    CurationMode's (0, unspecified: the namespace's default)."""

    OFF = 1
    AUTO = 2


@dataclass(frozen=True, slots=True)
class Policy:
    """Context bounds of a turn (already defaulted and validated)."""

    window: int
    summary_batch: int
    memory_limit: int
    summary_mode: SummaryMode
    max_summary_passes: int
    # Resolved: the policy's, else the namespace's default.
    curation: CurationMode = CurationMode.OFF


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn as requested."""

    namespace: str
    conversation_id: str
    input: Sequence[Message]
    turn_id: str
    policy: Policy
    budget: Budget
    system_instructions: str = ""
    create_if_missing: bool = False
    tools: Sequence[ToolDefinition] = ()
    concurrency: ConcurrencyMode = ConcurrencyMode.RACE


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the model produced and what it cost (summarization included)."""

    output: Sequence[Message]
    usage: Usage


@dataclass(frozen=True, slots=True)
class ContextReport:
    """What the model was given (identifiers and counts only)."""

    summary_through_sequence: int = 0
    memory_ids: Sequence[str] = ()
    window_first_sequence: int = 0
    window_last_sequence: int = 0
    summary_passes: int = 0
    memory_degraded: bool = False


@dataclass(frozen=True, slots=True)
class TurnResult:
    """A committed turn."""

    conversation_id: str
    conversation_version: int
    first_sequence: int
    last_sequence: int
    outcome: Outcome
    tool_calls: Sequence[ToolCall]
    context: ContextReport
    replayed: bool = False
    created: bool = False


class Stage(enum.IntEnum):
    """Progress of a turn; values equal TurnStage's."""

    LOADING_CONTEXT = 1
    SUMMARIZING = 2
    RETRIEVING_MEMORY = 3
    CALLING_MODEL = 4
    COMMITTING = 5
    WAITING = 6


@dataclass(frozen=True, slots=True)
class Progress:
    """A stage was reached."""

    stage: Stage


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Model text as it streams (not yet committed)."""

    text: str


TurnEvent = Progress | TextDelta | TurnResult


class TurnNotCommitted(DomainError):
    """ABORTED: the turn's model work completed but its append could not commit; the
    completed outcome travels with the error (the TurnConflict detail)."""

    def __init__(
        self,
        reason: str,
        message: str,
        outcome: Outcome,
        current_version: int,
        expected_version: int,
        **metadata: object,
    ) -> None:
        super().__init__(
            Code.ABORTED,
            reason,
            message,
            metadata={
                "current_version": current_version,
                "expected_version": expected_version,
                **metadata,
            },
        )
        self.outcome = outcome
        self.current_version = current_version
        self.expected_version = expected_version


class TurnConflict(TurnNotCommitted):
    """ABORTED / TURN_CONFLICT: another writer committed first; the outcome is returned."""

    def __init__(self, outcome: Outcome, current_version: int, expected_version: int) -> None:
        super().__init__(
            "TURN_CONFLICT",
            f"the conversation moved to version {current_version} while the turn ran at "
            f"{expected_version}; the completed outcome is attached and was not committed",
            outcome,
            current_version,
            expected_version,
        )


class ModelOutputInvalid(DomainError):
    """FAILED_PRECONDITION / MODEL_OUTPUT_INVALID: the model's reply breaks the
    transcript's limits, so it was not appended; the outcome travels with the error."""

    def __init__(self, outcome: Outcome, violations: Sequence[str]) -> None:
        super().__init__(
            Code.FAILED_PRECONDITION,
            "MODEL_OUTPUT_INVALID",
            "the model's reply breaks the transcript's limits and was not appended; the "
            "completed outcome is attached",
            metadata={"violations": "\n".join(violations)},
        )
        self.outcome = outcome
        self.violations = tuple(violations)


@dataclass(frozen=True, slots=True)
class Receipt:
    """An erasure receipt as TranscriptService keeps it: per store, what the erasure of one
    incarnation of a conversation erased (counts by name, services/agent/erasure.py), the
    parts not yet erased, and when nothing remained."""

    receipt_id: str
    namespace: str
    conversation_id: str
    incarnation: int
    counts: Mapping[str, int]
    remaining: Sequence[str]
    create_time: datetime | None = None
    complete_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class SummaryErasure:
    """What SummaryService erased: `rows` by this call; `summaries` (current and history)
    and `jobs` by every erasure of the incarnation so far."""

    rows: int
    summaries: int
    jobs: int


@dataclass(frozen=True, slots=True)
class MemoryErasure:
    """What MemoryService erased: `deleted` memories by this call; the rest by every
    erasure of the incarnation so far, and whether the vector index has caught up."""

    deleted: int
    memories: int
    revisions: int
    index_points: int
    index_complete: bool


@dataclass(frozen=True, slots=True)
class TranscriptDeletion:
    """What DeleteConversation erased, and the receipt it recorded."""

    entries: int
    appends: int
    receipt: Receipt | None = None


@dataclass(frozen=True, slots=True)
class Erasure:
    """What EraseConversation did, and what is left when a service was unavailable."""

    entries_deleted: int
    summaries_deleted: int  # summaries, their history and summary jobs
    memories_deleted: int
    remaining: Sequence[str] = ()
    # The erasure's receipt (None when TranscriptService could not record it, or when the
    # conversation is gone and no receipt of it is kept).
    receipt: Receipt | None = None

    @property
    def summaries_erased(self) -> bool:
        return self.summaries_deleted > 0

    @property
    def complete(self) -> bool:
        return not self.remaining


# -- what the orchestrator reads from the other services --------------------------------------


@dataclass(frozen=True, slots=True)
class SummaryState:
    """The current summary of a conversation (through 0 and no text when none)."""

    text: str = ""
    through_sequence: int = 0


@dataclass(frozen=True, slots=True)
class PriorAppend:
    """An append that already committed with the turn's id."""

    version: int
    first_sequence: int
    last_sequence: int
    usage: Usage


@dataclass(frozen=True, slots=True)
class ViewState:
    """The bounded view of the transcript a turn runs on."""

    version: int
    window: Sequence[Entry]
    summary_buffer: Sequence[Entry]
    summary_backlog: int
    prior_append: PriorAppend | None = None

    @property
    def pending(self) -> int:
        """Unsummarized entries outside the window."""
        return len(self.summary_buffer) + self.summary_backlog


@dataclass(frozen=True, slots=True)
class LeaseState:
    """A turn lease the orchestrator holds."""

    fencing_token: int
    created: bool = False


@dataclass(frozen=True, slots=True)
class EndedState:
    """A turn that ended earlier without committing, as TranscriptService kept it."""

    output: Sequence[Message]
    usage: Usage
    reason: str
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AppendState:
    """The result of the turn's append."""

    version: int
    first_sequence: int
    last_sequence: int
    replayed: bool


@dataclass(frozen=True, slots=True)
class Recalled:
    """A memory handed to the model as untrusted data."""

    memory_id: str
    content: str
    score: float


@dataclass(frozen=True, slots=True)
class Recall:
    """The answer of a memory search."""

    memories: Sequence[Recalled] = ()
    degraded: bool = False


@dataclass(frozen=True, slots=True)
class Summarized:
    """The answer of a Summarize call."""

    summary: SummaryState
    passes: int
    usage: Usage = field(default_factory=Usage)
