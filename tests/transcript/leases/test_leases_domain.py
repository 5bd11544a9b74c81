"""Turn leases on the in-memory store."""

from __future__ import annotations

import pytest

from services.transcript.store import TranscriptStore
from tests.transcript.double import InMemoryTranscriptStore
from tests.transcript.leases.cases import TurnLeaseCases


class TestTurnLeasesOnMemoryStore(TurnLeaseCases):
    @pytest.fixture
    def store(self) -> TranscriptStore:
        return InMemoryTranscriptStore()
