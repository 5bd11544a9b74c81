"""Checkpoints on the in-memory store."""

from __future__ import annotations

import pytest

from services.transcript.store import TranscriptStore
from tests.transcript.checkpoints.cases import CheckpointCases
from tests.transcript.double import InMemoryTranscriptStore


class TestCheckpointsOnMemoryStore(CheckpointCases):
    @pytest.fixture
    def store(self) -> TranscriptStore:
        return InMemoryTranscriptStore()
