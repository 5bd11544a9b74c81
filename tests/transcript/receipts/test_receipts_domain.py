"""Erasure receipts on the in-memory store."""

from __future__ import annotations

import pytest

from services.transcript.store import TranscriptStore
from tests.transcript.double import InMemoryTranscriptStore
from tests.transcript.receipts.cases import ReceiptCases


class TestReceiptsOnMemoryStore(ReceiptCases):
    @pytest.fixture
    def store(self) -> TranscriptStore:
        return InMemoryTranscriptStore()
