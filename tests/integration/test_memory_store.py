"""The memory domain cases on PostgreSQL (a fresh migrated database per test)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.common.db import Database
from services.memory.store import PostgresMemoryStore
from tests.conftest import server_settings
from tests.memory_cases import MemoryCases


class TestPostgresStore(MemoryCases):
    @pytest.fixture
    async def store(self, fresh_database_url: str) -> AsyncIterator[PostgresMemoryStore]:
        db = Database(fresh_database_url, server_settings())
        await db.open()
        yield PostgresMemoryStore(db)
        await db.close()
