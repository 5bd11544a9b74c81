"""The summary job claim on PostgreSQL: its cost does not grow with the queue.

A worker polls the queue with one claim; at 100,000 pending jobs a claim that
scans and sorts every pending job (an OR across the two partial indexes) cost
about 34 ms a poll. The plan must reach its candidates through jobs_due and
jobs_leases and read as many rows at 100,000 pending jobs as at 100.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from services.common.postgres.pool import Database
from services.summary.jobs.model import JobState
from services.summary.jobs.statements import CLAIM
from services.summary.store import PostgresSummaryStore
from tests.support.settings import server_settings

# The indexes a claim may read the jobs table through.
_CLAIM_INDEXES = {"jobs_due", "jobs_leases", "jobs_pkey"}


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
    """`pending` due jobs (oldest first by run_after), plus jobs that must not be
    taken: two running under live leases, and 1,000 finished ones."""
    async with db.connection() as conn:
        await conn.execute("TRUNCATE summary.jobs")
        await conn.execute(
            """INSERT INTO summary.jobs
                      (job_id, namespace, conversation_id, window_size, summary_batch, run_after)
               SELECT gen_random_uuid(), %s, gen_random_uuid(), 4, 8,
                      now() - make_interval(secs => 3600 + s)
                 FROM generate_series(1, %s) AS s""",
            (namespace, pending),
        )
        await conn.execute(
            """INSERT INTO summary.jobs
                      (job_id, namespace, conversation_id, window_size, summary_batch, state,
                       lease_token, lease_until, run_after)
               SELECT gen_random_uuid(), %s, gen_random_uuid(), 4, 8, 'running',
                      gen_random_uuid(), now() + interval '1 hour', now() - interval '2 days'
                 FROM generate_series(1, 2)""",
            (namespace,),
        )
        await conn.execute(
            """INSERT INTO summary.jobs
                      (job_id, namespace, conversation_id, window_size, summary_batch, state,
                       finish_time)
               SELECT gen_random_uuid(), %s, gen_random_uuid(), 4, 8, 'done', now()
                 FROM generate_series(1, 1000)""",
            (namespace,),
        )
        await conn.execute("ANALYZE summary.jobs")


async def _claim_plan(db: Database) -> dict[str, Any]:
    """EXPLAIN ANALYZE of one claim, rolled back (the queue is left as it was)."""
    async with db.connection() as conn, conn.transaction():
        cursor = await conn.execute(
            b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIM.encode(),
            {"lease_token": uuid.uuid4(), "lease_s": 30.0, "worker": "explain"},
        )
        row = await cursor.fetchone()
        raise psycopg.Rollback()  # leaves the transaction block, rolled back
    assert row is not None
    document = row[0] if isinstance(row[0], list) else json.loads(row[0])
    plan: dict[str, Any] = document[0]["Plan"]
    return plan


async def test_one_claim_costs_the_same_at_100_and_100000_pending_jobs(
    isolated: Database, namespace: str
) -> None:
    measured: dict[int, tuple[int, int]] = {}
    for pending in (100, 100_000):
        await _fill(isolated, namespace, pending)
        plan = await _claim_plan(isolated)
        scans = [
            n
            for n in _nodes(plan)
            if n.get("Relation Name") == "jobs" and n["Node Type"] != "ModifyTable"
        ]
        text = json.dumps(plan, indent=1)
        assert scans and all(n["Node Type"] == "Index Scan" for n in scans), text
        assert {n["Index Name"] for n in scans} <= _CLAIM_INDEXES, text
        assert {"jobs_due", "jobs_leases"} <= {n["Index Name"] for n in scans}, text
        # Nothing is sorted on disk; a sort sees at most the expired leases.
        sorts = [n for n in _nodes(plan) if n["Node Type"] == "Sort"]
        assert all(n.get("Sort Space Type") == "Memory" for n in sorts), text
        rows_read = sum(n["Actual Rows"] * n.get("Actual Loops", 1) for n in scans)
        blocks = plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0)
        measured[pending] = (rows_read, blocks)
        # The plan was run and rolled back: the claim itself still takes the oldest job.
        store = PostgresSummaryStore(isolated)
        job = await store.claim("w", 30)
        assert job is not None and job.state is JobState.RUNNING and job.attempts == 1
        async with isolated.connection() as conn:
            cursor = await conn.execute(
                "SELECT min(run_after) = (SELECT run_after FROM summary.jobs WHERE job_id = %s)"
                "  FROM summary.jobs WHERE state = 'pending' OR job_id = %s",
                (job.job_id, job.job_id),
            )
            assert await cursor.fetchone() == (True,)
    # One due candidate, no expired lease, the row updated: the same at both sizes.
    assert measured[100][0] == measured[100_000][0] == 2, measured
    # Pages touched differ only by the index depth, not by the queue's length.
    assert measured[100_000][1] <= measured[100][1] + 8, measured


async def test_an_expired_lease_is_taken_over_in_due_order_and_counted(
    isolated: Database, namespace: str
) -> None:
    """Among 100,000 pending jobs, a job whose worker died (its lease lapsed) is taken
    over when it is the oldest due, with its dead attempt counted as a failure; then
    the pending jobs follow oldest first."""
    await _fill(isolated, namespace, 100_000)
    store = PostgresSummaryStore(isolated)
    async with isolated.connection() as conn:
        # A job claimed long ago (due before every pending job), whose lease lapsed.
        cursor = await conn.execute(
            """INSERT INTO summary.jobs
                      (job_id, namespace, conversation_id, window_size, summary_batch, state,
                       attempts, lease_token, lease_until, run_after)
               VALUES (gen_random_uuid(), %s, gen_random_uuid(), 4, 8, 'running', 1,
                       gen_random_uuid(), now() - interval '1 second', now() - interval '3 days')
               RETURNING job_id""",
            (namespace,),
        )
        row = await cursor.fetchone()
        assert row is not None
        dead = row[0]
        # A lapsed lease on a job due after the oldest pending one waits its turn.
        cursor = await conn.execute(
            """INSERT INTO summary.jobs
                      (job_id, namespace, conversation_id, window_size, summary_batch, state,
                       attempts, lease_token, lease_until, run_after)
               VALUES (gen_random_uuid(), %s, gen_random_uuid(), 4, 8, 'running', 1,
                       gen_random_uuid(), now() - interval '1 second', now())
               RETURNING job_id""",
            (namespace,),
        )
        row = await cursor.fetchone()
        assert row is not None
        late = row[0]
        cursor = await conn.execute(
            """SELECT job_id FROM summary.jobs WHERE state = 'pending'
                ORDER BY run_after LIMIT 2"""
        )
        oldest = [r[0] for r in await cursor.fetchall()]
    taken = await store.claim("w2", 30)
    assert taken is not None and taken.job_id == dead
    assert (taken.attempts, taken.failures, taken.last_error) == (2, 1, "LEASE_EXPIRED")
    assert taken.claimed_by == "w2"
    following = [await store.claim("w3", 30) for _ in range(2)]
    assert [j.job_id for j in following if j is not None] == oldest
    assert all(j is not None and j.failures == 0 for j in following)
    late_job = await store.get_job(late)
    assert late_job is not None and late_job.claimed_by == ""
