"""Forks on the in-memory store."""

from __future__ import annotations

import pytest

from services.transcript.store import TranscriptStore
from tests.transcript.double import InMemoryTranscriptStore
from tests.transcript.forks.cases import ForkCases


class TestForksOnMemoryStore(ForkCases):
    @pytest.fixture
    def store(self) -> TranscriptStore:
        return InMemoryTranscriptStore()
