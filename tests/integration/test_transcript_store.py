"""Transcript domain rules on PostgreSQL, and what only PostgreSQL can show."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import psycopg
import pytest

from services.common.errors import Code, DomainError
from services.common.postgres.pool import Database
from services.transcript.store import PostgresTranscriptStore, TranscriptStore
from services.transcript.views.statements import VIEW_SQL
from tests.conftest import wait_for
from tests.transcript_cases import TranscriptCases, make_service, new_conversation, user
from tests.transcript_state_cases import TranscriptStateCases
from tests.turn_lease_cases import TurnLeaseCases


class TestTranscriptOnPostgres(TranscriptCases):
    @pytest.fixture
    def store(self, database: Database) -> TranscriptStore:
        return PostgresTranscriptStore(database)


class TestTranscriptStateOnPostgres(TranscriptStateCases):
    @pytest.fixture
    def store(self, database: Database) -> TranscriptStore:
        return PostgresTranscriptStore(database)


class TestTurnLeasesOnPostgres(TurnLeaseCases):
    @pytest.fixture
    def store(self, database: Database) -> TranscriptStore:
        return PostgresTranscriptStore(database)


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


async def test_view_reads_do_not_grow_with_the_transcript(
    database: Database, namespace: str
) -> None:
    """The view's query reads the same rows and pages at 1,000 and 100,000 entries."""
    service = make_service(PostgresTranscriptStore(database))
    conversations = {}
    for length in (1_000, 100_000):
        cid = await new_conversation(service, namespace)
        conversations[length] = cid
        async with database.connection() as conn:
            await conn.execute(
                """INSERT INTO transcript.entries
                          (conversation_key, sequence, role, text, created_at)
                   SELECT c.conversation_key, s, 1, 'm' || s, now()
                     FROM transcript.conversations c, generate_series(1, %s) AS s
                    WHERE c.conversation_id = %s""",
                (length, uuid.UUID(cid)),
            )
            await conn.execute(
                "UPDATE transcript.conversations SET version = 1, last_sequence = %s "
                "WHERE conversation_id = %s",
                (length, uuid.UUID(cid)),
            )
    async with database.connection() as conn:
        await conn.execute("ANALYZE transcript.entries")
    measured = {}
    for length, cid in conversations.items():
        view = await service.load_view(namespace, cid, 16, 32, length // 2)
        assert len(view.window) == 16 and len(view.summary_buffer) == 32
        async with database.connection() as conn:
            cursor = await conn.execute(
                b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + VIEW_SQL.encode(),
                {
                    "namespace": namespace,
                    "conversation_id": uuid.UUID(cid),
                    "window": 16,
                    "batch": 32,
                    "through": length // 2,
                    "request_id": None,
                },
            )
            row = await cursor.fetchone()
        assert row is not None
        plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]["Plan"]
        scans = [n for n in _nodes(plan) if n.get("Relation Name") == "entries"]
        assert scans and all(n["Node Type"] == "Index Scan" for n in scans), json.dumps(
            plan, indent=1
        )
        rows_read = sum(n["Actual Rows"] * n.get("Actual Loops", 1) for n in scans)
        measured[length] = (
            rows_read,
            plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0),
        )
    assert measured[1_000][0] == measured[100_000][0] == 16 + 32 + 1
    # Pages touched differ only by the index depth, not by the transcript's length.
    assert measured[100_000][1] <= measured[1_000][1] + 8, measured


async def test_append_is_one_statement_that_leaves_nothing_on_failure(
    database: Database, namespace: str
) -> None:
    """A reused request id aborts the whole statement: no version bump, no entries."""
    store = PostgresTranscriptStore(database)
    service = make_service(store)
    cid = await new_conversation(service, namespace)
    await service.append(namespace, cid, None, [user("a")], "r1")
    with pytest.raises(DomainError) as caught:
        await service.append(namespace, cid, None, [user("b")], "r1")
    assert caught.value.code is Code.INVALID_ARGUMENT
    assert caught.value.reason == "REQUEST_ID_REUSED" and caught.value.field == "request_id"
    async with database.connection() as conn:
        cursor = await conn.execute(
            """SELECT c.version, c.last_sequence, count(e.*)
                 FROM transcript.conversations c
                 LEFT JOIN transcript.entries e USING (conversation_key)
                WHERE c.conversation_id = %s GROUP BY 1, 2""",
            (uuid.UUID(cid),),
        )
        assert await cursor.fetchone() == (1, 1, 1)


async def test_store_outage_is_store_unavailable(shared_database_url: str, namespace: str) -> None:
    """A database that cannot be reached surfaces as UNAVAILABLE, not INTERNAL."""
    from services.common.errors import Code, DomainError
    from tests.conftest import server_settings

    params = psycopg.conninfo.conninfo_to_dict(shared_database_url)
    params["dbname"] = "no_such_database_" + uuid.uuid4().hex[:6]
    db = Database(
        psycopg.conninfo.make_conninfo("", **params),
        server_settings(RUNIFOLD_DB_TIMEOUT_S="0.5", RUNIFOLD_DB_POOL_MIN="0"),
    )
    await db.open()
    try:
        with pytest.raises(DomainError) as caught:
            await make_service(PostgresTranscriptStore(db)).get_conversation(
                namespace, str(uuid.uuid4())
            )
        assert caught.value.code is Code.UNAVAILABLE
        assert caught.value.reason == "STORE_UNAVAILABLE"
    finally:
        await db.close()


async def test_an_exclusive_lease_granted_while_an_append_waits_refuses_it(
    database: Database, namespace: str
) -> None:
    """The fence is re-checked on the newest conversation row: an append that took its
    snapshot before an exclusive lease was granted, and waited for the row meanwhile,
    is refused (CONVERSATION_BUSY) instead of slipping in under the new holder."""
    service = make_service(PostgresTranscriptStore(database))
    cid = await new_conversation(service, namespace)
    async with database.connection() as granting:
        await granting.execute("BEGIN")
        # What AcquireTurnLease does for an exclusive lease, held open.
        await granting.execute(
            """UPDATE transcript.conversations
                  SET lease_turn_id = 'holder', lease_token = 42,
                      lease_until = now() + interval '1 minute'
                WHERE namespace = %s AND conversation_id = %s""",
            (namespace, uuid.UUID(cid)),
        )
        appending = asyncio.create_task(service.append(namespace, cid, None, [user("late")], ""))

        async def blocked_on_the_row() -> bool:
            async with database.connection() as probe:
                cursor = await probe.execute(
                    """SELECT count(*) FROM pg_stat_activity
                        WHERE wait_event_type = 'Lock' AND query LIKE '%%WITH lease AS%%'"""
                )
                row = await cursor.fetchone()
            return bool(row and row[0])

        await wait_for(blocked_on_the_row)
        await granting.execute("COMMIT")
    with pytest.raises(DomainError) as caught:
        await appending
    assert caught.value.reason == "CONVERSATION_BUSY"
    assert (await service.get_conversation(namespace, cid)).version == 0
