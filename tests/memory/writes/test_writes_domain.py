"""The memory writes on the in-memory store."""

from __future__ import annotations

import pytest

from tests.memory.double import InMemoryMemoryStore
from tests.memory.writes.cases import WriteCases


class TestWritesOnMemoryStore(WriteCases):
    @pytest.fixture
    def store(self) -> InMemoryMemoryStore:
        return InMemoryMemoryStore()
