"""The digest chain on PostgreSQL, and what it detects: an entry changed, an entry
deleted, a pair of entries swapped, a commit time changed, each made directly in the
tables (as an operator with database access could), found by recomputing the chain."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import pytest

from services.common.postgres.pool import Database
from services.transcript.digests.model import ChainBroken
from services.transcript.service import TranscriptService
from services.transcript.store import PostgresTranscriptStore, TranscriptStore
from tests.transcript.digests.cases import DigestCases, verify
from tests.transcript.support import assistant, new_conversation, user


class TestDigestsOnPostgres(DigestCases):
    @pytest.fixture
    def store(self, database: Database) -> TranscriptStore:
        return PostgresTranscriptStore(database)


Tamper = Callable[[Database, int], Awaitable[None]]


async def _execute(database: Database, sql: str, *params: object) -> None:
    async with database.connection() as conn:
        cursor = await conn.execute(sql, params)
        assert cursor.rowcount >= 1


async def _change_entry(database: Database, key: int) -> None:
    await _execute(
        database,
        "UPDATE transcript.entries SET text = 'I never said that'"
        " WHERE conversation_key = %s AND sequence = 3",
        key,
    )


async def _delete_entry(database: Database, key: int) -> None:
    await _execute(
        database,
        "DELETE FROM transcript.entries WHERE conversation_key = %s AND sequence = 4",
        key,
    )


async def _swap_pair(database: Database, key: int) -> None:
    # Two entries of one append trade places: each row takes the other's message.
    await _execute(
        database,
        """UPDATE transcript.entries AS e
              SET role = o.role, text = o.text, tool_calls = o.tool_calls
             FROM transcript.entries AS o
            WHERE e.conversation_key = %s AND o.conversation_key = e.conversation_key
              AND e.sequence IN (3, 4) AND o.sequence = 7 - e.sequence""",
        key,
    )


async def _change_commit_time(database: Database, key: int) -> None:
    await _execute(
        database,
        """UPDATE transcript.appends SET commit_time = commit_time - interval '1 hour'
            WHERE conversation_key = %s AND version = 2""",
        key,
    )


@pytest.mark.parametrize(
    "tamper",
    [_change_entry, _delete_entry, _swap_pair, _change_commit_time],
    ids=["changed entry", "deleted entry", "swapped pair", "changed commit time"],
)
async def test_tampering_in_the_database_is_detected(
    database: Database, namespace: str, tamper: Tamper
) -> None:
    service = _service(database)
    cid = await new_conversation(service, namespace)
    await service.append(namespace, cid, 0, [user("u1"), assistant("a1")], "")
    await service.append(namespace, cid, 1, [user("u2"), assistant("a2"), user("u3")], "")
    await service.append(namespace, cid, 2, [], "", retract=[1])
    head = await verify(service, namespace, cid)
    await tamper(database, await _key(database, cid))
    with pytest.raises(ChainBroken) as broken:
        await verify(service, namespace, cid)
    assert broken.value.version == 2
    # The head a client held still names the untampered conversation.
    assert head == (await service.get_conversation(namespace, cid)).head_digest


async def test_tampering_a_sources_prefix_is_detected_in_its_fork(
    database: Database, namespace: str
) -> None:
    service = _service(database)
    source = await new_conversation(service, namespace)
    await service.append(namespace, source, 0, [user("u1"), assistant("a1")], "")
    await service.append(namespace, source, 1, [user("u2"), assistant("a2"), user("u3")], "")
    fork, _ = await service.fork_conversation(namespace, source, 4)
    fid = str(fork.conversation_id)
    await service.append(namespace, fid, fork.version, [user("f5")], "")
    await verify(service, namespace, fid)
    await _change_entry(database, await _key(database, source))
    with pytest.raises(ChainBroken) as broken:
        await verify(service, namespace, fid)
    assert broken.value.version == 2  # the fork append, which holds entries 3..4


def _service(database: Database) -> TranscriptService:
    from tests.transcript.support import make_service

    return make_service(PostgresTranscriptStore(database))


async def _key(database: Database, cid: str) -> int:
    async with database.connection() as conn:
        cursor = await conn.execute(
            "SELECT conversation_key FROM transcript.conversations WHERE conversation_id = %s",
            (uuid.UUID(cid),),
        )
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])
