"""The stores of the summary tests: in memory, and a PostgreSQL database of their own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.common.postgres.pool import Database
from tests.summary.double import InMemorySummaryStore
from tests.summary.support import LocalTranscripts
from tests.support.settings import server_settings


@pytest.fixture
def transcripts() -> LocalTranscripts:
    return LocalTranscripts()


@pytest.fixture
def store() -> InMemorySummaryStore:
    return InMemorySummaryStore()


@pytest.fixture
async def isolated(fresh_database_url: str) -> AsyncIterator[Database]:
    """A database of its own: claims are global, so no other test's jobs may be visible."""
    db = Database(fresh_database_url, server_settings(RUNIFOLD_DB_POOL_MAX="24"))
    await db.open()
    yield db
    await db.close()
