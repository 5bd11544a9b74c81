"""The digest chain on the in-memory store."""

from __future__ import annotations

import pytest

from services.transcript.store import TranscriptStore
from tests.transcript.digests.cases import DigestCases
from tests.transcript.double import InMemoryTranscriptStore


class TestDigestsOnMemoryStore(DigestCases):
    @pytest.fixture
    def store(self) -> TranscriptStore:
        return InMemoryTranscriptStore()
