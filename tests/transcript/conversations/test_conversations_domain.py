"""Conversations on the in-memory store."""

from __future__ import annotations

import pytest

from services.transcript.store import TranscriptStore
from tests.transcript.conversations.cases import ConversationCases
from tests.transcript.double import InMemoryTranscriptStore


class TestConversationsOnMemoryStore(ConversationCases):
    @pytest.fixture
    def store(self) -> TranscriptStore:
        return InMemoryTranscriptStore()
