"""SearchMemories on the in-memory store."""

from __future__ import annotations

import pytest

from tests.memory.double import InMemoryMemoryStore
from tests.memory.search.cases import SearchCases


class TestSearchOnMemoryStore(SearchCases):
    @pytest.fixture
    def store(self) -> InMemoryMemoryStore:
        return InMemoryMemoryStore()
