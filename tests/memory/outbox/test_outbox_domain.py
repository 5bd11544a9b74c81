"""The outbox, the sweeper and reindex on the in-memory store."""

from __future__ import annotations

import pytest

from tests.memory.double import InMemoryMemoryStore
from tests.memory.outbox.cases import OutboxCases


class TestOutboxOnMemoryStore(OutboxCases):
    @pytest.fixture
    def store(self) -> InMemoryMemoryStore:
        return InMemoryMemoryStore()
