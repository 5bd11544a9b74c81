"""A retry storm: many clients sending the same request ids and turn ids at once.

The all-in-one server runs as its own process; its agent talks to the fake
OpenAI server, which answers slowly and differently every time, so racing
duplicates of one turn all reach the model and come back with different
outcomes. Every client sends every write twice at once (a hedged request) and
retries after any error, as a client that timed out would. The test requires
exactly-once effects: each request id and each turn id is committed once, in
order, and every client is handed the same committed result, exactly one of them
as the original and every other as a replay.
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
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from tests.fakes.openai_server import FakeReply, fake_openai
from tests.faults.support import failure, stored_appends
from tests.grpc_support import user
from tests.ops.process import service_process

if TYPE_CHECKING:
    from runifold.agent.v1.agent_service_pb2_grpc import AgentServiceAsyncStub
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub

pytestmark = pytest.mark.slow

CLIENTS = 12
APPEND_CONVERSATIONS, APPENDS = 4, 6
TURN_CONVERSATIONS, TURNS = 3, 3

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
            "RUNIFOLD_AGENT_MODEL_PROVIDER": "openai",
            "RUNIFOLD_OPENAI_BASE_URL": model.base_url,
            "RUNIFOLD_AGENT_MODEL": "fake-model",
            "RUNIFOLD_AGENT_MODEL_MAX_RETRIES": "0",
            # Every copy of the storm is one namespace's: its concurrency limits would
            # refuse (and the clients retry) the very duplicates this test races.
            "RUNIFOLD_NAMESPACE_MAX_TURNS": "0",
            "RUNIFOLD_NAMESPACE_MAX_UPSERTS": "0",
        }
        async with service_process("services", env, tmp_path) as process:
            channels = [grpc.aio.insecure_channel(process.address) for _ in range(CLIENTS)]
            try:
                transcripts = [stubs.transcript(ch) for ch in channels]
                agents = [stubs.agent(ch) for ch in channels]
                failures: list[str] = []
                append_replies, turn_replies = await _run(namespace, transcripts, agents, failures)
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
    # Racing duplicates each called the model; none called it twice.
    assert TURN_CONVERSATIONS * TURNS <= model_calls <= 2 * CLIENTS * TURN_CONVERSATIONS * TURNS


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
