"""Curation workers at the process boundary (issue 30): MemoryService as its own processes
(`python -m services.memory`, the curator and the embeddings on the fake OpenAI-compatible
server, the pgvector index that replicas share), TranscriptService beside them.

- Two processes, two workers each, over one namespace: every entry is read by the
  proposer once and every fact stored once; both processes take jobs.
- A worker SIGKILLed in the middle of a batch's transaction (its memories written, not
  committed): nothing of the batch is visible, and the next process applies the batch
  once, after the dead worker's lease lapses.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common import stubs
from services.common.server import RunningServer, serving
from services.memory.proposals.prompt import SYSTEM_PROMPT
from services.transcript.component import TranscriptComponent
from tests.support.fake_openai import FakeOpenAI, FakeReply, fake_openai
from tests.support.grpc_calls import user
from tests.support.process import ServiceProcess, service_process
from tests.support.settings import server_settings
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

_ENTRY = re.compile(r'<entry sequence="(\d+)" role="user"[^>]*>([^<]*)</entry>')
_FACT = re.compile(r"fact (\S+)")


class Proposer:
    """The fake model as the proposer: "fact X" in a user entry is the fact "Fact X." from
    that entry. Records which entries each call read; holds its answers while `hold` is
    clear."""

    def __init__(self, model: FakeOpenAI) -> None:
        self.read: list[str] = []
        self.hold = asyncio.Event()
        self.hold.set()
        model.respond_with(self._respond)

    async def _respond(self, body: Any) -> FakeReply:
        assert body["messages"][0]["content"] == SYSTEM_PROMPT
        prompt = body["messages"][-1]["content"]
        entries = _ENTRY.findall(prompt)
        self.read += [text for _, text in entries]
        await asyncio.wait_for(self.hold.wait(), 60)
        proposals = [
            {
                "content": f"Fact {match[1]}.",
                "sources": [{"from_sequence": int(seq), "through_sequence": int(seq)}],
                "valid_from_time": None,
                "action": "ADD",
                "related_memory": None,
                "reason": "stated",
            }
            for seq, text in entries
            if (match := _FACT.search(text))
        ]
        return FakeReply(text=json.dumps({"proposals": proposals}), usage=(50, 10))


def memory_env(database_url: str, transcript: str, model: FakeOpenAI) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url,
        "TRANSCRIPT_SERVICE_ADDR": transcript,
        "RUNIFOLD_MEMORY_INDEX": "pgvector",
        "RUNIFOLD_EMBEDDINGS": "openai",
        "RUNIFOLD_EMBEDDINGS_URL": model.base_url,
        "RUNIFOLD_EMBEDDINGS_MODEL": "fake-embeddings",
        "RUNIFOLD_EMBEDDINGS_DIMENSION": "8",
        "RUNIFOLD_CURATOR_MODEL_URL": model.base_url,
        "RUNIFOLD_CURATOR_MODEL_MAX_RETRIES": "0",
        "RUNIFOLD_CURATION_WORKERS": "2",
        "RUNIFOLD_CURATION_POLL_INTERVAL_S": "0.05",
        "RUNIFOLD_CURATION_BATCH_ENTRIES": "4",
        "RUNIFOLD_CURATION_JOB_LEASE_S": "2",
        "RUNIFOLD_CURATION_JOB_BACKOFF_S": "0.1",
        "RUNIFOLD_DB_POOL_MIN": "1",
    }


@pytest.fixture
async def transcript_alone(fresh_database_url: str) -> AsyncIterator[RunningServer]:
    async with serving(
        [TranscriptComponent()], server_settings(), database_url=fresh_database_url
    ) as running:
        yield running


async def conversation(address: str, namespace: str, texts: list[str]) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        transcript = stubs.transcript(channel)
        created = await transcript.CreateConversation(
            transcript_pb.CreateConversationRequest(namespace=namespace)
        )
        cid = created.conversation.conversation_id
        await append(address, namespace, cid, texts)
        return cid


async def append(address: str, namespace: str, cid: str, texts: list[str]) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        await stubs.transcript(channel).AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=namespace, conversation_id=cid, messages=[user(t) for t in texts]
            )
        )


async def request(process: ServiceProcess, namespace: str, cid: str) -> None:
    async with grpc.aio.insecure_channel(process.address) as channel:
        await stubs.memory(channel).RequestCuration(
            memory_pb.RequestCurationRequest(namespace=namespace, conversation_id=cid)
        )


async def curated_through(address: str, namespace: str, cid: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        got = await stubs.transcript(channel).GetConversation(
            transcript_pb.GetConversationRequest(namespace=namespace, conversation_id=cid)
        )
        return got.conversation.curated_through


async def stored(database_url: str, namespace: str) -> list[tuple[str, str, int]]:
    """(content, conversation, entry) of every live memory of the namespace."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cursor = await conn.execute(
            """SELECT content, s->>'c', (s->>'f')::int
                 FROM memory.memories, jsonb_array_elements(sources) AS s
                WHERE namespace = %s ORDER BY 1""",
            (namespace,),
        )
        return [(r[0], r[1], r[2]) for r in await cursor.fetchall()]


async def test_two_worker_processes_curate_each_entry_once(
    fresh_database_url: str, transcript_alone: RunningServer, namespace: str, tmp_path: Path
) -> None:
    address = transcript_alone.address
    async with fake_openai() as model:
        proposer = Proposer(model)
        model.delay = 0.02  # overlapping calls
        env = memory_env(fresh_database_url, address, model)
        async with (
            service_process("services.memory", env, tmp_path / "first") as first,
            service_process("services.memory", env, tmp_path / "second") as second,
        ):
            processes = [first, second]
            cids = [
                await conversation(address, namespace, [f"c{k} fact {k}.1", f"c{k} small talk"])
                for k in range(10)
            ]
            # Each conversation grows in three writes; each write asks for its curation
            # through either process, while the jobs run.
            for step in range(3):
                for k, cid in enumerate(cids):
                    await request(processes[(k + step) % 2], namespace, cid)
                if step < 2:
                    for k, cid in enumerate(cids):
                        more = [f"c{k} fact {k}.{step + 2}", f"c{k}.{step} ok", f"c{k}.{step} hm"]
                        await append(address, namespace, cid, more)

            async def all_curated() -> bool:
                ends = [await curated_through(address, namespace, cid) for cid in cids]
                return ends == [8] * len(cids)

            await wait_for(all_curated, timeout=120)
            jobs = [
                (state, claimed_by, batches)
                for _, state, claimed_by, batches, _ in await settled_jobs(
                    fresh_database_url, namespace
                )
            ]
    facts = await stored(fresh_database_url, namespace)
    # Every fact once, from its own entry; every entry read by the proposer once.
    assert len(facts) == 30 and len({f[0] for f in facts}) == 30
    by_conversation = Counter(cid for _, cid, _ in facts)
    assert set(by_conversation.values()) == {3}
    reads = Counter(proposer.read)
    assert len(reads) == 80
    assert set(reads.values()) == {1}, [t for t, n in reads.items() if n > 1]
    assert all(state == "done" for state, _, _ in jobs)
    assert len({claimed.rsplit(":", 1)[0] for _, claimed, _ in jobs if claimed}) == 2


async def settled_jobs(
    database_url: str, namespace: str
) -> list[tuple[int, str, str | None, int, int]]:
    """The namespace's curation jobs (attempts, state, claimed_by, batches, facts) once
    none is running: the transcript's mark lands before the job's completion (two
    services, two writes), so a job read as soon as the mark is seen may still run."""
    jobs: list[tuple[int, str, str | None, int, int]] = []

    async def settled() -> bool:
        nonlocal jobs
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            cursor = await conn.execute(
                """SELECT attempts, state, claimed_by, batches, facts FROM memory.curation_jobs
                    WHERE namespace = %s ORDER BY job_id""",
                (namespace,),
            )
            jobs = [
                (int(a), str(st), None if by is None else str(by), int(b), int(f))
                for a, st, by, b, f in await cursor.fetchall()
            ]
        return bool(jobs) and all(state != "running" for _, state, _, _, _ in jobs)

    await wait_for(settled, timeout=60)
    return jobs


async def _waiting_on_a_lock(database_url: str, table: str) -> bool:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        cursor = await conn.execute(
            """SELECT count(*) FROM pg_stat_activity
                WHERE datname = current_database() AND wait_event_type = 'Lock'
                  AND query LIKE %s""",
            (f"%{table}%",),
        )
        row = await cursor.fetchone()
        return row is not None and row[0] > 0


async def test_a_worker_killed_inside_a_batch_leaves_nothing_and_the_batch_runs_once_more(
    fresh_database_url: str, transcript_alone: RunningServer, namespace: str, tmp_path: Path
) -> None:
    address = transcript_alone.address
    async with fake_openai() as model:
        proposer = Proposer(model)
        env = {**memory_env(fresh_database_url, address, model), "RUNIFOLD_CURATION_WORKERS": "1"}
        cid = await conversation(address, namespace, ["fact A", "fact B", "chat", "fact C"])
        async with await psycopg.AsyncConnection.connect(fresh_database_url) as blocker:
            # The batch's last write is its cursor: a row another transaction is inserting
            # makes it wait there, its memories written but not committed.
            await blocker.execute(
                """INSERT INTO memory.curation_cursors
                          (namespace, conversation_id, incarnation, curated_through)
                   VALUES (%s, %s, 0, 0)""",
                (namespace, cid),
            )
            async with service_process("services.memory", env, tmp_path / "first") as first:
                await request(first, namespace, cid)
                await wait_for(
                    lambda: _waiting_on_a_lock(fresh_database_url, "curation_cursors"), timeout=60
                )
                assert len(proposer.read) == 4  # one call read the batch's entries
                first.process.kill()  # SIGKILL, in the middle of the batch's transaction
                await first.process.wait()
            assert await stored(fresh_database_url, namespace) == []
            await blocker.rollback()
        # The dead backend's transaction can never commit (no COMMIT will come).
        assert await stored(fresh_database_url, namespace) == []
        async with service_process("services.memory", env, tmp_path / "second"):

            async def done() -> bool:
                return await curated_through(address, namespace, cid) == 4

            await wait_for(done, timeout=60)
            [(attempts, state, _, batches, facts_made)] = await settled_jobs(
                fresh_database_url, namespace
            )
            job = (attempts, state, batches, facts_made)
    facts = await stored(fresh_database_url, namespace)
    assert [(content, entry) for content, _, entry in facts] == [
        ("Fact A.", 1),
        ("Fact B.", 2),
        ("Fact C.", 4),
    ]
    # The batch was proposed twice (the dead worker's call and the redo), applied once.
    assert Counter(proposer.read) == {"fact A": 2, "fact B": 2, "chat": 2, "fact C": 2}
    # Taken over once its lease lapsed (a second attempt), done, one batch of three facts.
    assert job == (2, "done", 1, 3)
