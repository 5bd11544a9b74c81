"""The summary job queue (one active job per conversation, claims and their leases,
retries, parking, release), run against every SummaryStore: test_jobs_domain.py on the
in-memory store, test_jobs_store.py on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import uuid

from services.summary.jobs.model import JobState
from services.summary.store import SummaryStore
from tests.summary.support import (
    new_job,
)


class JobQueueCases:
    """Subclasses provide a `store` fixture (a SummaryStore with history_limit 3)."""

    async def test_enqueue_keeps_one_active_job_per_conversation(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()
        results = await asyncio.gather(*(store.enqueue(new_job(namespace, cid)) for _ in range(8)))
        assert sum(created for _, created in results) == 1
        assert len({job.job_id for job, _ in results}) == 1
        assert (await store.backlog(namespace)).depth == 1

    async def test_claim_complete_and_a_request_while_running(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()
        job, _ = await store.enqueue(new_job(namespace, cid))
        claimed = await store.claim("w1", 30)
        assert claimed is not None and claimed.job_id == job.job_id
        assert claimed.state is JobState.RUNNING and claimed.attempts == 1
        assert claimed.claimed_by == "w1" and claimed.lease_token is not None
        assert await store.claim("w2", 30) is None
        backlog = await store.backlog(namespace)
        assert (backlog.depth, backlog.running_count) == (1, 1)
        again, created = await store.enqueue(new_job(namespace, cid))
        assert not created and again.job_id == job.job_id
        assert await store.complete(job.job_id, claimed.lease_token, requeue=False) is (
            JobState.PENDING
        )
        reclaimed = await store.claim("w2", 30)
        assert reclaimed is not None and reclaimed.job_id == job.job_id
        assert reclaimed.lease_token is not None
        assert await store.complete(job.job_id, reclaimed.lease_token, requeue=False) is (
            JobState.DONE
        )
        assert (await store.backlog(namespace)).depth == 0
        _, created = await store.enqueue(new_job(namespace, cid))
        assert created

    async def test_a_repeat_with_a_smaller_window_makes_the_job_reach_as_far(
        self, store: SummaryStore, namespace: str
    ) -> None:
        """A job ahead (window 8) waits when a refused turn of window 4 asks for one: the
        job keeps the smaller window, so the turn finds its entries summarized once the
        job ran (issue 29); a wider request never narrows what the job reaches."""
        cid = uuid.uuid4()
        job, _ = await store.enqueue(new_job(namespace, cid, window=8))
        narrowed, created = await store.enqueue(new_job(namespace, cid, window=4))
        assert not created and narrowed.job_id == job.job_id and narrowed.window == 4
        wider, _ = await store.enqueue(new_job(namespace, cid, window=16))
        assert wider.window == 4
        claimed = await store.claim("w1", 30)
        assert claimed is not None and claimed.window == 4 and claimed.lease_token is not None
        # While it runs, a narrower request marks it to run again with that window.
        again, _ = await store.enqueue(new_job(namespace, cid, window=2))
        assert again.window == 2
        assert await store.complete(job.job_id, claimed.lease_token, requeue=False) is (
            JobState.PENDING
        )
        rerun = await store.claim("w1", 30)
        assert rerun is not None and rerun.job_id == job.job_id and rerun.window == 2

    async def test_a_stale_lease_cannot_change_the_job(
        self, store: SummaryStore, namespace: str
    ) -> None:
        job, _ = await store.enqueue(new_job(namespace, uuid.uuid4()))
        claimed = await store.claim("w1", 0.01)
        assert claimed is not None and claimed.lease_token is not None
        await asyncio.sleep(0.05)  # let the lease lapse (a duration, not a condition)
        taken = await store.claim("w2", 30)
        assert taken is not None and taken.job_id == job.job_id
        assert taken.failures == 1 and taken.last_error == "LEASE_EXPIRED"
        assert taken.attempts == 2
        assert not await store.extend_lease(job.job_id, claimed.lease_token, 30)
        assert await store.complete(job.job_id, claimed.lease_token, requeue=False) is None
        assert taken.lease_token is not None
        assert await store.extend_lease(job.job_id, taken.lease_token, 30)

    async def test_failures_retry_later_then_park(
        self, store: SummaryStore, namespace: str
    ) -> None:
        job, _ = await store.enqueue(new_job(namespace, uuid.uuid4()))
        claimed = await store.claim("w1", 30)
        assert claimed is not None and claimed.lease_token is not None
        state = await store.fail(
            job.job_id,
            claimed.lease_token,
            "MODEL_FAILED",
            counted=True,
            park=False,
            retry_in_s=3600,
        )
        assert state is JobState.PENDING
        assert await store.claim("w1", 30) is None  # not due for an hour
        stored = await store.get_job(job.job_id)
        assert stored is not None and (stored.failures, stored.last_error) == (1, "MODEL_FAILED")
        assert (await store.backlog(namespace)).depth == 1

        other, _ = await store.enqueue(new_job(namespace, uuid.uuid4()))
        claimed = await store.claim("w1", 30)
        assert claimed is not None and claimed.job_id == other.job_id
        assert claimed.lease_token is not None
        state = await store.fail(
            other.job_id,
            claimed.lease_token,
            "SUMMARY_INVALID",
            counted=True,
            park=True,
            retry_in_s=0,
        )
        assert state is JobState.FAILED
        backlog = await store.backlog(namespace)
        assert (backlog.depth, backlog.failed_count) == (1, 1)
        assert await store.prune_jobs(3600) == 0

    async def test_release_gives_the_job_back_uncounted(
        self, store: SummaryStore, namespace: str
    ) -> None:
        job, _ = await store.enqueue(new_job(namespace, uuid.uuid4()))
        claimed = await store.claim("w1", 30)
        assert claimed is not None and claimed.lease_token is not None
        assert await store.release(job.job_id, claimed.lease_token)
        again = await store.claim("w2", 30)
        assert again is not None and again.job_id == job.job_id and again.attempts == 1
