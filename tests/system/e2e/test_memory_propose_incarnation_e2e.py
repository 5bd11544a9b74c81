"""Proposals fenced by incarnation (issue 27), through the whole system: TranscriptService,
MemoryService with the chat-model proposer talking to the fake OpenAI-compatible server
over real HTTP, and AgentService.EraseConversation, in one real gRPC server.

A conversation id is made again after an erasure (ADK's fixed session ids do it all the
time). Nothing proposed from the erased incarnation may land in its namesake: a proposal
still in its model call when the erasure comes is refused, and a proposal that came back
before it is refused by UpsertMemory, however late it is confirmed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client import AsyncClient, NotFound
from services.llm.settings import ModelSettings
from services.memory.proposals.prompt import SYSTEM_PROMPT
from tests.support.fake_openai import FakeOpenAI, FakeReply
from tests.support.grpc_calls import reason, user
from tests.support.stack import Stack, full_stack
from tests.support.waiting import wait_for

PIN = "my bank PIN is 9931"
# What the namesake says instead: entry 1 exists again, so the PIN's source (1, 1) is in range.
OTHER = "I live in Porto."


PIN_FACT, PORTO_FACT = "The user's bank PIN is 9931.", "The user lives in Porto."


class ProposerModel:
    """The fake model as the memory proposer: it proposes the fact of entry 1 of the
    transcript it was sent (the PIN, or where the user lives), and answers only once
    `release` is set when `held`."""

    def __init__(self, model: FakeOpenAI, *, held: bool) -> None:
        self.model = model
        self.release = asyncio.Event()
        if not held:
            self.release.set()
        model.requests.clear()
        model.respond_with(self._respond)

    async def _respond(self, body: Any) -> FakeReply:
        assert body["messages"][0]["content"] == SYSTEM_PROMPT  # only the proposer calls it
        read = body["messages"][-1]["content"]
        await asyncio.wait_for(self.release.wait(), 30)  # bounded: a stuck test fails
        proposal = {
            "content": PIN_FACT if "9931" in read else PORTO_FACT,
            "sources": [{"from_sequence": 1, "through_sequence": 1}],
            "valid_from_time": None,
            "action": "ADD",
            "related_memory": None,
            "reason": "the user stated it",
        }
        return FakeReply(text=json.dumps({"proposals": [proposal]}), usage=(60, 20))

    async def asked(self) -> bool:
        return len(self.model.chat_requests) >= 1


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, model: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with full_stack(
        shared_database_url,
        tmp_path_factory.mktemp("propose-fence"),
        None,
        memory={
            "chat_model": ModelSettings(url=model.base_url, max_retries=0),
        },
    ) as running:
        yield running


async def conversation(stack: Stack, namespace: str, text: str, cid: str = "") -> str:
    """A conversation (the id given, or a new one) whose user said `text`."""
    created = await stack.transcript.CreateConversation(
        transcript_pb.CreateConversationRequest(namespace=namespace, conversation_id=cid)
    )
    assert created.created
    cid = created.conversation.conversation_id
    await stack.transcript.AppendEntries(
        transcript_pb.AppendEntriesRequest(
            namespace=namespace, conversation_id=cid, messages=[user(text)]
        )
    )
    return cid


async def erase_and_make_again(stack: Stack, namespace: str, cid: str) -> None:
    """EraseConversation answers complete; then the same id is made again, saying OTHER."""
    erased = await stack.agent.EraseConversation(
        agent_pb.EraseConversationRequest(namespace=namespace, conversation_id=cid), timeout=30
    )
    assert erased.complete, erased
    assert await conversation(stack, namespace, OTHER, cid) == cid


def propose(stack: Stack, namespace: str, cid: str) -> Any:
    return stack.memory.ProposeMemories(
        memory_pb.ProposeMemoriesRequest(
            namespace=namespace, conversation_id=cid, from_sequence=1, through_sequence=1
        ),
        timeout=60,
    )


async def stored(stack: Stack, namespace: str) -> list[str]:
    """The content of every memory of the namespace, whatever its validity."""
    listed = await stack.memory.ListMemories(
        memory_pb.ListMemoriesRequest(namespace=namespace, ignore_validity=True)
    )
    return [m.content for m in listed.memories]


async def test_a_proposal_in_its_model_call_proposes_nothing_once_its_conversation_was_erased(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    """ProposeMemories is inside its model call over the PIN; the conversation is erased
    and made again under its id with other text; the model answers the PIN from (1, 1):
    the call is refused, and nothing of the erased conversation is proposed or stored."""
    proposer = ProposerModel(model, held=True)
    cid = await conversation(stack, namespace, PIN)
    proposing = asyncio.ensure_future(propose(stack, namespace, cid))
    try:
        await wait_for(proposer.asked)
        await erase_and_make_again(stack, namespace, cid)
    finally:
        proposer.release.set()  # a failed step must not leave the model call held
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await proposing
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert reason(refused.value) == "CONVERSATION_ERASED"
    assert "9931" not in (refused.value.details() or "")
    assert await stored(stack, namespace) == []


async def test_a_proposal_made_before_the_erasure_is_refused_by_upsert_after_the_remake(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    """The proposal came back before the erasure, naming the incarnation it read; it is
    confirmed after the id was made again: UpsertMemory refuses it (through the stub and
    through the Python client, which sends the proposal's sources unchanged)."""
    ProposerModel(model, held=False)
    cid = await conversation(stack, namespace, PIN)
    before = await propose(stack, namespace, cid)
    read = await stack.transcript.GetConversation(
        transcript_pb.GetConversationRequest(namespace=namespace, conversation_id=cid)
    )
    (proposal,) = before.proposals
    assert proposal.content == PIN_FACT
    assert [(s.from_sequence, s.incarnation) for s in proposal.sources] == [
        (1, read.conversation.incarnation)
    ]
    await erase_and_make_again(stack, namespace, cid)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.memory.UpsertMemory(
            memory_pb.UpsertMemoryRequest(
                namespace=namespace, content=proposal.content, sources=proposal.sources
            )
        )
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert reason(refused.value) == "SOURCE_NOT_FOUND"
    async with AsyncClient(stack.address, namespace=namespace) as client:
        with pytest.raises(NotFound) as confirmed:
            await client.confirm_proposal(proposal)
        assert confirmed.value.reason == "SOURCE_NOT_FOUND"
        assert confirmed.value.metadata["field"] == "sources[0].incarnation"
        # The namesake's own proposal names its own incarnation and is stored.
        again = await client.propose_memories(cid, from_sequence=1, through_sequence=1)
        now = await client.get_conversation(cid)
        assert [(p.content, [s.incarnation for s in p.sources]) for p in again.proposals] == [
            (PORTO_FACT, [now.incarnation])
        ]
        assert now.incarnation != read.conversation.incarnation
        await client.confirm_proposal(again.proposals[0])
    # Only the namesake's own fact is stored; a memory's sources are ranges.
    listed = await stack.memory.ListMemories(
        memory_pb.ListMemoriesRequest(namespace=namespace, ignore_validity=True)
    )
    assert [
        (m.content, [(s.from_sequence, s.incarnation) for s in m.sources]) for m in listed.memories
    ] == [(PORTO_FACT, [(1, 0)])]
