"""The outbox, the sweeper and reindex on PostgreSQL (a fresh migrated database per test)."""

from __future__ import annotations

import pytest

from services.memory.store import PostgresMemoryStore
from tests.memory.outbox.cases import OutboxCases


class TestOutboxOnPostgres(OutboxCases):
    @pytest.fixture
    def store(self, postgres_store: PostgresMemoryStore) -> PostgresMemoryStore:
        return postgres_store
