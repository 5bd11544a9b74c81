"""What the summary tests share: a transcript side (the real TranscriptService domain on
its in-memory store, reached through `LocalTranscripts`; the end-to-end tests use gRPC
instead), messages, a service on a store, jobs, and a summarizer the test scripts."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import replace

import pytest

from services.common.domain import Entry, Message, Role, ToolCall, Usage
from services.common.errors import Code, DomainError
from services.common.pagination import PageTokens
from services.llm.model import ModelTimeout
from services.summary.config import SummaryConfig
from services.summary.jobs.model import NewJob
from services.summary.model import ConversationState, TranscriptView
from services.summary.service import SummaryService
from services.summary.store import SummaryStore
from services.summary.summarizers.offline import OfflineSummarizer
from services.summary.summarizers.prompt import Summarizer, SummaryOutput, SummaryPrompt
from services.transcript.config import TranscriptLimits
from services.transcript.service import TranscriptService
from tests.transcript.double import InMemoryTranscriptStore


class LocalTranscripts:
    """The Transcripts port over an in-process TranscriptService (unit tests only)."""

    def __init__(self, service: TranscriptService | None = None) -> None:
        self.service = service or TranscriptService(
            InMemoryTranscriptStore(), TranscriptLimits(), PageTokens(b"secret-for-tests-0123")
        )

    async def conversation(self, namespace: str, conversation_id: uuid.UUID) -> ConversationState:
        conversation = await self.service.get_conversation(namespace, str(conversation_id))
        origin = conversation.fork_origin
        return ConversationState(
            conversation.last_sequence,
            conversation.incarnation,
            origin.conversation_id if origin is not None else None,
            origin.through_sequence if origin is not None else 0,
        )

    async def entry_after(
        self, namespace: str, conversation_id: uuid.UUID, sequence: int
    ) -> Entry | None:
        page = await self.service.list_entries(namespace, str(conversation_id), sequence, 0, 1, "")
        return page.entries[0] if page.entries else None

    async def load_view(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        window: int,
        summary_batch: int,
        summarized_through: int,
    ) -> TranscriptView:
        view = await self.service.load_view(
            namespace, str(conversation_id), window, summary_batch, summarized_through
        )
        return TranscriptView(view.summary_buffer, view.summary_backlog, view.incarnation)


def user(text: str) -> Message:
    return Message(Role.USER, text)


def assistant(text: str, *calls: str) -> Message:
    return Message(
        Role.ASSISTANT, text, tool_calls=tuple(ToolCall(c, "lookup", '{"q": 1}') for c in calls)
    )


def tool(call_id: str, text: str = "result") -> Message:
    return Message(Role.TOOL, text, tool_call_id=call_id)


def chat(count: int, start: int = 1) -> list[Message]:
    """`count` alternating user and assistant messages."""
    return [
        user(f"question {i}") if i % 2 else assistant(f"answer {i}")
        for i in range(start, start + count)
    ]


async def new_conversation(
    transcripts: LocalTranscripts, namespace: str, messages: Sequence[Message] = ()
) -> str:
    conversation, _ = await transcripts.service.create_conversation(namespace, "", {})
    cid = str(conversation.conversation_id)
    for offset in range(0, len(messages), 256):
        await transcripts.service.append(namespace, cid, None, messages[offset : offset + 256], "")
    return cid


def make_service(
    store: SummaryStore,
    transcripts: LocalTranscripts | None = None,
    summarizer: Summarizer | None = None,
    config: SummaryConfig | None = None,
    **overrides: object,
) -> SummaryService:
    return SummaryService(
        store,
        transcripts or LocalTranscripts(),
        summarizer or OfflineSummarizer(),
        replace(config or SummaryConfig(), **overrides),  # type: ignore[arg-type]
    )


def new_job(namespace: str, cid: uuid.UUID, window: int = 4, batch: int = 8) -> NewJob:
    return NewJob(uuid.uuid4(), namespace, cid, window, batch)


class Scripted:
    """A summarizer whose answers the test decides; records what it was given."""

    provider = "scripted"

    def __init__(self, text: str = "summary", usage: Usage | None = None) -> None:
        self.text = text
        self.usage = usage or Usage(100, 10, 1)
        self.calls: list[tuple[str | None, list[int], int]] = []
        self.error: Exception | None = None
        self.delay = 0.0

    def prepare(
        self, previous: str | None, entries: Sequence[Entry], *, max_output_tokens: int
    ) -> SummaryPrompt:
        return SummaryPrompt(previous, entries, max_output_tokens, "", "", 10 * len(entries))

    async def summarize(self, prompt: SummaryPrompt, *, timeout: float) -> SummaryOutput:
        entries = prompt.entries
        self.calls.append(
            (prompt.previous, [e.sequence for e in entries], prompt.max_output_tokens)
        )
        if self.delay:
            try:
                await asyncio.wait_for(asyncio.Event().wait(), min(self.delay, timeout))
            except TimeoutError:
                raise ModelTimeout() from None
        if self.error is not None:
            raise self.error
        return SummaryOutput(f"{self.text} through {entries[-1].sequence}", self.usage)


def reason(error: pytest.ExceptionInfo[DomainError]) -> tuple[Code, str]:
    return error.value.code, error.value.reason
