"""The summary job queue on PostgreSQL, and what only PostgreSQL can show (row locks,
SKIP LOCKED)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest

from services.common.postgres.pool import Database
from services.summary.store import PostgresSummaryStore, SummaryStore
from tests.summary.jobs.cases import JobQueueCases
from tests.summary.support import new_job


class TestJobQueueOnPostgres(JobQueueCases):
    @pytest.fixture
    def store(self, isolated: Database) -> SummaryStore:
        return PostgresSummaryStore(isolated, history_limit=3)


async def test_concurrent_claimers_take_each_job_exactly_once(
    isolated: Database, namespace: str
) -> None:
    store = PostgresSummaryStore(isolated)
    jobs = [(await store.enqueue(new_job(namespace, uuid.uuid4())))[0].job_id for _ in range(60)]
    claimed: Counter[uuid.UUID] = Counter()

    async def claimer(name: str) -> None:
        while (job := await store.claim(name, 30)) is not None:
            claimed[job.job_id] += 1
            assert job.lease_token is not None
            await store.complete(job.job_id, job.lease_token, requeue=False)

    await asyncio.gather(*(claimer(f"w{i}") for i in range(12)))
    assert sorted(claimed) == sorted(jobs)
    assert set(claimed.values()) == {1}
    backlog = await store.backlog(namespace)
    assert (backlog.depth, backlog.running_count) == (0, 0)


async def test_backlog_age_follows_the_oldest_waiting_job(
    isolated: Database, namespace: str
) -> None:
    store = PostgresSummaryStore(isolated)
    await store.enqueue(new_job(namespace, uuid.uuid4()))
    async with isolated.connection() as conn:
        await conn.execute(
            "UPDATE summary.jobs SET enqueue_time = now() - interval '90 seconds' "
            "WHERE namespace = %s",
            (namespace,),
        )
    backlog = await store.backlog(namespace)
    assert backlog.depth == 1 and 90 <= backlog.oldest_pending_age_s < 3600
    assert (await store.backlog("someone-else")).depth == 0
