"""What the orchestrator needs from the other services (gRPC adapters in remote.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from services.agent.model import (
    AppendState,
    EndedState,
    LeaseState,
    MemoryErasure,
    PriorAppend,
    Recall,
    Receipt,
    Summarized,
    SummaryErasure,
    SummaryState,
    TranscriptDeletion,
    ViewState,
)
from services.common.domain import Budget, Entry, Message, Usage


class Transcripts(Protocol):
    """TranscriptService, as the orchestrator uses it."""

    async def create_conversation(self, namespace: str, conversation_id: str) -> tuple[str, bool]:
        """Create if missing; return the id and whether it was created."""

    async def load_view(
        self,
        namespace: str,
        conversation_id: str,
        window: int,
        summary_batch: int,
        summarized_through: int,
        request_id: str,
    ) -> ViewState:
        """The bounded view (and the prior append of `request_id`)."""

    async def append(
        self,
        namespace: str,
        conversation_id: str,
        expected_version: int,
        messages: Sequence[Message],
        request_id: str,
        usage: Usage,
        fencing_token: int | None = None,
    ) -> AppendState:
        """Append at the expected version (VersionConflict when it moved), under the turn
        lease `fencing_token` (TURN_LEASE_LOST when it lapsed; the commit ends it)."""

    async def acquire_lease(
        self,
        namespace: str,
        conversation_id: str,
        turn_id: str,
        mode: int,
        ttl_s: float,
        payload_hash: bytes,
        create_if_missing: bool,
    ) -> LeaseState | PriorAppend | EndedState:
        """A turn lease (TurnLeaseMode `mode`), or the outcome of a turn id that ran before;
        waits (for the turns ahead, or a running turn of the same id) within the deadline."""

    async def renew_lease(
        self,
        namespace: str,
        conversation_id: str,
        turn_id: str,
        fencing_token: int,
        ttl_s: float,
        calling_model: bool = False,
    ) -> None:
        """Extend the lease (and, `calling_model`, record that the model call begins);
        TURN_LEASE_LOST when it lapsed or was taken over."""

    async def release_lease(
        self,
        namespace: str,
        conversation_id: str,
        turn_id: str,
        fencing_token: int,
        ended: EndedState | None,
        model_call_failed: bool = False,
    ) -> bool:
        """End the lease without an append, keeping `ended` for repeats of the turn id
        (`model_call_failed`: the model call it began failed, so it may run again)."""

    async def entries(
        self, namespace: str, conversation_id: str, first: int, last: int
    ) -> list[Entry]:
        """Entries first..last."""

    async def incarnation(self, namespace: str, conversation_id: str) -> int | None:
        """The conversation's incarnation, or None when it does not exist."""

    async def forks(self, namespace: str, conversation_id: str) -> list[tuple[str, int]]:
        """The conversation's forks and theirs (id and incarnation), a fork before its
        own, every page of them; none when it has none or does not exist."""

    async def delete_conversation(
        self,
        namespace: str,
        conversation_id: str,
        incarnation: int,
        counts: Mapping[str, int] | None = None,
        remaining: Sequence[str] = (),
        erased_forks: Sequence[tuple[str, int]] | None = None,
    ) -> TranscriptDeletion:
        """Erase the transcript (of that incarnation, when not 0); return the entries and
        appends erased (0 when already gone). With `counts` (and an incarnation), record
        the erasure's receipt in the same transaction: those counts and `remaining` parts,
        with the entries and appends erased. With `erased_forks` (id, incarnation: the
        forks whose derived data was erased), FORKS_CHANGED (a DomainError) when another
        fork would go with it, and nothing is deleted."""

    async def record_receipt(
        self,
        namespace: str,
        conversation_id: str,
        incarnation: int,
        counts: Mapping[str, int],
        remaining: Sequence[str],
    ) -> Receipt | None:
        """Record the erasure receipt of an incarnation, or merge into the one kept (counts
        only grow, parts only leave `remaining`); None when neither that incarnation nor a
        receipt of it exists any more (deleted meanwhile by a plain DeleteConversation)."""

    async def get_receipt(
        self, namespace: str, receipt_id: str, conversation_id: str = ""
    ) -> Receipt | None:
        """A receipt by id (or, with no id, the latest of a conversation id); None when
        there is none in this namespace."""


class Summaries(Protocol):
    """SummaryService, as the orchestrator uses it."""

    async def get(self, namespace: str, conversation_id: str) -> SummaryState:
        """The current summary (through 0 when none)."""

    async def summarize(
        self,
        namespace: str,
        conversation_id: str,
        window: int,
        summary_batch: int,
        max_passes: int,
        budget: Budget,
    ) -> Summarized:
        """Run the trusted summarizer in passes within the budget."""

    async def request(
        self, namespace: str, conversation_id: str, window: int, summary_batch: int
    ) -> str:
        """Enqueue a background job; return its id."""

    async def erase(self, namespace: str, conversation_id: str, incarnation: int) -> SummaryErasure:
        """Erase the conversation's summaries, history and jobs, and leave a tombstone of
        `incarnation` (when not 0) that refuses later commits and jobs; return the rows
        erased, and what every erasure of the incarnation erased."""


class Memories(Protocol):
    """MemoryService, as the orchestrator uses it."""

    async def search(self, namespace: str, query: str, limit: int) -> Recall:
        """Memories relevant to the query, inside the namespace."""

    async def forget_conversation(
        self, namespace: str, conversation_id: str, incarnation: int
    ) -> MemoryErasure:
        """Delete every memory derived from the conversation and leave a tombstone of
        `incarnation` (when not 0) that refuses later writes; return how many were deleted,
        and what every erasure of the incarnation erased."""

    async def erasure(
        self, namespace: str, conversation_id: str, incarnation: int
    ) -> MemoryErasure | None:
        """What the erasure of an incarnation erased, and whether the index caught up;
        None when MemoryService keeps no tombstone of it."""

    async def request_curation(self, namespace: str, conversation_id: str) -> None:
        """Queue the automatic curation of the conversation (RequestCuration)."""
