"""Conversations on PostgreSQL, and the query plans of the listings: a page of
conversations (with their previews) and a page of namespaces cost the page, never the
namespace's size, the number of namespaces, nor a conversation's length."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict

from services.common.postgres.pool import Database
from services.transcript.conversations import statements
from services.transcript.conversations.model import PREVIEW_CHARS, PREVIEW_ENTRIES
from services.transcript.store import PostgresTranscriptStore, TranscriptStore
from tests.conftest import _create_database, _drop_database, with_database
from tests.support.settings import server_settings
from tests.transcript.conversations.cases import ConversationCases


class TestConversationsOnPostgres(ConversationCases):
    @pytest.fixture
    def store(self, database: Database) -> TranscriptStore:
        return PostgresTranscriptStore(database)


# -- the plans ---------------------------------------------------------------------------

PAGE = 10
BIG, SMALL = "plan-big", "plan-small"
LONG_ENTRIES = 20_000  # a conversation of tool traffic: no user message to preview


@pytest.fixture(scope="module")
async def planned(postgres_url: str, template_url: str) -> AsyncIterator[Database]:
    """A database of its own (its statistics are the test's): 5,000 conversations in one
    namespace and 50 in another, 300 namespaces, a conversation of 20,000 entries
    without a user message at the head of each listing."""
    name = f"plan_{uuid.uuid4().hex[:8]}"
    template = str(conninfo_to_dict(template_url)["dbname"])
    await _create_database(postgres_url, name, template=template)
    db = Database(with_database(postgres_url, name), server_settings())
    await db.open()
    try:
        async with db.connection() as conn:
            for namespace, count in ((BIG, 5_000), (SMALL, 50)):
                await conn.execute(
                    """INSERT INTO transcript.conversations
                              (namespace, conversation_id, user_id, create_time, update_time)
                       SELECT %s, gen_random_uuid(), CASE WHEN s %% 2 = 0 THEN 'alice' END,
                              now() - s * interval '1 minute', now()
                         FROM generate_series(1, %s) AS s""",
                    (namespace, count),
                )
                # Each conversation: a user message, then an answer.
                await conn.execute(
                    """INSERT INTO transcript.entries
                              (conversation_key, sequence, role, text, created_at)
                       SELECT c.conversation_key, s, 2 - s %% 2, repeat('words ', 100), now()
                         FROM transcript.conversations c, generate_series(1, 2) AS s
                        WHERE c.namespace = %s""",
                    (namespace,),
                )
                # The newest one (first in the listing, and Alice's): tool traffic only.
                await conn.execute(
                    """INSERT INTO transcript.conversations
                              (namespace, conversation_id, user_id, create_time, update_time)
                       VALUES (%s, gen_random_uuid(), 'alice', now() + interval '1 hour', now())""",
                    (namespace,),
                )
                await conn.execute(
                    """INSERT INTO transcript.entries
                              (conversation_key, sequence, role, text, created_at)
                       SELECT c.conversation_key, s, 2, 'tool traffic ' || s, now()
                         FROM transcript.conversations c, generate_series(1, %s) AS s
                        WHERE c.namespace = %s AND c.create_time > now()""",
                    (LONG_ENTRIES, namespace),
                )
            await conn.execute(
                """INSERT INTO transcript.conversations (namespace, conversation_id)
                   SELECT 'plan-ns-' || lpad(s::text, 4, '0'), gen_random_uuid()
                     FROM generate_series(1, 300) AS s"""
            )
            await conn.execute("ANALYZE transcript.conversations")
            await conn.execute("ANALYZE transcript.entries")
        yield db
    finally:
        await db.close()
        await _drop_database(postgres_url, name)


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


def _plan(row: Any) -> dict[str, Any]:
    document = row[0] if isinstance(row[0], list) else json.loads(row[0])
    plan: dict[str, Any] = document[0]["Plan"]
    return plan


async def _explain(db: Database, statement: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """EXPLAIN ANALYZE with the values bound (the plan of a first execution)."""
    async with db.connection() as conn:
        cursor = await conn.execute(
            ("EXPLAIN (ANALYZE, FORMAT JSON) " + statement).encode(), dict(params)
        )
        return _plan(await cursor.fetchone())


async def _explain_generic(
    db: Database, statement: str, params: Mapping[str, Any]
) -> dict[str, Any]:
    """EXPLAIN ANALYZE of the generic plan, the one a prepared statement settles on after a
    few executions (psycopg prepares a statement run five times)."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m[1]) + 1}", statement)
    numbered = numbered.replace("%%", "%")
    async with db.connection() as conn:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        try:
            await conn.execute(f"PREPARE listing AS {numbered}".encode())
            values = pgsql.SQL(", ").join(pgsql.Literal(params[n]) for n in names)
            cursor = await conn.execute(
                pgsql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE listing({})").format(values)
            )
            return _plan(await cursor.fetchone())
        finally:
            await conn.execute("DEALLOCATE listing")
            await conn.execute("RESET plan_cache_mode")


def _reads(plan: dict[str, Any], relation: str) -> list[dict[str, Any]]:
    scans = [n for n in _nodes(plan) if n.get("Relation Name") == relation]
    assert scans, json.dumps(plan, indent=1)
    for scan in scans:
        assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), json.dumps(plan, indent=1)
    return scans


def _rows_read(scan: dict[str, Any]) -> int:
    """Rows a scan read: those it returned and those its filter removed, over its loops."""
    per_loop = scan["Actual Rows"] + scan.get("Rows Removed by Filter", 0)
    return int(per_loop * scan.get("Actual Loops", 1))


@pytest.mark.parametrize("generic", [False, True], ids=["first-plan", "generic-plan"])
@pytest.mark.parametrize(
    "shape",
    [
        {"newest_first": False, "by_user": False},
        {"newest_first": True, "by_user": False},
        {"newest_first": True, "by_user": True},
        {"newest_first": False, "by_user": True},
    ],
    ids=["by-id", "newest", "newest-of-a-user", "by-id-of-a-user"],
)
async def test_a_page_of_conversations_reads_the_page_and_one_probe_each(
    planned: Database, shape: dict[str, bool], generic: bool
) -> None:
    """A page of 10 (11 read) with previews, first and next pages, in a namespace of 50 and
    one of 5,000: the conversations are one index range of 11 rows, each preview one
    index range of at most PREVIEW_ENTRIES entries (the conversation of 20,000 entries
    without a user message is probed like any other), the same rows in both namespaces."""
    store = PostgresTranscriptStore(planned)
    explain = _explain_generic if generic else _explain
    read: dict[tuple[str, bool], tuple[int, int]] = {}
    for namespace in (SMALL, BIG):
        user = "alice" if shape["by_user"] else None
        first = await store.list_conversations(
            namespace, None, PAGE + 1, user, newest_first=shape["newest_first"]
        )
        assert len(first) == PAGE + 1
        if shape["newest_first"]:
            assert first[0].preview == "" and first[1].preview.startswith("words words")
        assert all(len(c.preview) <= PREVIEW_CHARS + 1 for c in first)
        cursor = first[PAGE - 1]
        for after in (None, cursor):
            statement = statements.list_conversations(
                with_state=False, after_cursor=after is not None, **shape
            )
            plan = await explain(
                planned,
                statement,
                {
                    "namespace": namespace,
                    "user_id": user,
                    "after": after.conversation_id if after else None,
                    "after_time": after.create_time if after else None,
                    "limit": PAGE + 1,
                    "preview_chars": PREVIEW_CHARS + 1,
                    "preview_entries": PREVIEW_ENTRIES,
                },
            )
            listed = _reads(plan, "conversations")
            assert len(listed) == 1 and _rows_read(listed[0]) == PAGE + 1, json.dumps(plan)
            (previews,) = _reads(plan, "entries")
            assert "sequence <=" in previews.get("Index Cond", ""), json.dumps(previews)
            assert previews["Actual Loops"] == PAGE + 1
            assert _rows_read(previews) <= (PAGE + 1) * PREVIEW_ENTRIES
            read[(namespace, after is not None)] = (
                _rows_read(listed[0]),
                _rows_read(previews),
            )
    assert read[(SMALL, False)][0] == read[(BIG, False)][0]
    assert read[(SMALL, True)][0] == read[(BIG, True)][0]


@pytest.mark.parametrize("generic", [False, True], ids=["first-plan", "generic-plan"])
async def test_a_page_of_namespaces_is_one_probe_per_namespace(
    planned: Database, generic: bool
) -> None:
    """Among 302 namespaces (one of 5,000 conversations): a page of 10 is 11 probes of the
    index, whatever the namespaces hold; among an identity's grants, one probe each."""
    store = PostgresTranscriptStore(planned)
    listed = await store.list_namespaces("", PAGE + 1)
    assert listed == [BIG, "plan-ns-0001", *[f"plan-ns-{i:04d}" for i in range(2, PAGE + 1)]]
    explain = _explain_generic if generic else _explain
    for after in ("", "plan-ns-0100"):
        plan = await explain(
            planned, statements.LIST_NAMESPACES, {"after": after, "limit": PAGE + 1}
        )
        scans = _reads(plan, "conversations")
        assert sum(_rows_read(scan) for scan in scans) <= PAGE + 1, json.dumps(plan, indent=1)
    granted = [BIG, SMALL, "plan-ns-0007", "plan-none"]
    assert await store.list_namespaces("", PAGE + 1, granted) == sorted(granted[:3])
    plan = await explain(
        planned,
        statements.LIST_GRANTED_NAMESPACES,
        {"after": "", "limit": PAGE + 1, "among": granted},
    )
    scans = _reads(plan, "conversations")
    assert sum(_rows_read(scan) for scan in scans) <= len(granted), json.dumps(plan, indent=1)
