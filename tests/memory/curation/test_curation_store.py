"""The curation queue and a batch's transaction on PostgreSQL (a fresh migrated database per
test): one active job per conversation, leases, the cap of waiting jobs, the fair order
between namespaces, the hourly budget, and a batch applied whole, once, or not at all."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from services.common.errors import DomainError
from services.common.postgres.pool import Database
from services.memory.curation.model import Batch, CurationJob, JobState
from services.memory.curation.store import PostgresCurationStore
from services.memory.model import MemorySource
from services.memory.store import PostgresMemoryStore
from services.memory.writes.model import MemoryWrite, Supersession
from tests.support.settings import server_settings

NOW = datetime(2026, 12, 3, 10, 30, tzinfo=UTC)


@pytest.fixture
async def db(fresh_database_url: str) -> AsyncIterator[Database]:
    database = Database(fresh_database_url, server_settings())
    await database.open()
    yield database
    await database.close()


@pytest.fixture
def queue(db: Database) -> PostgresCurationStore:
    return PostgresCurationStore(db)


@pytest.fixture
def memories(db: Database) -> PostgresMemoryStore:
    return PostgresMemoryStore(db)


async def enqueue(
    queue: PostgresCurationStore,
    namespace: str,
    cid: uuid.UUID,
    incarnation: int = 7,
    max_pending: int = 1000,
) -> tuple[CurationJob, bool]:
    queued = await queue.enqueue(uuid.uuid4(), namespace, cid, incarnation, max_pending)
    assert queued is not None
    return queued


async def claimed(queue: PostgresCurationStore, worker: str = "w1") -> CurationJob:
    job = await queue.claim(worker, 30)
    assert job is not None and job.lease_token is not None
    return job


def write(
    namespace: str,
    cid: uuid.UUID,
    sequence: int,
    content: str,
    *,
    valid_from: datetime = NOW,
    supersedes: Sequence[Supersession] = (),
) -> MemoryWrite:
    return MemoryWrite(
        namespace=namespace,
        memory_id=uuid.uuid4(),
        content=content,
        sources=[MemorySource(cid, sequence, sequence)],
        metadata={"runifold.origin": "curation"},
        expected_revision=None,
        expire_time=None,
        embedding_model="test/model",
        embedding_dimension=8,
        valid_from_time=valid_from,
        supersedes=supersedes,
    )


def batch(job: CurationJob, after: int, through: int, **fields: object) -> Batch:
    assert job.lease_token is not None
    return Batch(
        job.job_id,
        job.lease_token,
        job.namespace,
        job.conversation_id,
        job.incarnation,
        after,
        through,
        3,
        **fields,  # type: ignore[arg-type]
    )


async def contents(memories: PostgresMemoryStore, namespace: str) -> list[str]:
    found = await memories.list_memories(namespace, None, None, 100)
    return sorted(m.content for m in found)


# -- the queue ------------------------------------------------------------------------


async def test_one_active_job_per_conversation_and_a_request_while_it_runs(
    queue: PostgresCurationStore, namespace: str
) -> None:
    cid = uuid.uuid4()
    results = await asyncio.gather(*(enqueue(queue, namespace, cid) for _ in range(8)))
    assert sum(created for _, created in results) == 1
    assert len({job.job_id for job, _ in results}) == 1
    job = await claimed(queue)
    assert job.state is JobState.RUNNING and job.attempts == 1
    assert await queue.claim("w2", 30) is None
    again, created = await enqueue(queue, namespace, cid)
    assert not created and again.job_id == job.job_id
    assert job.lease_token is not None
    # Asked again while it ran: it waits again rather than finishing.
    assert await queue.complete(job, job.lease_token, requeue=False) is JobState.PENDING
    rerun = await claimed(queue)
    assert rerun.job_id == job.job_id and rerun.lease_token is not None
    assert await queue.complete(rerun, rerun.lease_token, requeue=False) is JobState.DONE
    assert (await queue.backlog(namespace, NOW)).depth == 0
    _, created = await enqueue(queue, namespace, cid)
    assert created


async def test_a_stale_lease_changes_nothing(queue: PostgresCurationStore, namespace: str) -> None:
    job, _ = await enqueue(queue, namespace, uuid.uuid4())
    first = await queue.claim("w1", 0.01)
    assert first is not None and first.lease_token is not None
    await asyncio.sleep(0.05)  # let the lease lapse (a duration, not a condition)
    taken = await claimed(queue, "w2")
    assert taken.job_id == job.job_id
    assert (taken.attempts, taken.failures, taken.last_error) == (2, 1, "LEASE_EXPIRED")
    assert not await queue.extend_lease(job.job_id, first.lease_token, 30)
    assert await queue.complete(first, first.lease_token, requeue=False) is None


async def test_the_waiting_jobs_of_a_namespace_are_capped(
    queue: PostgresCurationStore, namespace: str
) -> None:
    cids = [uuid.uuid4() for _ in range(3)]
    for cid in cids[:2]:
        await enqueue(queue, namespace, cid, max_pending=2)
    assert await queue.enqueue(uuid.uuid4(), namespace, cids[2], 7, 2) is None
    # A conversation that has its job still gets it back; another namespace is not capped.
    _, created = await enqueue(queue, namespace, cids[0], max_pending=2)
    assert not created
    _, created = await enqueue(queue, namespace + "-other", cids[2], max_pending=2)
    assert created


async def test_the_cap_holds_under_concurrent_requests(
    queue: PostgresCurationStore, namespace: str
) -> None:
    queued = await asyncio.gather(
        *(queue.enqueue(uuid.uuid4(), namespace, uuid.uuid4(), 7, 5) for _ in range(20))
    )
    assert sum(q is not None for q in queued) == 5
    assert (await queue.backlog(namespace, NOW)).depth == 5


async def test_a_namespace_that_floods_the_queue_takes_turns_with_the_others(
    queue: PostgresCurationStore, namespace: str
) -> None:
    """Namespace A queues six jobs, then B queues one: B's job is claimed second, not
    seventh; and A's queued later still follow in their order."""
    flood, other = namespace + "-a", namespace + "-b"
    a_jobs = [(await enqueue(queue, flood, uuid.uuid4()))[0].job_id for _ in range(6)]
    b_job = (await enqueue(queue, other, uuid.uuid4()))[0].job_id
    order = [(await claimed(queue)).job_id for _ in range(7)]
    assert set(order[:2]) == {a_jobs[0], b_job}
    assert [j for j in order if j != b_job] == a_jobs


async def test_an_enqueue_for_an_erased_incarnation_is_refused(
    queue: PostgresCurationStore, memories: PostgresMemoryStore, namespace: str
) -> None:
    cid = uuid.uuid4()
    job, _ = await enqueue(queue, namespace, cid, incarnation=7)
    # The erasure deletes the conversation's jobs and fences its incarnation.
    await memories.forget_source(namespace, cid, 1, 2**62, incarnation=7)
    assert await queue.get_job(job.job_id) is None
    with pytest.raises(DomainError) as refused:
        await queue.enqueue(uuid.uuid4(), namespace, cid, 7, 1000)
    assert refused.value.reason == "CONVERSATION_ERASED"
    _, created = await enqueue(queue, namespace, cid, incarnation=8)  # the id made again
    assert created


async def test_the_hourly_budget_refuses_a_call_past_a_limit(
    queue: PostgresCurationStore, namespace: str
) -> None:
    assert await queue.reserve(namespace, NOW, 100, 2, 0)
    assert await queue.reserve(namespace, NOW, 100, 2, 0)
    assert not await queue.reserve(namespace, NOW, 100, 2, 0)  # a third call this hour
    assert await queue.reserve(namespace, NOW + timedelta(hours=1), 100, 2, 0)  # next hour
    assert await queue.reserve(namespace + "-b", NOW, 100, 2, 0)  # another namespace
    assert not await queue.reserve(namespace + "-c", NOW, 501, 0, 500)  # tokens
    assert await queue.reserve(namespace + "-c", NOW, 400, 0, 500)
    assert not await queue.reserve(namespace + "-c", NOW, 101, 0, 500)
    await queue.settle(namespace + "-c", NOW, -300)  # the call used 100 of its 400
    assert await queue.reserve(namespace + "-c", NOW, 101, 0, 500)
    spent = await queue.backlog(namespace, NOW)
    assert (spent.model_calls_this_hour, spent.tokens_this_hour) == (2, 200)


async def test_a_namespace_over_budget_waits_with_its_jobs(
    queue: PostgresCurationStore, namespace: str
) -> None:
    over, fine = namespace + "-a", namespace + "-b"
    for _ in range(3):
        await enqueue(queue, over, uuid.uuid4())
    assert await queue.defer_namespace(over, "CURATION_BUDGET_EXHAUSTED", 3600) == 3
    other, _ = await enqueue(queue, fine, uuid.uuid4())
    assert (await claimed(queue)).job_id == other.job_id
    assert await queue.claim("w", 30) is None


# -- a batch's transaction -------------------------------------------------------------


async def test_a_batch_stores_its_facts_and_moves_the_cursor_once(
    queue: PostgresCurationStore, memories: PostgresMemoryStore, namespace: str
) -> None:
    cid = uuid.uuid4()
    await enqueue(queue, namespace, cid)
    job = await claimed(queue)
    facts = [write(namespace, cid, 1, "The user lives in Berlin.")]
    result = await queue.apply_batch(batch(job, 0, 2), facts, NOW)
    assert (result.added, result.superseded) == (1, 0)
    cursor = await queue.cursor(namespace, cid, job.incarnation)
    assert (cursor.curated_through, cursor.curated_version) == (2, 3)
    assert (await queue.cursor(namespace, cid, job.incarnation + 1)).curated_through == 0
    # The same batch again (a worker that did not learn it committed): refused, nothing more.
    with pytest.raises(DomainError) as moved:
        await queue.apply_batch(
            batch(job, 0, 2), [write(namespace, cid, 1, "The user lives in Berlin.")], NOW
        )
    assert moved.value.reason == "CURATION_CURSOR_MOVED"
    assert moved.value.metadata == {"curated_through": "2"}
    assert await contents(memories, namespace) == ["The user lives in Berlin."]
    stored = await queue.get_job(job.job_id)
    assert stored is not None and (stored.batches, stored.facts) == (1, 1)
    assert (await queue.backlog(namespace, NOW)).facts_this_hour == 1


async def test_a_batch_under_a_lost_lease_stores_nothing(
    queue: PostgresCurationStore, memories: PostgresMemoryStore, namespace: str
) -> None:
    cid = uuid.uuid4()
    await enqueue(queue, namespace, cid)
    job = await queue.claim("w1", 0.01)
    assert job is not None
    await asyncio.sleep(0.05)  # the lease lapses (a duration, not a condition)
    await claimed(queue, "w2")  # and is taken over
    with pytest.raises(DomainError) as lost:
        await queue.apply_batch(batch(job, 0, 1), [write(namespace, cid, 1, "A fact.")], NOW)
    assert lost.value.reason == "CURATION_LEASE_LOST"
    assert await contents(memories, namespace) == []
    assert (await queue.cursor(namespace, cid, job.incarnation)).curated_through == 0


async def test_a_batch_after_the_erasure_stores_nothing(
    queue: PostgresCurationStore, memories: PostgresMemoryStore, namespace: str
) -> None:
    cid = uuid.uuid4()
    await enqueue(queue, namespace, cid)
    job = await claimed(queue)
    await memories.forget_source(namespace, cid, 1, 2**62, incarnation=job.incarnation)
    with pytest.raises(DomainError) as erased:
        await queue.apply_batch(batch(job, 0, 1), [write(namespace, cid, 1, "A fact.")], NOW)
    assert erased.value.reason == "CONVERSATION_ERASED"
    assert await contents(memories, namespace) == []


async def test_a_supersession_of_a_memory_changed_meanwhile_refuses_the_whole_batch(
    queue: PostgresCurationStore, memories: PostgresMemoryStore, namespace: str
) -> None:
    """The proposer saw Berlin at revision 1; a person updated it to revision 2 before the
    batch committed: the batch (its other fact and its cursor too) stores nothing."""
    cid = uuid.uuid4()
    old = write(namespace, cid, 1, "The user lives in Berlin.", valid_from=NOW - timedelta(days=1))
    await memories.create(old)
    await memories.update(
        replace(old, content="The user lives in Berlin (Mitte).", expected_revision=1)
    )
    await enqueue(queue, namespace, cid)
    job = await claimed(queue)
    facts = [
        write(namespace, cid, 3, "The user likes jazz."),
        write(
            namespace,
            cid,
            4,
            "The user lives in Paris.",
            supersedes=[Supersession(old.memory_id, 1)],
        ),
    ]
    with pytest.raises(DomainError) as conflict:
        await queue.apply_batch(batch(job, 0, 4), facts, NOW)
    assert conflict.value.reason == "REVISION_CONFLICT"
    assert await contents(memories, namespace) == ["The user lives in Berlin (Mitte)."]
    assert (await queue.cursor(namespace, cid, job.incarnation)).curated_through == 0
    # Proposed again from what is stored now (revision 2): it supersedes.
    facts[1] = write(
        namespace, cid, 4, "The user lives in Paris.", supersedes=[Supersession(old.memory_id, 2)]
    )
    result = await queue.apply_batch(batch(job, 0, 4), facts, NOW)
    assert (result.added, result.superseded) == (2, 1)
    berlin = await memories.get(namespace, old.memory_id)
    assert berlin is not None and berlin.superseded_by == facts[1].memory_id


async def test_a_retracted_entry_takes_its_curated_memory_and_only_that(
    queue: PostgresCurationStore, memories: PostgresMemoryStore, namespace: str
) -> None:
    cid = uuid.uuid4()
    await enqueue(queue, namespace, cid)
    job = await claimed(queue)
    curated = [
        write(namespace, cid, 1, "The user's name is Alice."),
        write(namespace, cid, 2, "B."),
    ]
    await queue.apply_batch(batch(job, 0, 2), curated, NOW)
    # A memory a person wrote from the same entry is theirs: a retraction does not take it.
    await memories.create(replace(write(namespace, cid, 1, "Written by hand."), metadata={}))
    result = await queue.apply_batch(batch(job, 2, 2, retracted=[1]), [], NOW)
    assert result.forgotten == 1
    assert await contents(memories, namespace) == ["B.", "Written by hand."]
