"""Curation jobs run one at a time by a worker (CurationWorkers.run_once), against real
TranscriptService and MemoryService in one server (a word-hash embedder and an exact
index: the rules, not the model, are under test): the hourly budget's refusals, and
retracted entries, which cost no model call."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import grpc
import pytest
from prometheus_client import REGISTRY

from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common import stubs
from services.memory.component import MemoryComponent
from services.memory.curation.model import JobState
from services.memory.curation.worker import CurationWorkers
from tests.memory.support import BruteForceIndex, HashEmbedder, memory_config, memory_server
from tests.support.grpc_calls import user


class World:
    def __init__(self, component: MemoryComponent, channel: grpc.aio.Channel) -> None:
        assert component.service is not None and component.curation_store is not None
        self.service = component.service
        self.queue = component.curation_store
        self.workers = CurationWorkers(
            component.service, component.curation_store, component.config
        )
        self.transcript = stubs.transcript(channel)
        self.memory = stubs.memory(channel)

    async def conversation(self, namespace: str, *texts: str) -> str:
        created = await self.transcript.CreateConversation(
            transcript_pb.CreateConversationRequest(namespace=namespace)
        )
        cid = created.conversation.conversation_id
        await self.transcript.AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=namespace, conversation_id=cid, messages=[user(t) for t in texts]
            )
        )
        return cid

    async def request(self, namespace: str, cid: str) -> memory_pb.CurationJob:
        asked = await self.memory.RequestCuration(
            memory_pb.RequestCurationRequest(namespace=namespace, conversation_id=cid)
        )
        return asked.job

    async def contents(self, namespace: str) -> list[str]:
        listed = await self.memory.ListMemories(
            memory_pb.ListMemoriesRequest(namespace=namespace, ignore_validity=True)
        )
        return sorted(m.content for m in listed.memories)

    async def curated_through(self, namespace: str, cid: str) -> int:
        got = await self.transcript.GetConversation(
            transcript_pb.GetConversationRequest(namespace=namespace, conversation_id=cid)
        )
        return got.conversation.curated_through


@pytest.fixture
async def world(fresh_database_url: str) -> AsyncIterator[World]:
    config = memory_config(
        None,
        curation_max_model_calls_per_hour=2,
        curation_max_tokens_per_hour=0,
        curation_backoff_s=0.0,
    )
    embedder = HashEmbedder()
    async with (
        memory_server(
            fresh_database_url,
            config,
            index=BruteForceIndex(embedder.dimension),
            embedder=embedder,
            background=False,
        ) as (running, component),
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        yield World(component, channel)


def refused(reason: str) -> float:
    value = REGISTRY.get_sample_value("runifold_memory_curation_refused_total", {"reason": reason})
    return value or 0.0


async def test_a_namespace_past_its_hourly_calls_waits_with_its_jobs_and_others_go_on(
    world: World, namespace: str
) -> None:
    other = namespace + "-b"
    cids = [await world.conversation(namespace, f"I live in Town{k}.") for k in range(4)]
    jobs = [await world.request(namespace, cid) for cid in cids[:3]]
    assert await world.workers.run_once("w")
    assert await world.workers.run_once("w")
    before = refused("CURATION_BUDGET_EXHAUSTED")
    third = await world.request(namespace, cids[3])  # waits behind
    assert await world.workers.run_once("w")  # its third call of the hour: refused
    assert refused("CURATION_BUDGET_EXHAUSTED") == before + 1
    assert await world.contents(namespace) == [
        "The user lives in Town0.",
        "The user lives in Town1.",
    ]
    # The refused job and the namespace's other waiting job wait for the next hour, counted
    # as no failure; the refusal is their last error.
    for asked in (jobs[2], third):
        job = await world.queue.get_job(uuid.UUID(asked.job_id))
        assert job is not None and job.state is JobState.PENDING
        assert job.last_error == "CURATION_BUDGET_EXHAUSTED" and job.failures == 0
    backlog = await world.memory.GetCurationBacklog(
        memory_pb.GetCurationBacklogRequest(namespace=namespace)
    )
    assert (backlog.depth, backlog.model_calls_this_hour, backlog.facts_this_hour) == (2, 2, 2)
    assert not await world.workers.run_once("w")  # nothing due
    # Another namespace is not held back.
    mine = await world.conversation(other, "I work at Acme.")
    await world.request(other, mine)
    assert await world.workers.run_once("w")
    assert await world.contents(other) == ["The user works at Acme."]


async def test_retracted_entries_cost_no_model_call_and_are_never_curated(
    world: World, namespace: str
) -> None:
    cid = await world.conversation(namespace, "I live in Oslo.", "My name is Bob.")
    await world.transcript.AppendEntries(
        transcript_pb.AppendEntriesRequest(
            namespace=namespace, conversation_id=cid, expected_version=1, retract_sequences=[1, 2]
        )
    )
    await world.request(namespace, cid)
    assert await world.workers.run_once("w")
    assert await world.contents(namespace) == []
    assert await world.curated_through(namespace, cid) == 2
    backlog = await world.service.curation_backlog(namespace)
    assert (backlog.depth, backlog.model_calls_this_hour) == (0, 0)
    assert (await world.queue.backlog(namespace, datetime.now(UTC))).tokens_this_hour == 0


def sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_each_job_counts_its_model_calls_tokens_and_facts(
    world: World, namespace: str
) -> None:
    cid = await world.conversation(namespace, "I live in Lima.", "I work at Acme.")
    await world.request(namespace, cid)
    names = ("facts", "model_calls", "tokens")
    before = {n: sample(f"runifold_memory_curation_job_{n}_sum") for n in names}
    jobs = sample("runifold_memory_curation_job_facts_count")
    assert await world.workers.run_once("w")
    after = {n: sample(f"runifold_memory_curation_job_{n}_sum") for n in names}
    assert sample("runifold_memory_curation_job_facts_count") == jobs + 1
    assert after["facts"] - before["facts"] == 2
    assert after["model_calls"] - before["model_calls"] == 1
    backlog = await world.queue.backlog(namespace, datetime.now(UTC))
    assert after["tokens"] - before["tokens"] == backlog.tokens_this_hour > 0
