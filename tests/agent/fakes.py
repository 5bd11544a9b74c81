"""In-process stand-ins for the orchestrator's ports, for the agent's unit tests.

Transcripts run the REAL transcript domain on the in-memory store, so every
transcript rule (compare-and-swap, idempotency, views, tool pairing) applies.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from services.agent.model import (
    AppendState,
    EndedState,
    LeaseState,
    MemoryErasure,
    PriorAppend,
    Recall,
    Recalled,
    Receipt,
    Summarized,
    SummaryErasure,
    SummaryState,
    TranscriptDeletion,
    ViewState,
)
from services.common.domain import Budget, Entry, Message, Usage
from services.common.errors import DomainError, StoreUnavailable
from services.common.pagination import PageTokens
from services.llm.model import ChatDelta, ChatRequest, ChatResponse, budget_exhausted
from services.transcript.config import TranscriptLimits
from services.transcript.conversations.model import AppendRecord
from services.transcript.leases.model import EndedTurn, TurnLease
from services.transcript.receipts.model import ErasureProgress, ErasureReceipt
from services.transcript.service import TranscriptService
from tests.transcript.double import InMemoryTranscriptStore


def _prior(record: AppendRecord) -> PriorAppend:
    return PriorAppend(record.version, record.first_sequence, record.last_sequence, record.usage)


def _receipt(receipt: ErasureReceipt) -> Receipt:
    return Receipt(
        str(receipt.receipt_id),
        receipt.namespace,
        str(receipt.conversation_id),
        receipt.incarnation,
        dict(receipt.counts),
        list(receipt.remaining),
        receipt.create_time,
        receipt.complete_time,
    )


class FakeTranscripts:
    def __init__(self) -> None:
        self.service = TranscriptService(
            InMemoryTranscriptStore(), TranscriptLimits(), PageTokens(b"agent-tests-secret!")
        )
        # Receipt writes and deletions fail (an outage after the derived parts).
        self.down = False

    async def create_conversation(self, namespace: str, conversation_id: str) -> tuple[str, bool]:
        conversation, created = await self.service.create_conversation(
            namespace, conversation_id, {}
        )
        return str(conversation.conversation_id), created

    async def load_view(
        self,
        namespace: str,
        conversation_id: str,
        window: int,
        summary_batch: int,
        summarized_through: int,
        request_id: str,
    ) -> ViewState:
        view = await self.service.load_view(
            namespace, conversation_id, window, summary_batch, summarized_through, request_id
        )
        prior = view.prior_append
        return ViewState(
            view.version,
            view.window,
            view.summary_buffer,
            view.summary_backlog,
            _prior(prior) if prior else None,
        )

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
        result = await self.service.append(
            namespace, conversation_id, expected_version, messages, request_id, usage, fencing_token
        )
        record = result.record
        return AppendState(
            record.version, record.first_sequence, record.last_sequence, result.replayed
        )

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
        got = await self.service.leases.acquire_turn_lease(
            namespace, conversation_id, turn_id, mode, ttl_s, payload_hash, create_if_missing
        )
        if isinstance(got, TurnLease):
            return LeaseState(got.fencing_token, got.created)
        if isinstance(got, EndedTurn):
            return EndedState(got.output, got.usage, got.reason, got.metadata)
        return _prior(got)

    async def renew_lease(
        self,
        namespace: str,
        conversation_id: str,
        turn_id: str,
        fencing_token: int,
        ttl_s: float,
        calling_model: bool = False,
    ) -> None:
        await self.service.leases.renew_turn_lease(
            namespace, conversation_id, turn_id, fencing_token, ttl_s, calling_model
        )

    async def release_lease(
        self,
        namespace: str,
        conversation_id: str,
        turn_id: str,
        fencing_token: int,
        ended: EndedState | None,
        model_call_failed: bool = False,
    ) -> bool:
        return await self.service.leases.release_turn_lease(
            namespace,
            conversation_id,
            turn_id,
            fencing_token,
            EndedTurn(ended.output, ended.usage, ended.reason, ended.metadata) if ended else None,
            model_call_failed,
        )

    async def entries(
        self, namespace: str, conversation_id: str, first: int, last: int
    ) -> list[Entry]:
        page = await self.service.list_entries(
            namespace, conversation_id, first - 1, last, 1000, ""
        )
        return list(page.entries)

    async def incarnation(self, namespace: str, conversation_id: str) -> int | None:
        try:
            found = await self.service.get_conversation(namespace, conversation_id)
        except DomainError as error:
            if error.reason == "CONVERSATION_NOT_FOUND":
                return None
            raise
        return found.incarnation

    async def forks(self, namespace: str, conversation_id: str) -> list[tuple[str, int]]:
        if self.down:
            raise StoreUnavailable("transcript")
        found: list[tuple[str, int]] = []
        token = ""
        while True:
            page = await self.service.list_forks(namespace, conversation_id, 2, token)
            found.extend((str(fork.conversation_id), fork.incarnation) for fork in page.forks)
            token = page.next_page_token
            if not token:
                return found

    async def delete_conversation(
        self,
        namespace: str,
        conversation_id: str,
        incarnation: int,
        counts: Mapping[str, int] | None = None,
        remaining: Sequence[str] = (),
        erased_forks: Sequence[tuple[str, int]] | None = None,
    ) -> TranscriptDeletion:
        if self.down:
            raise StoreUnavailable("transcript")
        deleted = await self.service.delete_conversation(
            namespace,
            conversation_id,
            incarnation,
            ErasureProgress(counts, remaining) if counts is not None else None,
            erased_forks,
        )
        return TranscriptDeletion(
            deleted.entries, deleted.appends, _receipt(deleted.receipt) if deleted.receipt else None
        )

    async def record_receipt(
        self,
        namespace: str,
        conversation_id: str,
        incarnation: int,
        counts: Mapping[str, int],
        remaining: Sequence[str],
    ) -> Receipt | None:
        if self.down:
            raise StoreUnavailable("transcript")
        try:
            return _receipt(
                await self.service.record_receipt(
                    namespace, conversation_id, incarnation, counts, remaining
                )
            )
        except DomainError as error:
            if error.reason == "CONVERSATION_NOT_FOUND":
                return None
            raise

    async def get_receipt(
        self, namespace: str, receipt_id: str, conversation_id: str = ""
    ) -> Receipt | None:
        try:
            return _receipt(await self.service.get_receipt(namespace, receipt_id, conversation_id))
        except DomainError as error:
            if error.reason == "ERASURE_RECEIPT_NOT_FOUND":
                return None
            raise

    async def messages(self, namespace: str, conversation_id: str) -> list[Message]:
        page = await self.service.list_entries(namespace, conversation_id, 0, 0, 1000, "")
        return [entry.message for entry in page.entries]


class FakeSummaries:
    """Summarizes by counting entries; one model call and 10 output tokens per pass."""

    def __init__(self, transcripts: FakeTranscripts) -> None:
        self.transcripts = transcripts
        self.summaries: dict[str, SummaryState] = {}
        self.jobs: list[str] = []
        self.erased: dict[tuple[str, int], tuple[int, int]] = {}
        # Every job asked for: (conversation, window, summary batch).
        self.requested: list[tuple[str, int, int]] = []
        # When set, RequestSummary fails with it (SummaryService unreachable).
        self.request_error: DomainError | None = None

    async def get(self, namespace: str, conversation_id: str) -> SummaryState:
        return self.summaries.get(conversation_id, SummaryState())

    async def summarize(
        self,
        namespace: str,
        conversation_id: str,
        window: int,
        summary_batch: int,
        max_passes: int,
        budget: Budget,
    ) -> Summarized:
        usage, passes = Usage(), 0
        current = await self.get(namespace, conversation_id)
        while passes < max_passes:
            view = await self.transcripts.load_view(
                namespace, conversation_id, window, summary_batch, current.through_sequence, ""
            )
            if not view.summary_buffer:
                break
            if usage.model_calls >= budget.max_model_calls:
                raise budget_exhausted("max_model_calls", budget.max_model_calls)
            through = view.summary_buffer[-1].sequence
            current = SummaryState(f"summary of entries 1..{through}", through)
            self.summaries[conversation_id] = current
            usage += Usage(5, 10, 1)
            passes += 1
        return Summarized(current, passes, usage)

    async def request(
        self, namespace: str, conversation_id: str, window: int, summary_batch: int
    ) -> str:
        if self.request_error is not None:
            raise self.request_error
        job = f"job-{len(self.jobs) + 1}"
        self.jobs.append(conversation_id)
        self.requested.append((conversation_id, window, summary_batch))
        return job

    async def run_jobs(self, namespace: str) -> None:
        """Run every job asked for so far, as the queue's workers would (until no
        backlog remains), and empty the queue."""
        requested, self.requested = self.requested, []
        self.jobs = []
        for conversation_id, window, batch in requested:
            await self.summarize(namespace, conversation_id, window, batch, 64, Budget(0, 64, 0))

    async def erase(self, namespace: str, conversation_id: str, incarnation: int) -> SummaryErasure:
        summaries = int(self.summaries.pop(conversation_id, None) is not None)
        jobs = self.jobs.count(conversation_id)
        self.jobs = [job for job in self.jobs if job != conversation_id]
        # The tombstone adds up what every erasure of the incarnation erased.
        before = self.erased.get((conversation_id, incarnation), (0, 0))
        totals = (before[0] + summaries, before[1] + jobs)
        if incarnation:
            self.erased[(conversation_id, incarnation)] = totals
        return SummaryErasure(summaries + jobs, *totals)


class FakeMemories:
    def __init__(self, memories: Sequence[Recalled] = ()) -> None:
        self.memories = list(memories)
        self.queries: list[tuple[str, str, int]] = []
        self.curation_requests: list[tuple[str, str]] = []
        self.down = False
        # Whether the index has applied the erasures' index writes.
        self.index_caught_up = True
        self.erased: dict[tuple[str, int], int] = {}

    async def search(self, namespace: str, query: str, limit: int) -> Recall:
        self.queries.append((namespace, query, limit))
        return Recall(self.memories[:limit])

    async def forget_conversation(
        self, namespace: str, conversation_id: str, incarnation: int
    ) -> MemoryErasure:
        if self.down:
            raise StoreUnavailable("memory")
        forgotten, self.memories = len(self.memories), []
        before = self.erased.get((conversation_id, incarnation), 0)
        if incarnation:
            self.erased[(conversation_id, incarnation)] = before + forgotten
        total = before + forgotten
        # One revision per memory, one index point each.
        return MemoryErasure(forgotten, total, total, total, self.index_caught_up)

    async def erasure(
        self, namespace: str, conversation_id: str, incarnation: int
    ) -> MemoryErasure | None:
        if self.down:
            raise StoreUnavailable("memory")
        total = self.erased.get((conversation_id, incarnation))
        if total is None:
            return None
        return MemoryErasure(0, total, total, total, self.index_caught_up)

    async def request_curation(self, namespace: str, conversation_id: str) -> None:
        if self.down:
            raise StoreUnavailable("memory")
        self.curation_requests.append((namespace, conversation_id))


Responder = Callable[[ChatRequest], ChatResponse]


@dataclass
class ScriptedModel:
    """A ChatModel that records requests and answers from a script."""

    respond: Responder = lambda request: ChatResponse("ok", usage=Usage(3, 2, 1))
    release: asyncio.Event | None = None
    requests: list[ChatRequest] = field(default_factory=list)
    provider: str = "scripted"
    model: str = "scripted-1"

    async def complete(self, request: ChatRequest, *, timeout: float) -> ChatResponse:
        self.requests.append(request)
        if self.release is not None:
            await self.release.wait()
        return self.respond(request)

    async def stream(
        self, request: ChatRequest, *, timeout: float
    ) -> AsyncIterator[ChatDelta | ChatResponse]:
        response = await self.complete(request, timeout=timeout)
        for word in response.text.split(" "):
            yield ChatDelta(word + " ")
        yield response


def new_id() -> str:
    return str(uuid.uuid4())
