"""AppendEntries on the in-memory store."""

from __future__ import annotations

import pytest

from services.transcript.store import TranscriptStore
from tests.transcript.appends.cases import AppendCases
from tests.transcript.double import InMemoryTranscriptStore


class TestAppendsOnMemoryStore(AppendCases):
    @pytest.fixture
    def store(self) -> TranscriptStore:
        return InMemoryTranscriptStore()
