"""A retry storm: many clients sending the same request ids and turn ids at once.

The all-in-one server runs as its own process; its agent talks to the fake
OpenAI server, which answers slowly and differently every time, so racing
duplicates of one turn all reach the model and come back with different
outcomes. Every client sends every write twice at once (a hedged request) and
retries after any error, as a client that timed out would. The test requires
exactly-once effects: each request id and each turn id is committed once, in
order, and every client is handed the same committed result, exactly one of them
as the original and every other as a replay; each turn id calls the model once
(its duplicates wait for it); each UpsertMemory request id stores one memory.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import grpc
import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from tests.support.fake_openai import FakeReply, fake_openai
from tests.support.grpc_calls import user
from tests.support.process import service_process
from tests.system.faults.support import failure, stored_appends

if TYPE_CHECKING:
    from runifold.agent.v1.agent_service_pb2_grpc import AgentServiceAsyncStub
    from runifold.memory.v1.memory_service_pb2_grpc import MemoryServiceAsyncStub
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub

pytestmark = pytest.mark.slow

CLIENTS = 12
APPEND_CONVERSATIONS, APPENDS = 4, 6
TURN_CONVERSATIONS, TURNS = 3, 3
MEMORIES = 4

Reply = TypeVar("Reply")


async def _storm(
    clients: int, send: Callable[[int], Awaitable[Reply]], failures: list[str]
) -> list[Reply]:
    """Every client sends the request twice at once and retries each copy until answered."""

    async def copy(client: int) -> Reply:
        while True:
            try:
                return await send(client)
            except grpc.aio.AioRpcError as error:
                failures.append(failure(error))
                await asyncio.sleep(0.02)  # a client's retry backoff

    copies = [copy(c) for c in range(clients) for _ in range(2)]
    return list(await asyncio.gather(*copies))


async def test_a_retry_storm_has_exactly_once_effects(
    fresh_database_url: str, tmp_path: Path
) -> None:
    namespace = f"storm-{uuid.uuid4().hex[:8]}"
    async with fake_openai() as model:
        answers = itertools.count(1)
        model.delay = 0.1
        model.respond_with(lambda body: FakeReply(text=f"answer {next(answers)}", usage=(12, 3)))
        env = {
            "DATABASE_URL": fresh_database_url,
            "RUNIFOLD_DB_POOL_MAX": "24",
            "RUNIFOLD_SUMMARY_WORKERS": "0",
            "RUNIFOLD_AGENT_MODEL_URL": model.base_url,
            "RUNIFOLD_AGENT_MODEL_NAME": "fake-model",
            "RUNIFOLD_AGENT_MODEL_MAX_RETRIES": "0",
            # Every copy of the storm is one namespace's: its concurrency limits would
            # refuse (and the clients retry) the very duplicates this test races.
            "RUNIFOLD_NAMESPACE_MAX_TURNS": "0",
            "RUNIFOLD_NAMESPACE_MAX_UPSERTS": "0",
            # And so would the bounds on turns waiting for a lease (each duplicate of a
            # running turn waits for its outcome).
            "RUNIFOLD_NAMESPACE_MAX_WAITING_TURNS": "0",
            "RUNIFOLD_TURN_MAX_WAITERS_PER_CONVERSATION": "10000",
            "RUNIFOLD_TURN_MAX_WAITERS_PER_NAMESPACE": "10000",
        }
        async with service_process("services", env, tmp_path) as process:
            channels = [grpc.aio.insecure_channel(process.address) for _ in range(CLIENTS)]
            try:
                transcripts = [stubs.transcript(ch) for ch in channels]
                agents = [stubs.agent(ch) for ch in channels]
                failures: list[str] = []
                append_replies, turn_replies = await _run(namespace, transcripts, agents, failures)
                # Memories in a namespace of their own (their source append is not stormed).
                memory_namespace = f"{namespace}-memory"
                memory_replies = await _remember(
                    memory_namespace,
                    transcripts[0],
                    [stubs.memory(ch) for ch in channels],
                    failures,
                )
                listed = await stubs.memory(channels[0]).ListMemories(
                    memory_pb.ListMemoriesRequest(namespace=memory_namespace, page_size=100)
                )
            finally:
                await asyncio.gather(*(ch.close() for ch in channels))
        model_calls = len(model.chat_requests)

    assert failures == [], failures
    stored = await stored_appends(fresh_database_url, namespace)
    committed = {a.request_id: a for appends in stored.values() for a in appends}
    total = APPEND_CONVERSATIONS * APPENDS + TURN_CONVERSATIONS * TURNS
    assert len(committed) == total, "a request id committed more than once, or not at all"
    for (cid, k), replies in append_replies.items():
        stored_append = committed[_request_id(cid, k)]
        assert {(r.version, r.first_sequence, r.last_sequence) for r in replies} == {
            (stored_append.version, stored_append.first_sequence, stored_append.last_sequence)
        }
        assert stored_append.version == k + 1, "request ids committed out of order"
        assert stored_append.texts == _append_texts(cid, k)
        assert sum(not r.replayed for r in replies) == 1
        assert len(replies) == 2 * CLIENTS
    for (cid, k), turn_replies_k in turn_replies.items():
        stored_turn = committed[_turn_id(cid, k)]
        outcomes = {tuple(m.text for m in r.outcome.output) for r in turn_replies_k}
        assert len(outcomes) == 1, f"clients of one turn were told different outcomes: {outcomes}"
        assert stored_turn.texts == (_turn_text(k), *outcomes.pop())
        assert {r.conversation_version for r in turn_replies_k} == {k + 1}
        assert sum(not r.replayed for r in turn_replies_k) == 1
    # One model call per turn id: racing duplicates waited for the first and replayed it.
    assert model_calls == TURN_CONVERSATIONS * TURNS
    # One memory per UpsertMemory request id, the same one handed to every copy.
    for stormed in memory_replies:
        assert len({r.memory.memory_id for r in stormed}) == 1
        assert all(r.memory.revision == 1 and r.created for r in stormed)
    assert len(listed.memories) == MEMORIES
    assert {m.memory_id for m in listed.memories} == {
        stormed[0].memory.memory_id for stormed in memory_replies
    }


async def _remember(
    namespace: str,
    transcript: TranscriptServiceAsyncStub,
    memories: list[MemoryServiceAsyncStub],
    failures: list[str],
) -> list[list[memory_pb.UpsertMemoryResponse]]:
    """Each memory's UpsertMemory (no memory id: the server makes one) stormed by every
    client with one request id."""
    created = await transcript.CreateConversation(pb.CreateConversationRequest(namespace=namespace))
    cid = created.conversation.conversation_id
    await transcript.AppendEntries(
        pb.AppendEntriesRequest(
            namespace=namespace, conversation_id=cid, messages=[user("I moved to Berlin.")]
        )
    )
    replies: list[list[memory_pb.UpsertMemoryResponse]] = []
    for k in range(MEMORIES):
        request = memory_pb.UpsertMemoryRequest(
            namespace=namespace,
            request_id=f"memory-{cid}-{k}",
            content=f"Fact {k}: the user moved to Berlin.",
            sources=[
                memory_pb.MemorySource(conversation_id=cid, from_sequence=1, through_sequence=1)
            ],
        )

        def send(
            c: int, request: memory_pb.UpsertMemoryRequest = request
        ) -> Awaitable[memory_pb.UpsertMemoryResponse]:
            return memories[c].UpsertMemory(request, timeout=30)

        replies.append(await asyncio.wait_for(_storm(CLIENTS, send, failures), 60))
    return replies


def _request_id(cid: str, k: int) -> str:
    return f"storm-{cid}-{k}"


def _turn_id(cid: str, k: int) -> str:
    return f"turn-{cid}-{k}"


def _append_texts(cid: str, k: int) -> tuple[str, ...]:
    return tuple(f"{cid[:8]} append {k} part {p}" for p in range(1 + k % 2))


def _turn_text(k: int) -> str:
    return f"turn {k}: please answer"


async def _run(
    namespace: str,
    transcripts: list[TranscriptServiceAsyncStub],
    agents: list[AgentServiceAsyncStub],
    failures: list[str],
) -> tuple[
    dict[tuple[str, int], list[pb.AppendEntriesResponse]],
    dict[tuple[str, int], list[agent_pb.RunConversationResponse]],
]:
    async def conversation() -> str:
        created = await transcripts[0].CreateConversation(
            pb.CreateConversationRequest(namespace=namespace)
        )
        return created.conversation.conversation_id

    append_cids = [await conversation() for _ in range(APPEND_CONVERSATIONS)]
    turn_cids = [await conversation() for _ in range(TURN_CONVERSATIONS)]
    append_replies: dict[tuple[str, int], list[pb.AppendEntriesResponse]] = defaultdict(list)
    turn_replies: dict[tuple[str, int], list[agent_pb.RunConversationResponse]] = defaultdict(list)

    async def appends(index: int, cid: str) -> None:
        for k in range(APPENDS):
            request = pb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=cid,
                request_id=_request_id(cid, k),
                messages=[user(t) for t in _append_texts(cid, k)],
            )
            if index % 2 == 0:  # half the conversations use compare-and-swap
                request.expected_version = k

            def send(
                c: int, request: pb.AppendEntriesRequest = request
            ) -> Awaitable[pb.AppendEntriesResponse]:
                return transcripts[c].AppendEntries(request, timeout=30)

            append_replies[(cid, k)] = await _storm(CLIENTS, send, failures)

    async def turns(cid: str) -> None:
        for k in range(TURNS):
            request = agent_pb.RunConversationRequest(
                namespace=namespace,
                conversation_id=cid,
                turn_id=_turn_id(cid, k),
                input=[user(_turn_text(k))],
                policy=agent_pb.ContextPolicy(window=4096, memory_limit=0),
            )

            def send(
                c: int, request: agent_pb.RunConversationRequest = request
            ) -> Awaitable[agent_pb.RunConversationResponse]:
                return agents[c].RunConversation(request, timeout=60)

            turn_replies[(cid, k)] = await _storm(CLIENTS, send, failures)

    await asyncio.wait_for(
        asyncio.gather(
            *(appends(i, cid) for i, cid in enumerate(append_cids)),
            *(turns(cid) for cid in turn_cids),
        ),
        timeout=120,
    )
    return append_replies, turn_replies
