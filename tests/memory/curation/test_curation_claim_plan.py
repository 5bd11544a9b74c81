"""The curation job claim on PostgreSQL: its cost does not grow with the queue.

A worker polls the queue with one claim. The plan must reach its candidates through
curation_jobs_due (in fair order) and curation_jobs_leases, and read as many rows at
100,000 waiting jobs as at 100, also when another namespace's jobs wait for their
hourly budget (not due: placed behind the due ones in fair order).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from services.common.postgres.pool import Database
from services.memory.curation.model import JobState
from services.memory.curation.statements import CLAIM
from services.memory.curation.store import PostgresCurationStore
from tests.support.settings import server_settings

_CLAIM_INDEXES = {"curation_jobs_due", "curation_jobs_leases", "curation_jobs_pkey"}


@pytest.fixture
async def isolated(fresh_database_url: str) -> AsyncIterator[Database]:
    """A database of its own: a claim sees every namespace's jobs."""
    db = Database(fresh_database_url, server_settings())
    await db.open()
    yield db
    await db.close()


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


async def _fill(db: Database, namespace: str, pending: int) -> None:
    """`pending` due jobs (in fair order), plus jobs that must not be taken: 1,000 of
    another namespace deferred for its budget, two running under live leases, and 1,000
    finished ones."""
    async with db.connection() as conn:
        await conn.execute("TRUNCATE memory.curation_jobs")
        await conn.execute(
            """INSERT INTO memory.curation_jobs
                      (job_id, namespace, conversation_id, incarnation, fair_time)
               SELECT gen_random_uuid(), %s, gen_random_uuid(), 1,
                      now() - make_interval(secs => 3600 + s)
                 FROM generate_series(1, %s) AS s""",
            (namespace, pending),
        )
        await conn.execute(
            """INSERT INTO memory.curation_jobs
                      (job_id, namespace, conversation_id, incarnation, run_after, fair_time)
               SELECT gen_random_uuid(), %s, gen_random_uuid(), 1,
                      now() + interval '1 hour', now() + interval '1 hour'
                 FROM generate_series(1, 1000)""",
            (namespace + "-over-budget",),
        )
        await conn.execute(
            """INSERT INTO memory.curation_jobs
                      (job_id, namespace, conversation_id, incarnation, state, lease_token,
                       lease_until, fair_time)
               SELECT gen_random_uuid(), %s, gen_random_uuid(), 1, 'running',
                      gen_random_uuid(), now() + interval '1 hour', now() - interval '2 days'
                 FROM generate_series(1, 2)""",
            (namespace,),
        )
        await conn.execute(
            """INSERT INTO memory.curation_jobs
                      (job_id, namespace, conversation_id, incarnation, state, finish_time)
               SELECT gen_random_uuid(), %s, gen_random_uuid(), 1, 'done', now()
                 FROM generate_series(1, 1000)""",
            (namespace,),
        )
        await conn.execute("ANALYZE memory.curation_jobs")


async def _claim_plan(db: Database) -> dict[str, Any]:
    """EXPLAIN ANALYZE of one claim, rolled back (the queue is left as it was)."""
    async with db.connection() as conn, conn.transaction():
        cursor = await conn.execute(
            b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIM.encode(),
            {"lease_token": uuid.uuid4(), "lease_s": 30.0, "worker": "explain"},
        )
        row = await cursor.fetchone()
        raise psycopg.Rollback()
    assert row is not None
    document = row[0] if isinstance(row[0], list) else json.loads(row[0])
    plan: dict[str, Any] = document[0]["Plan"]
    return plan


async def test_one_claim_costs_the_same_at_100_and_100000_waiting_jobs(
    isolated: Database, namespace: str
) -> None:
    measured: dict[int, tuple[int, int]] = {}
    for pending in (100, 100_000):
        await _fill(isolated, namespace, pending)
        plan = await _claim_plan(isolated)
        scans = [
            n
            for n in _nodes(plan)
            if n.get("Relation Name") == "curation_jobs" and n["Node Type"] != "ModifyTable"
        ]
        text = json.dumps(plan, indent=1)
        assert scans and all(n["Node Type"] == "Index Scan" for n in scans), text
        assert {n["Index Name"] for n in scans} <= _CLAIM_INDEXES, text
        assert {"curation_jobs_due", "curation_jobs_leases"} <= {n["Index Name"] for n in scans}
        sorts = [n for n in _nodes(plan) if n["Node Type"] == "Sort"]
        assert all(n.get("Sort Space Type") == "Memory" for n in sorts), text
        rows_read = sum(n["Actual Rows"] * n.get("Actual Loops", 1) for n in scans)
        blocks = plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0)
        measured[pending] = (rows_read, blocks)
        job = await PostgresCurationStore(isolated).claim("w", 30)
        assert job is not None and job.state is JobState.RUNNING and job.namespace == namespace
        async with isolated.connection() as conn:
            cursor = await conn.execute(
                "SELECT min(fair_time) = (SELECT fair_time FROM memory.curation_jobs"
                "                          WHERE job_id = %s)"
                "  FROM memory.curation_jobs WHERE state = 'pending' OR job_id = %s",
                (job.job_id, job.job_id),
            )
            assert await cursor.fetchone() == (True,)
    # One due candidate, no expired lease, the row updated: the same at both sizes.
    assert measured[100][0] == measured[100_000][0] == 2, measured
    assert measured[100_000][1] <= measured[100][1] + 8, measured
