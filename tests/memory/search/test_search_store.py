"""SearchMemories on PostgreSQL (a fresh migrated database per test)."""

from __future__ import annotations

import pytest

from services.memory.store import PostgresMemoryStore
from tests.memory.search.cases import SearchCases


class TestSearchOnPostgres(SearchCases):
    @pytest.fixture
    def store(self, postgres_store: PostgresMemoryStore) -> PostgresMemoryStore:
        return postgres_store
