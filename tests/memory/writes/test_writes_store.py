"""The memory writes on PostgreSQL (a fresh migrated database per test)."""

from __future__ import annotations

import pytest

from services.memory.store import PostgresMemoryStore
from tests.memory.writes.cases import WriteCases


class TestWritesOnPostgres(WriteCases):
    @pytest.fixture
    def store(self, postgres_store: PostgresMemoryStore) -> PostgresMemoryStore:
        return postgres_store
