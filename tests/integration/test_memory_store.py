"""The memory domain cases on PostgreSQL (a fresh migrated database per test)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.common.db import Database
from services.memory.store import PostgresMemoryStore
from tests.conftest import server_settings
from tests.memory_cases import MemoryCases
from tests.memory_evolve_cases import EvolvingMemoryCases


@pytest.fixture
async def postgres_store(fresh_database_url: str) -> AsyncIterator[PostgresMemoryStore]:
    db = Database(fresh_database_url, server_settings())
    await db.open()
    yield PostgresMemoryStore(db)
    await db.close()


class TestPostgresStore(MemoryCases):
    @pytest.fixture
    def store(self, postgres_store: PostgresMemoryStore) -> PostgresMemoryStore:
        return postgres_store


class TestEvolvingPostgresStore(EvolvingMemoryCases):
    @pytest.fixture
    def store(self, postgres_store: PostgresMemoryStore) -> PostgresMemoryStore:
        return postgres_store
