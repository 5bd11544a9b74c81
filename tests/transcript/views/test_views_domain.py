"""ListEntries and LoadView on the in-memory store, plus the view invariants by property."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.common.domain import Message, Role
from services.transcript.store import TranscriptStore
from tests.transcript.double import InMemoryTranscriptStore
from tests.transcript.support import assistant, make_service, tool, user
from tests.transcript.views.cases import ViewCases


class TestViewsOnMemoryStore(ViewCases):
    @pytest.fixture
    def store(self) -> TranscriptStore:
        return InMemoryTranscriptStore()


@st.composite
def transcripts(draw: st.DrawFn) -> list[Message]:
    """Valid transcripts: user/assistant turns with complete or partial tool groups."""
    messages: list[Message] = []
    for turn in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["user", "answer", "tools"]))
        if kind == "user":
            messages.append(user(f"u{turn}"))
        elif kind == "answer":
            messages.append(assistant(f"a{turn}"))
        else:
            calls = [f"c{turn}-{i}" for i in range(draw(st.integers(1, 4)))]
            messages.append(assistant("", *calls))
            answered = draw(st.integers(0, len(calls)))
            messages.extend(tool(call) for call in calls[:answered])
    return messages


def _run(coro: object) -> object:
    return asyncio.new_event_loop().run_until_complete(coro)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=transcripts(), window=st.integers(1, 12), batch=st.integers(1, 12), data=st.data())
def test_view_invariants(
    messages: list[Message], window: int, batch: int, data: st.DataObject
) -> None:
    """For any transcript and bounds: the parts tile the transcript and keep tool groups whole."""
    store = InMemoryTranscriptStore()
    service = make_service(store, max_tool_calls_per_message=4)
    namespace = "prop"

    async def scenario() -> None:
        conversation, _ = await service.create_conversation(namespace, str(uuid.uuid4()), {})
        cid = str(conversation.conversation_id)
        await service.append(namespace, cid, 0, messages, "")
        last = len(messages)
        through = data.draw(st.integers(0, last))
        view = await service.load_view(namespace, cid, window, batch, through)
        seqs = [e.sequence for e in view.window]
        roles = {i + 1: m.role for i, m in enumerate(messages)}

        # The window is a contiguous suffix.
        assert seqs == list(range(seqs[0], last + 1)) if seqs else last == 0
        # It never starts with a tool result (its call would be cut off) ...
        assert not seqs or roles[seqs[0]] != Role.TOOL
        # ... and exceeds `window` only to hold one whole group it would otherwise lose.
        if len(seqs) > window:
            assert view.window[0].message.tool_calls
            assert all(roles[s] == Role.TOOL for s in seqs[1:])
        start = seqs[0] if seqs else last + 1
        buffer = [e.sequence for e in view.summary_buffer]
        if buffer:
            assert buffer == list(range(through + 1, buffer[-1] + 1))
            # The buffer ends on a group boundary.
            assert buffer[-1] + 1 == start or roles[buffer[-1] + 1] != Role.TOOL
            # It exceeds the batch only by the tool results of a group it would split.
            assert all(roles[s] == Role.TOOL for s in buffer[batch:])
        end = buffer[-1] if buffer else through
        # Buffer and backlog tile the unsummarized entries outside the window.
        assert view.summary_backlog == max(0, start - 1 - max(end, through))
        if start - 1 > through:
            assert buffer, "progress is always possible"

    _run(scenario())
