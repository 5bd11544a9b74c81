"""Transcript domain rules on PostgreSQL, and what only PostgreSQL can show."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from services.common import migrations
from services.common.domain import Usage
from services.common.errors import Code, DomainError
from services.common.postgres.pool import Database
from services.transcript.component import MIGRATIONS
from services.transcript.leases.model import (
    EndedTurn,
    LeaseMode,
    LeaseRequest,
    TurnLease,
    Waiting,
    ended_to_json,
)
from services.transcript.store import PostgresTranscriptStore, TranscriptStore
from services.transcript.views.statements import VIEW_SQL
from tests.support.settings import server_settings
from tests.support.waiting import wait_for
from tests.transcript.appends.cases import TranscriptCases, make_service, new_conversation, user
from tests.transcript.conversations.cases import TranscriptStateCases
from tests.transcript.leases.cases import TurnLeaseCases


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
    from tests.support.settings import server_settings

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
    """The exclusive lease is re-checked on the newest conversation row: an append that
    took its snapshot before an exclusive lease was granted, and waited for the row
    meanwhile, is refused (CONVERSATION_BUSY) instead of slipping in under the new holder."""
    service = make_service(PostgresTranscriptStore(database))
    cid = await new_conversation(service, namespace)
    async with database.connection() as granting:
        await granting.execute("BEGIN")
        # What AcquireTurnLease does for an exclusive lease, held open.
        await granting.execute(
            """UPDATE transcript.conversations
                  SET lease_turn_id = 'holder', lease_fencing_token = 42,
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


async def test_turn_leases_and_places_in_line_survive_the_fencing_token_migration(
    bare_database_url: str, tmp_path: Path
) -> None:
    """Migration 0006 on a schema at 0005 with turns in every state: the running turn's
    ticket becomes its fencing token (the conversation row's lease_token its
    lease_fencing_token), the waiting turn keeps its ticket, the ended turn its
    outcome; each goes on working with what its holder kept."""
    before = tmp_path / "migrations"
    before.mkdir()
    for path in sorted(MIGRATIONS.glob("000[1-5]_*.sql")):
        shutil.copy(path, before / path.name)
    db = Database(bare_database_url, server_settings())
    await db.open()
    namespace, cid = "ns-migrated", uuid.uuid4()
    ended = EndedTurn((user("kept"),), Usage(1, 2, 1), "MODEL_REFUSED", {"why": "policy"})
    try:
        assert await migrations.migrate(db, "transcript", before) == 5
        async with db.connection() as conn:
            cursor = await conn.execute(
                """INSERT INTO transcript.conversations
                          (namespace, conversation_id, lease_turn_id, lease_token, lease_until)
                   VALUES (%s, %s, 'running', 4242, now() + interval '10 minutes')
                   RETURNING conversation_key""",
                (namespace, cid),
            )
            row = await cursor.fetchone()
            assert row is not None
            cursor = await conn.execute(
                """INSERT INTO transcript.turns (conversation_key, turn_id, state, exclusive,
                          ticket, payload_hash, lease_until, outcome, end_time)
                   VALUES (%(key)s, 'running', 'running', true, 4242, '\\x01',
                           now() + interval '10 minutes', NULL, NULL),
                          (%(key)s, 'waiting', 'waiting', true,
                           nextval('transcript.turn_tickets'), '\\x02',
                           now() + interval '10 minutes', NULL, NULL),
                          (%(key)s, 'ended', 'ended', false, 777, '\\x03',
                           now() + interval '10 minutes', %(outcome)s, now())
                   RETURNING turn_id, ticket""",
                {"key": row[0], "outcome": Jsonb(ended_to_json(ended))},
            )
            tickets = dict(await cursor.fetchall())
        assert await migrations.migrate(db, "transcript", MIGRATIONS) >= 6

        store = PostgresTranscriptStore(db)
        service = make_service(store)
        # The running turn holds the conversation with the token it was granted.
        with pytest.raises(DomainError) as busy:
            await service.append(namespace, str(cid), None, [user("other")], "")
        assert busy.value.reason == "CONVERSATION_BUSY"
        assert await store.renew_turn(namespace, cid, "running", 4242, 30.0) is not None
        # The ended turn's repeat gets its outcome back.
        replay = await store.acquire_turn(
            LeaseRequest(namespace, cid, "ended", LeaseMode.SHARED, 30.0, b"\x03", False, 8)
        )
        assert isinstance(replay, EndedTurn)
        assert (replay.output, replay.reason) == (ended.output, ended.reason)
        # The waiting turn is still in line, with its ticket, behind the running one...
        place = LeaseRequest(
            namespace,
            cid,
            "waiting",
            LeaseMode.QUEUED,
            30.0,
            b"\x02",
            False,
            8,
            ticket=tickets["waiting"],
        )
        waiting = await store.acquire_turn(place)
        assert isinstance(waiting, Waiting) and waiting.ticket == tickets["waiting"]
        # ...until the running turn commits under its token, which ends its lease.
        done = await service.append(
            namespace, str(cid), None, [user("done")], "running", Usage(), 4242
        )
        assert done.record.version == 1
        granted = await store.acquire_turn(place)
        assert isinstance(granted, TurnLease) and granted.exclusive
        async with db.connection() as conn:
            cursor = await conn.execute(
                """SELECT turn_id, state, ticket, fencing_token FROM transcript.turns
                    ORDER BY turn_id"""
            )
            rows = await cursor.fetchall()
            cursor = await conn.execute(
                "SELECT lease_turn_id, lease_fencing_token FROM transcript.conversations"
            )
            holder = await cursor.fetchone()
        assert rows == [
            ("ended", "ended", None, 777),
            ("running", "committed", None, 4242),
            ("waiting", "running", None, granted.fencing_token),
        ]
        assert holder == ("waiting", granted.fencing_token)
    finally:
        await db.close()
