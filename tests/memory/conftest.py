"""The memory store on PostgreSQL that every feature's test_*_store.py runs its cases on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.common.postgres.pool import Database
from services.memory.store import PostgresMemoryStore
from tests.support.settings import server_settings


@pytest.fixture
async def postgres_store(fresh_database_url: str) -> AsyncIterator[PostgresMemoryStore]:
    db = Database(fresh_database_url, server_settings())
    await db.open()
    yield PostgresMemoryStore(db)
    await db.close()
