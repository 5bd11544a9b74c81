"""ListEntries and LoadView on PostgreSQL, and the view's query plan."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from services.common.postgres.pool import Database
from services.transcript.store import PostgresTranscriptStore, TranscriptStore
from services.transcript.views.statements import VIEW_SQL
from tests.transcript.support import make_service, new_conversation
from tests.transcript.views.cases import ViewCases


class TestViewsOnPostgres(ViewCases):
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
