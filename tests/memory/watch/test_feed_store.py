"""The change feed in PostgreSQL (migrations/0006_change_feed.sql, the writes' numbering,
services/memory/watch/store.py): racing writers number their changes without gaps and in
commit order, so a reader that follows by number never skips one that commits later; a
rolled-back write leaves no hole; and the migration numbers a history written before it.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from services.common.errors import DomainError
from services.common.postgres.pool import Database
from services.memory.model import MemorySource
from services.memory.store import PostgresMemoryStore
from services.memory.watch.model import ChangeKind
from services.memory.watch.store import PostgresFeedStore
from services.memory.writes.model import MemoryWrite, Supersession
from tests.support.settings import server_settings

WRITERS = 8
WRITES = 30
MIGRATIONS = sorted(Path("services/memory/migrations").glob("*.sql"))


@pytest.fixture
async def db(fresh_database_url: str) -> AsyncIterator[Database]:
    # Room for every writer and the reader at once.
    database = Database(fresh_database_url, server_settings(RUNIFOLD_DB_POOL_MAX="16"))
    await database.open()
    yield database
    await database.close()


def _write(namespace: str, content: str, **fields: object) -> MemoryWrite:
    return MemoryWrite(
        namespace=namespace,
        memory_id=fields.pop("memory_id", None) or uuid.uuid4(),  # type: ignore[arg-type]
        content=content,
        sources=[MemorySource(uuid.uuid4(), 1, 1)],
        metadata={},
        expected_revision=None,
        expire_time=None,
        embedding_model="m",
        embedding_dimension=1,
        **fields,  # type: ignore[arg-type]
    )


async def test_racing_writers_number_their_changes_in_commit_order_and_a_reader_skips_none(
    db: Database, namespace: str
) -> None:
    store, feed = PostgresMemoryStore(db), PostgresFeedStore(db)
    head = await feed.open_watch(namespace, 60.0, 30.0)
    writing = True
    delivered: list[int] = []

    async def write(writer: int) -> None:
        for i in range(WRITES):
            # A request id: the write's transaction goes on after its statement (the
            # request's record), so that commits interleave with the numbering.
            await store.create(_write(namespace, f"w{writer}-{i}", request_id=f"r{writer}-{i}"))
            await asyncio.sleep(random.uniform(0, 0.002))  # jitter between writes, not a wait

    async def read() -> None:
        # Follows by number, as a stream does: after the last number delivered.
        while True:
            last_pass = not writing
            page = await feed.read_changes(
                head.key, namespace, delivered[-1] if delivered else 0, 1000, 10**9
            )
            delivered.extend(change.change_sequence for change in page.changes)
            if last_pass:
                return

    reader = asyncio.create_task(read())
    await asyncio.gather(*(write(w) for w in range(WRITERS)))
    writing = False
    await reader
    assert delivered == list(range(1, WRITERS * WRITES + 1))
    # Each writer's own changes in the order it made them.
    page = await feed.read_changes(head.key, namespace, 0, 1000, 10**9)
    contents = [c.memory.content for c in page.changes if c.memory is not None]
    for writer in range(WRITERS):
        mine = [text for text in contents if text.startswith(f"w{writer}-")]
        assert mine == [f"w{writer}-{i}" for i in range(WRITES)]
    assert page.head.last_change_sequence == WRITERS * WRITES


async def test_a_rolled_back_write_leaves_no_hole_in_the_numbers(
    db: Database, namespace: str
) -> None:
    store, feed = PostgresMemoryStore(db), PostgresFeedStore(db)
    head = await feed.open_watch(namespace, 60.0, 30.0)
    first = await store.create(_write(namespace, "First."))
    # The write statement runs (and takes its number), then the supersession of a memory
    # that does not exist refuses it: the transaction rolls back.
    with pytest.raises(DomainError) as refused:
        await store.create(
            _write(namespace, "Refused.", supersedes=[Supersession(uuid.uuid4(), None)])
        )
    assert refused.value.reason == "MEMORY_NOT_FOUND"
    second = await store.create(_write(namespace, "Second."))
    page = await feed.read_changes(head.key, namespace, 0, 100, 10**9)
    assert [(c.change_sequence, c.memory_id, c.kind) for c in page.changes] == [
        (1, first.memory.memory_id, ChangeKind.CREATED),
        (2, second.memory.memory_id, ChangeKind.CREATED),
    ]


async def test_a_watched_namespace_is_announced_by_its_writes_and_only_then(
    db: Database, namespace: str
) -> None:
    store, feed = PostgresMemoryStore(db), PostgresFeedStore(db)
    announced: list[int] = []

    class Sink:
        def changed(self, key: int) -> None:
            announced.append(key)

    store.changes = Sink()
    made = await store.create(_write(namespace, "Before anyone watches."))
    assert announced == []
    head = await feed.open_watch(namespace, 60.0, 30.0)
    assert head.last_change_sequence == 1
    await store.delete(namespace, made.memory.memory_id, None)
    await store.create(_write(namespace, "Watched."))
    assert announced == [head.key, head.key]


async def test_the_migration_numbers_the_history_written_before_it(
    bare_database_url: str,
) -> None:
    files = MIGRATIONS
    assert files[5].name == "0006_change_feed.sql"
    base = datetime(2025, 1, 1, tzinfo=UTC)
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    async with await psycopg.AsyncConnection.connect(bare_database_url, autocommit=True) as conn:
        for path in files[:5]:
            await conn.execute(path.read_bytes())
        history = [
            # (namespace, memory, revision, kind, reason, recorded_at)
            ("n1", a, 1, "write", "create", base),
            ("n1", b, 1, "write", "create", base + timedelta(seconds=1)),
            # A later revision recorded "earlier" (its transaction began first).
            ("n1", a, 2, "write", "superseded", base + timedelta(seconds=3)),
            ("n1", a, 3, "write", "update", base + timedelta(seconds=2)),
            ("n1", b, 2, "delete", "delete", base + timedelta(seconds=4)),
            ("n2", c, 1, "write", "create", base + timedelta(seconds=2)),
        ]
        for namespace, memory_id, revision, kind, reason, recorded_at in history:
            await conn.execute(
                """INSERT INTO memory.revisions
                       (namespace, memory_id, revision, kind, reason, content, recorded_at)
                   VALUES (%s, %s, %s, %s, %s, %s, %s)""",
                (
                    namespace,
                    memory_id,
                    revision,
                    kind,
                    reason,
                    None if kind == "delete" else "text",
                    recorded_at,
                ),
            )
        await conn.execute(files[5].read_bytes())
        cursor = await conn.execute(
            """SELECT namespace, memory_id, revision, change_sequence FROM memory.revisions
                ORDER BY namespace, change_sequence"""
        )
        numbered = await cursor.fetchall()
        cursor = await conn.execute(
            "SELECT namespace, last_change_sequence FROM memory.feeds ORDER BY namespace"
        )
        heads = await cursor.fetchall()
    assert numbered == [
        ("n1", a, 1, 1),
        ("n1", b, 1, 2),
        # a's revision 3 stays after its revision 2, whatever its record time says.
        ("n1", a, 2, 3),
        ("n1", a, 3, 4),
        ("n1", b, 2, 5),
        ("n2", c, 1, 1),
    ]
    assert heads == [("n1", 5), ("n2", 1)]
