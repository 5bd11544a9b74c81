"""The vector index and the summarizer down together, under a mixed load, then back.

The all-in-one server (`python -m services`) runs as its own process with the
real embedding model. Its vector index is pgvector in a PostgreSQL of its own,
which the test stops (a crash: `immediate`) and starts again; its summarizer is
the fake OpenAI server, which answers 503 meanwhile. Agent turns with memory
lookup, memory upserts, searches, appends and summary requests run throughout.

What the Memory and Summary end-to-end tests show one at a time must hold
together, under load: no client call fails at any time; searches (and the
turns' memory lookups) degrade to full-text while the index is down and say so;
upserts keep committing to PostgreSQL and wait in the outbox; summary jobs are
retried without ever being parked; health stays SERVING. Once both are back,
the outbox drains until the index holds exactly the live memories, searches
are semantic again, and the summary queue drains to done.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import psycopg
import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from tests.support.fake_openai import FakeReply, fake_openai
from tests.support.grpc_calls import health_status, user
from tests.support.process import service_process
from tests.support.waiting import wait_for
from tests.system.faults.support import (
    SERVING,
    channel_to,
    dedicated_postgres,
    failure,
)

pytestmark = pytest.mark.slow

SUMMARY_CONVERSATIONS = 4
WINDOW, BATCH = 4, 8
INDEX_TABLE = "memory.runifold_memory_sentence_transformers_all_minilm_l6_v2_384"
TOPICS = ["deploys", "backups", "on-call", "budgets", "storage", "the staging cluster"]


class Load:
    """Counts of what the mixed load did, by kind, and every failure."""

    def __init__(self) -> None:
        self.done: Counter[str] = Counter()
        self.failures: list[str] = []
        self.stop = asyncio.Event()

    async def loop(
        self, kind: str, step: Callable[[int], Awaitable[str | None]], pace: float = 0.0
    ) -> None:
        """Run `step(i)` until told to stop, at most one every `pace` seconds; a step
        returns an extra label to count, if any."""
        for i in itertools.count():
            if self.stop.is_set():
                return
            if pace:
                await asyncio.sleep(pace)  # the load's pace, not a wait for a condition
            try:
                label = await step(i)
            except grpc.aio.AioRpcError as error:
                self.failures.append(f"{kind}: {failure(error)}")
                continue
            self.done[kind] += 1
            if label:
                self.done[label] += 1


async def test_index_and_summarizer_outage_under_mixed_load(
    fresh_database_url: str, tmp_path: Path
) -> None:
    namespace = f"deps-{uuid.uuid4().hex[:8]}"
    async with (
        dedicated_postgres() as index_postgres,
        fake_openai() as summarizer,
    ):
        summarizer.respond_with(lambda body: FakeReply(text="Summary so far.", usage=(40, 5)))
        env = {
            "DATABASE_URL": fresh_database_url,
            "RUNIFOLD_DB_POOL_MAX": "24",
            "RUNIFOLD_AGENT_MODEL_URL": "offline",
            "RUNIFOLD_MEMORY_INDEX": "pgvector",
            "RUNIFOLD_MEMORY_PGVECTOR_URL": index_postgres.url,
            "RUNIFOLD_MEMORY_INDEXER_POLL_S": "0.05",
            "RUNIFOLD_MEMORY_INDEXER_BACKOFF_MAX_S": "0.2",
            "RUNIFOLD_SUMMARY_MODEL_URL": summarizer.base_url,
            "RUNIFOLD_SUMMARY_MODEL_NAME": "fake-model",
            "RUNIFOLD_SUMMARY_MODEL_MAX_RETRIES": "0",
            "RUNIFOLD_SUMMARY_WORKERS": "2",
            "RUNIFOLD_SUMMARY_POLL_INTERVAL_S": "0.05",
            "RUNIFOLD_SUMMARY_JOB_BACKOFF_S": "0.05",
            "RUNIFOLD_SUMMARY_JOB_BACKOFF_MAX_S": "0.2",
            "RUNIFOLD_SUMMARY_JOB_MAX_FAILURES": "2",
        }
        async with (
            service_process("services", env, tmp_path) as process,
            channel_to(process.address) as channel,
            await psycopg.AsyncConnection.connect(fresh_database_url, autocommit=True) as db,
        ):
            transcript, memory = stubs.transcript(channel), stubs.memory(channel)
            summary, agent = stubs.summary(channel), stubs.agent(channel)

            async def conversation(entries: int) -> str:
                created = await transcript.CreateConversation(
                    pb.CreateConversationRequest(namespace=namespace)
                )
                cid = created.conversation.conversation_id
                await transcript.AppendEntries(
                    pb.AppendEntriesRequest(
                        namespace=namespace,
                        conversation_id=cid,
                        messages=[user(f"note {i} about {TOPICS[i % 6]}") for i in range(entries)],
                    )
                )
                return cid

            facts = await conversation(len(TOPICS))
            summarized = [await conversation(30) for _ in range(SUMMARY_CONVERSATIONS)]
            turn_cids = [await conversation(2) for _ in range(2)]
            load = Load()
            index_down = asyncio.Event()

            async def upsert(i: int) -> str | None:
                topic = (i % len(TOPICS)) + 1
                await memory.UpsertMemory(
                    memory_pb.UpsertMemoryRequest(
                        namespace=namespace,
                        content=f"Fact {i}: the team decided something about {TOPICS[i % 6]}.",
                        sources=[
                            memory_pb.MemorySource(
                                conversation_id=facts, from_sequence=topic, through_sequence=topic
                            )
                        ],
                    ),
                    timeout=30,
                )
                return "upsert during outage" if index_down.is_set() else None

            async def search(i: int) -> str | None:
                found = await memory.SearchMemories(
                    memory_pb.SearchMemoriesRequest(
                        namespace=namespace, query=f"what about {TOPICS[i % 6]}?", limit=3
                    ),
                    timeout=30,
                )
                return "degraded search" if found.degraded else "semantic search"

            def turner(cid: str) -> Callable[[int], Awaitable[str | None]]:
                async def turn(i: int) -> str | None:
                    reply = await agent.RunConversation(
                        agent_pb.RunConversationRequest(
                            namespace=namespace,
                            conversation_id=cid,
                            turn_id=str(uuid.uuid4()),
                            input=[user(f"turn {i}: what do we know about deploys?")],
                            policy=agent_pb.ContextPolicy(window=4096, memory_limit=3),
                        ),
                        timeout=60,
                    )
                    return "degraded turn" if reply.context.memory_degraded else None

                return turn

            async def append_and_request(i: int) -> str | None:
                cid = summarized[i % SUMMARY_CONVERSATIONS]
                await transcript.AppendEntries(
                    pb.AppendEntriesRequest(
                        namespace=namespace, conversation_id=cid, messages=[user(f"more {i}")]
                    ),
                    timeout=30,
                )
                await summary.RequestSummary(
                    summary_pb.RequestSummaryRequest(
                        namespace=namespace,
                        conversation_id=cid,
                        window=WINDOW,
                        summary_batch=BATCH,
                    ),
                    timeout=30,
                )
                return None

            tasks = [
                asyncio.create_task(load.loop("upsert", upsert, pace=0.1)),
                asyncio.create_task(load.loop("search", search)),
                asyncio.create_task(load.loop("append", append_and_request, pace=0.1)),
                *(asyncio.create_task(load.loop("turn", turner(cid))) for cid in turn_cids),
            ]

            async def scalar(query: str) -> int:
                cursor = await db.execute(query, (namespace,))
                row = await cursor.fetchone()
                return int(row[0]) if row and row[0] is not None else 0

            async def reached(**wanted: int) -> bool:
                return all(load.done[k.replace("_", " ")] >= n for k, n in wanted.items())

            try:
                await wait_for(
                    lambda: reached(upsert=3, semantic_search=2, append=2, turn=2), timeout=60
                )

                # Both dependencies go down.
                summarizer.fail(503)
                await index_postgres.stop("immediate")
                index_down.set()
                # A model outage counts as an attempt, never as a failure.
                retried = (
                    "SELECT count(*) FROM summary.jobs"
                    " WHERE namespace = %s AND attempts >= 3 AND last_error = 'MODEL_UNAVAILABLE'"
                )
                await wait_for(lambda: reached(upsert_during_outage=5), timeout=60)
                await wait_for(lambda: reached(degraded_search=2, degraded_turn=1), timeout=60)

                async def jobs_retried() -> bool:
                    return await scalar(retried) >= 2

                await wait_for(jobs_retried, timeout=60)
                assert await scalar("SELECT count(*) FROM memory.outbox WHERE namespace = %s") > 0
                assert await health_status(process.address) == SERVING

                # Both come back; the load goes on.
                await index_postgres.start()
                summarizer.recover()
                index_down.clear()
                before = dict(load.done)
                await wait_for(
                    lambda: reached(
                        semantic_search=before["semantic search"] + 3,
                        upsert=before["upsert"] + 3,
                        turn=before["turn"] + 2,
                    ),
                    timeout=60,
                )
            finally:
                load.stop.set()
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 90)

            assert load.failures == [], load.failures
            # An outage never parks a job.
            assert (
                await scalar(
                    "SELECT count(*) FROM summary.jobs WHERE namespace = %s AND state = 'failed'"
                )
                == 0
            )

            async def drained() -> bool:
                backlog = await summary.GetBacklog(
                    summary_pb.GetBacklogRequest(namespace=namespace)
                )
                outbox = await scalar("SELECT count(*) FROM memory.outbox WHERE namespace = %s")
                return backlog.depth == 0 and outbox == 0

            await wait_for(drained, timeout=60)
            for cid in summarized:
                got = await summary.GetSummary(
                    summary_pb.GetSummaryRequest(namespace=namespace, conversation_id=cid)
                )
                assert got.summary.through_sequence > 0
            found = await memory.SearchMemories(
                memory_pb.SearchMemoriesRequest(namespace=namespace, query="deploys", limit=3)
            )
            assert not found.degraded and len(found.results) == 3
            assert await health_status(process.address) == SERVING

            cursor = await db.execute(
                "SELECT memory_id, revision FROM memory.memories WHERE namespace = %s",
                (namespace,),
            )
            live = set(await cursor.fetchall())
        async with await psycopg.AsyncConnection.connect(index_postgres.url) as index_db:
            cursor = await index_db.execute(
                f"SELECT memory_id, revision FROM {INDEX_TABLE} WHERE namespace = %s",
                (namespace,),
            )
            indexed = set(await cursor.fetchall())
    # The index holds exactly the live memories, each at its current revision.
    assert indexed == live and len(live) == load.done["upsert"]
