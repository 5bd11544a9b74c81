"""The reads every memory feature shares, on PostgreSQL (a fresh migrated database per
test), and a schema migrated with memories written before valid time."""

from __future__ import annotations

import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.common import migrations
from services.common.postgres.pool import Database
from services.memory.component import MIGRATIONS
from services.memory.store import PostgresMemoryStore
from tests.memory.cases import MemoryCases
from tests.support.settings import server_settings


class TestMemoryOnPostgres(MemoryCases):
    @pytest.fixture
    def store(self, postgres_store: PostgresMemoryStore) -> PostgresMemoryStore:
        return postgres_store


OLD = uuid.UUID("00000000-0000-4000-8000-000000000001")


async def test_memories_written_before_valid_time_became_valid_when_created(
    bare_database_url: str, tmp_path: Path
) -> None:
    """Migration 0004 on a schema at 0003 with a memory and its history: the memory is
    valid from its create time (the transcript's entry times are another service's), open,
    and its history row says the same."""
    before = tmp_path / "migrations"
    before.mkdir()
    for path in sorted(MIGRATIONS.glob("000[1-3]_*.sql")):
        shutil.copy(path, before / path.name)
    db = Database(bare_database_url, server_settings())
    await db.open()
    try:
        assert await migrations.migrate(db, "memory", before) == 3
        async with db.connection() as conn:
            await conn.execute(
                """WITH m AS (
                       INSERT INTO memory.memories (namespace, memory_id, content, sources,
                              revision, create_time, update_time, embedding_model,
                              embedding_dimension)
                       VALUES ('ns', %s, 'Old fact.', '[]', 1, '2025-05-01T00:00:00Z',
                               '2025-05-01T00:00:00Z', 'm', 1)
                       RETURNING *)
                   INSERT INTO memory.revisions (namespace, memory_id, revision, kind, reason,
                          content, sources, metadata, recorded_at)
                   SELECT namespace, memory_id, 1, 'write', 'create', content, sources,
                          metadata, create_time FROM m""",
                (OLD,),
            )
        assert await migrations.migrate(db, "memory", MIGRATIONS) >= 4
        store = PostgresMemoryStore(db)
        memory = await store.get("ns", OLD)
        assert memory is not None
        created = datetime(2025, 5, 1, tzinfo=UTC)
        assert (memory.valid_from_time, memory.valid_until_time) == (created, None)
        assert memory.valid_at(datetime.now(UTC))
        (revision,) = await store.history("ns", OLD)
        assert (revision.valid_from_time, revision.valid_until_time) == (created, None)
    finally:
        await db.close()
