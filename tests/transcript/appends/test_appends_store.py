"""AppendEntries on PostgreSQL, and what only PostgreSQL can show (one statement,
row locks)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from services.common.domain import Usage
from services.common.errors import Code, DomainError
from services.common.postgres.pool import Database
from services.transcript.appends import statements as store_sql
from services.transcript.leases.model import TurnLease
from services.transcript.store import PostgresTranscriptStore, TranscriptStore
from tests.support.waiting import wait_for
from tests.transcript.appends.cases import AppendCases
from tests.transcript.support import make_service, new_conversation, user


class TestAppendsOnPostgres(AppendCases):
    @pytest.fixture
    def store(self, database: Database) -> TranscriptStore:
        return PostgresTranscriptStore(database)


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
                        WHERE wait_event_type = 'Lock' AND query LIKE '%%WITH locked AS%%'"""
                )
                row = await cursor.fetchone()
            return bool(row and row[0])

        await wait_for(blocked_on_the_row)
        await granting.execute("COMMIT")
    with pytest.raises(DomainError) as caught:
        await appending
    assert caught.value.reason == "CONVERSATION_BUSY"
    assert (await service.get_conversation(namespace, cid)).version == 0


async def test_an_append_takes_its_conversation_before_its_turn_as_lease_decisions_do(
    database: Database, namespace: str
) -> None:
    """Lock order: a lease decision locks the conversation, then turn rows (dropping or
    interrupting a lapsed lease); an append under a lease must take them in the same
    order, or the two deadlock (found by the chaos campaign: DeadlockDetected, INTERNAL).
    While the append waits for its conversation, its turn's row is not locked by it."""
    service = make_service(PostgresTranscriptStore(database))
    cid = await new_conversation(service, namespace)
    lease = await service.leases.acquire_turn_lease(namespace, cid, "t-a", 1, 30.0, b"h", False)
    assert isinstance(lease, TurnLease)
    async with database.connection() as deciding:
        await deciding.execute("BEGIN")
        # What a lease decision of another turn holds while it looks at the turn rows.
        await deciding.execute(
            """SELECT 1 FROM transcript.conversations
                WHERE namespace = %s AND conversation_id = %s FOR UPDATE""",
            (namespace, uuid.UUID(cid)),
        )
        appending = asyncio.create_task(
            service.append(
                namespace, cid, None, [user("q")], "t-a", Usage(1, 1, 1), lease.fencing_token
            )
        )

        async def waiting_for_the_conversation() -> bool:
            async with database.connection() as probe:
                cursor = await probe.execute(
                    """SELECT count(*) FROM pg_stat_activity
                        WHERE wait_event_type = 'Lock' AND datname = current_database()"""
                )
                row = await cursor.fetchone()
            return bool(row and row[0])

        await wait_for(waiting_for_the_conversation)
        # The decision can go on to the turn rows: the append holds none of them.
        await deciding.execute(
            """SELECT 1 FROM transcript.turns WHERE turn_id = 't-a' FOR UPDATE NOWAIT"""
        )
        await deciding.execute("COMMIT")
    result = await appending
    assert result.record.version == 1


async def test_an_append_stopped_by_a_lease_that_ends_before_its_diagnosis_is_tried_again(
    database: Database, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exclusive lease holds the conversation when the append's statement runs and is
    gone when the append asks why it wrote nothing: nothing refuses it any more, so it is
    tried again and commits (found by the chaos campaign: such an append answered
    VERSION_CONFLICT at its own version, a race that never was)."""
    service = make_service(PostgresTranscriptStore(database))
    cid = await new_conversation(service, namespace)
    async with database.connection() as conn:  # what an exclusive lease writes
        await conn.execute(
            """UPDATE transcript.conversations
                  SET lease_turn_id = 'another-turn', lease_fencing_token = 7,
                      lease_until = now() + interval '1 minute'
                WHERE namespace = %s AND conversation_id = %s""",
            (namespace, uuid.UUID(cid)),
        )
    statement = store_sql.APPEND
    ran: list[bool] = []

    class EndsTheLeaseAfterTheFirstTry:
        text = statement.text

        async def execute(self, conn: Any, params: Any) -> Any:
            cursor = await statement.execute(conn, params)
            if not ran:  # the lease ends between the statement and the diagnosis
                ran.append(True)
                async with database.connection() as other:
                    await other.execute(
                        """UPDATE transcript.conversations
                              SET lease_turn_id = NULL, lease_fencing_token = NULL,
                                  lease_until = NULL
                            WHERE namespace = %s AND conversation_id = %s""",
                        (namespace, uuid.UUID(cid)),
                    )
            return cursor

    monkeypatch.setattr(store_sql, "APPEND", EndsTheLeaseAfterTheFirstTry())
    result = await service.append(namespace, cid, 0, [user("q")], "r-after-the-lease")
    assert ran and result.record.version == 1 and not result.replayed
