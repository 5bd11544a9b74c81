"""SummaryService benchmarks: the cost of one job claim by queue depth (issue 12), and the
queue drain rate with the offline summarizer (issue 3).

Claim: the queue holds 100, then 100,000 due pending jobs (plus 1,000 finished
ones); a worker's claim (`PostgresSummaryStore.claim`, one statement) is timed
CLAIMS times at each depth, each claimed job given back (`release`) so the
depth stays put. Goal: flat, the same cost at both depths.

Drain:
TranscriptService runs in its own process. For each worker layout, the same
jobs (one per conversation; 40 entries, window 4, batch 8: 5 passes a job)
are inserted into the queue in one statement while the worker processes are
already up and idle, and the time until the queue is empty is measured, so
process start-up is not counted. The summaries are erased between layouts.
Every process shares the machine's cores with PostgreSQL: compare the
ratios within one run. No threshold is asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import grpc
import psycopg

from bench.common import Stats, new_database, server_process
from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import migrations, stubs
from services.common.postgres.pool import Database
from services.common.settings import Settings
from services.summary.component import MIGRATIONS
from services.summary.store import PostgresSummaryStore

CLAIM_DEPTHS = (100, 100_000)
CLAIMS = 500
CONVERSATIONS = 200
ENTRIES = 40
WINDOW, BATCH = 4, 8
PASSES_PER_JOB = -(-(ENTRIES - WINDOW) // BATCH)
NAMESPACE = "bench-summary"
# (label, worker processes, workers per process)
LAYOUTS = [
    ("1 process x 1 worker", 1, 1),
    ("1 process x 2 workers", 1, 2),
    ("2 processes x 1 worker", 2, 1),
]


async def _conversations(address: str) -> list[str]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = stubs.transcript(channel)
        cids = []
        for k in range(CONVERSATIONS):
            created = await stub.CreateConversation(
                pb.CreateConversationRequest(namespace=NAMESPACE)
            )
            cid = created.conversation.conversation_id
            await stub.AppendEntries(
                pb.AppendEntriesRequest(
                    conversation_id=cid,
                    namespace=NAMESPACE,
                    messages=[
                        common_pb2.Message(
                            role=common_pb2.ROLE_USER if i % 2 else common_pb2.ROLE_ASSISTANT,
                            text=f"conversation {k}, message {i}: some words to summarize",
                        )
                        for i in range(1, ENTRIES + 1)
                    ],
                )
            )
            cids.append(cid)
        return cids


async def _drain(url: str, transcript: str, processes: int, workers: int, cids: list[str]) -> float:
    """Seconds to drain one job per conversation with the given worker layout."""
    env = {
        "TRANSCRIPT_SERVICE_ADDR": transcript,
        "RUNIFOLD_SUMMARY_MODEL_URL": "offline",
        "RUNIFOLD_SUMMARY_WORKERS": str(workers),
        "RUNIFOLD_SUMMARY_POLL_INTERVAL_S": "0.02",
        "RUNIFOLD_DB_POOL_MIN": "2",
    }
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(processes):
            await stack.enter_async_context(server_process("services.summary", url, env))
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("TRUNCATE summary.summaries, summary.summary_history, summary.jobs")
            start = time.perf_counter()
            await conn.execute(
                """INSERT INTO summary.jobs
                          (job_id, namespace, conversation_id, window_size, summary_batch)
                   SELECT gen_random_uuid(), %s, cid, %s, %s FROM unnest(%s::uuid[]) AS cid""",
                (NAMESPACE, WINDOW, BATCH, [uuid.UUID(c) for c in cids]),
            )
            while True:
                cursor = await conn.execute(
                    "SELECT count(*) FROM summary.jobs WHERE state IN ('pending', 'running')"
                )
                row = await cursor.fetchone()
                if row is not None and row[0] == 0:
                    break
                await asyncio.sleep(0.01)
            elapsed = time.perf_counter() - start
            cursor = await conn.execute(
                "SELECT count(*) FROM summary.jobs WHERE state = 'done' AND attempts = 1"
            )
            row = await cursor.fetchone()
            if row is None or row[0] != len(cids):
                raise RuntimeError("not every job finished on its first attempt")
    return elapsed


async def claim_cost(postgres_url: str) -> list[str]:
    """One claim's latency at each queue depth, in one run."""
    url = new_database(postgres_url)
    db = Database(url, Settings.from_env({"RUNIFOLD_METRICS_LISTEN": "off"}))
    await db.open()
    lines = ["## SummaryService job claim by queue depth", ""]
    p50: dict[int, float] = {}
    try:
        await migrations.migrate(db, "summary", MIGRATIONS)
        store = PostgresSummaryStore(db)
        for depth in CLAIM_DEPTHS:
            async with db.connection() as conn:
                await conn.execute("TRUNCATE summary.jobs")
                await conn.execute(
                    """INSERT INTO summary.jobs
                              (job_id, namespace, conversation_id, window_size, summary_batch,
                               state, finish_time)
                       SELECT gen_random_uuid(), %s, gen_random_uuid(), 4, 8, 'done', now()
                         FROM generate_series(1, 1000)""",
                    (NAMESPACE,),
                )
                await conn.execute(
                    """INSERT INTO summary.jobs
                              (job_id, namespace, conversation_id, window_size, summary_batch,
                               run_after)
                       SELECT gen_random_uuid(), %s, gen_random_uuid(), 4, 8,
                              now() - make_interval(secs => s)
                         FROM generate_series(1, %s) AS s""",
                    (NAMESPACE, depth),
                )
                await conn.execute("ANALYZE summary.jobs")
            latencies = []
            for _ in range(CLAIMS):
                t0 = time.perf_counter()
                job = await store.claim("bench", 60)
                latencies.append(time.perf_counter() - t0)
                if job is None or job.lease_token is None:
                    raise RuntimeError("the queue ran dry")
                await store.release(job.job_id, job.lease_token)
            # The rate counts claim time only (the releases are not timed).
            stats = Stats(f"claim at {depth:,} pending jobs", latencies, sum(latencies))
            p50[depth] = stats.p50
            lines.append(stats.row())
    finally:
        await db.close()
    low, high = CLAIM_DEPTHS
    lines.append(
        f"claim p50 at {high:,} / at {low:,} pending jobs: {p50[high] / p50[low]:.2f}"
        " (goal: flat, about 1)"
    )
    return lines


async def run(postgres_url: str) -> list[str]:
    lines = await claim_cost(postgres_url)
    lines.append("")
    lines += await drain_rate(postgres_url)
    return lines


async def drain_rate(postgres_url: str) -> list[str]:
    url = new_database(postgres_url)
    lines = [
        "## SummaryService queue drain (offline summarizer)",
        "",
        f"{CONVERSATIONS} jobs, {ENTRIES} entries each, window {WINDOW}, batch {BATCH}: "
        f"{PASSES_PER_JOB} passes a job",
    ]
    async with server_process("services.transcript", url) as transcript:
        cids = await _conversations(transcript)
        rates = {}
        for label, processes, workers in LAYOUTS:
            elapsed = await _drain(url, transcript, processes, workers, cids)
            rates[label] = len(cids) / elapsed
            lines.append(
                f"{label:<28} {rates[label]:>8.1f} jobs/s  "
                f"({rates[label] * PASSES_PER_JOB:.0f} passes/s, {elapsed:.2f} s)"
            )
    base = rates[LAYOUTS[0][0]]
    for label, _, _ in LAYOUTS[1:]:
        lines.append(f"ratio {label} / 1 worker: {rates[label] / base:.2f}")
    return lines
