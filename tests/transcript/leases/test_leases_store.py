"""Turn leases on PostgreSQL, and a schema migrated with turns in every state."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from psycopg.types.json import Jsonb

from services.common import migrations
from services.common.domain import Usage
from services.common.errors import DomainError
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
from tests.support.settings import server_settings
from tests.transcript.leases.cases import TurnLeaseCases
from tests.transcript.support import make_service, user


class TestTurnLeasesOnPostgres(TurnLeaseCases):
    @pytest.fixture
    def store(self, database: Database) -> TranscriptStore:
        return PostgresTranscriptStore(database)


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
