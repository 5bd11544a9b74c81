"""Automatic curation where it can break (issue 30), through the whole system: the
all-in-one server, its curation jobs proposing with the chat-model proposer against the
fake OpenAI-compatible server over real HTTP, turns with CURATION_MODE_AUTO.

- An erasure while a job holds its model call: nothing of the erased conversation lands,
  even once the model answers; the id made again is curated on its own.
- A supersession under a concurrent manual upsert: the memory the proposer saw changed
  before the batch committed; the batch is refused whole (compare-and-swap) and proposed
  again from what is stored, so the person's revision is superseded, never lost.
- A flood of curation requests from one namespace: refused beyond its cap with RetryInfo,
  and another namespace's turns are served and its job is curated while the flood's
  backlog is still waiting (the queue takes namespaces in turn).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.llm.settings import ModelSettings
from services.memory.proposals.prompt import SYSTEM_PROMPT
from tests.support.fake_openai import FakeOpenAI, FakeReply
from tests.support.grpc_calls import reason, status_detail, user
from tests.support.stack import Stack, full_stack
from tests.support.waiting import wait_for

_ENTRY = re.compile(r'<entry sequence="(\d+)" role="user"[^>]*>([^<]*)</entry>')
_MEMORY = re.compile(r'<memory id="(m\d+)"[^>]*>([^<]*)</memory>')

Facts = Callable[[str], "str | None"]


class Curator:
    """The fake model as the curation proposer: for each user entry it was sent, the fact
    `facts(text)` names (if any), ADD, or SUPERSEDE of a shown memory about the same thing
    (its content starts like the fact's, up to `same_topic` characters). Holds its answer
    while `hold` is clear."""

    def __init__(self, model: FakeOpenAI, facts: Facts, same_topic: int = 0) -> None:
        self.model = model
        self.facts = facts
        self.same_topic = same_topic
        self.hold = asyncio.Event()
        self.hold.set()
        self.calls = 0
        model.requests.clear()
        model.delay = 0
        model.respond_with(self._respond)

    async def _respond(self, body: Any) -> FakeReply:
        assert body["messages"][0]["content"] == SYSTEM_PROMPT  # only the proposer calls it
        read = body["messages"][-1]["content"]
        self.calls += 1
        await asyncio.wait_for(self.hold.wait(), 30)  # bounded: a stuck test fails
        shown = dict((alias, content) for alias, content in _MEMORY.findall(read))
        proposals = []
        for sequence, text in _ENTRY.findall(read):
            fact = self.facts(text)
            if fact is None:
                continue
            topic = fact[: self.same_topic]
            related = next(
                (a for a, c in shown.items() if self.same_topic and c.startswith(topic)), None
            )
            proposals.append(
                {
                    "content": fact,
                    "sources": [
                        {"from_sequence": int(sequence), "through_sequence": int(sequence)}
                    ],
                    "valid_from_time": None,
                    "action": "SUPERSEDE" if related else "ADD",
                    "related_memory": related,
                    "reason": "the user stated it",
                }
            )
        return FakeReply(text=json.dumps({"proposals": proposals}), usage=(80, 20))

    async def asked(self) -> bool:
        return self.calls >= 1


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, model: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with full_stack(
        shared_database_url,
        tmp_path_factory.mktemp("curation-races"),
        None,
        memory={
            "chat_model": ModelSettings(url=model.base_url, max_retries=0),
            "curation_poll_interval_s": 0.05,
            "curation_max_pending": 8,
        },
    ) as running:
        yield running


def turn(namespace: str, cid: str, text: str) -> agent_pb.RunConversationRequest:
    return agent_pb.RunConversationRequest(
        namespace=namespace,
        conversation_id=cid,
        input=[user(text)],
        create_if_missing=True,
        policy=agent_pb.ContextPolicy(curation=agent_pb.CURATION_MODE_AUTO),
    )


async def memories(stack: Stack, namespace: str) -> dict[str, memory_pb.Memory]:
    listed = await stack.memory.ListMemories(
        memory_pb.ListMemoriesRequest(namespace=namespace, ignore_validity=True)
    )
    return {m.content: m for m in listed.memories}


async def curated_through(stack: Stack, namespace: str, cid: str) -> int:
    got = await stack.transcript.GetConversation(
        transcript_pb.GetConversationRequest(namespace=namespace, conversation_id=cid)
    )
    return got.conversation.curated_through


async def backlog(stack: Stack, namespace: str) -> memory_pb.GetCurationBacklogResponse:
    return await stack.memory.GetCurationBacklog(
        memory_pb.GetCurationBacklogRequest(namespace=namespace)
    )


async def reaches(stack: Stack, namespace: str, cid: str, through: int) -> None:
    async def done() -> bool:
        return await curated_through(stack, namespace, cid) >= through

    await wait_for(done, timeout=60)


def residence(text: str) -> str | None:
    match = re.search(r"(?:live in|moved to) (\w+)", text)
    return f"The user lives in {match[1]}." if match else None


async def test_an_erasure_while_a_job_holds_its_model_call_leaves_nothing(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    curator = Curator(model, lambda text: "The user's bank PIN is 9931." if "PIN" in text else None)
    curator.hold.clear()
    cid = "0193b2c4-0000-7000-8000-00000000e001"
    try:
        await stack.agent.RunConversation(turn(namespace, cid, "my bank PIN is 9931"))
        await wait_for(curator.asked, timeout=60)  # the job is inside its model call
        erased = await stack.agent.EraseConversation(
            agent_pb.EraseConversationRequest(namespace=namespace, conversation_id=cid),
            timeout=30,
        )
        assert erased.complete
    finally:
        curator.hold.set()  # the model answers the PIN, from entry 1

    async def job_gone() -> bool:
        return (await backlog(stack, namespace)).depth == 0

    await wait_for(job_gone, timeout=60)
    assert await memories(stack, namespace) == {}
    assert (await backlog(stack, namespace)).failed_count == 0
    # The id made again is another conversation: only what it says is curated.
    Curator(model, residence)
    await stack.agent.RunConversation(turn(namespace, cid, "I live in Porto."))
    await reaches(stack, namespace, cid, 2)
    assert list(await memories(stack, namespace)) == ["The user lives in Porto."]


async def test_a_supersession_under_a_concurrent_manual_upsert_respects_its_revision(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    curator = Curator(model, residence, same_topic=len("The user lives in"))
    cid = "0193b2c4-0000-7000-8000-00000000e002"
    await stack.agent.RunConversation(turn(namespace, cid, "I live in Berlin."))
    await reaches(stack, namespace, cid, 2)
    berlin = (await memories(stack, namespace))["The user lives in Berlin."]
    assert berlin.revision == 1

    curator.hold.clear()
    calls = curator.calls
    try:
        await stack.agent.RunConversation(turn(namespace, cid, "I moved to Paris."))

        async def proposing() -> bool:
            return curator.calls > calls

        await wait_for(proposing, timeout=60)  # the proposer saw Berlin at revision 1
        # A person changes Berlin meanwhile (compare-and-swap at revision 1).
        changed = await stack.memory.UpsertMemory(
            memory_pb.UpsertMemoryRequest(
                namespace=namespace,
                memory_id=berlin.memory_id,
                content="The user lives in Berlin-Mitte.",
                sources=berlin.sources,
                metadata=dict(berlin.metadata),
                expected_revision=1,
            )
        )
        assert changed.memory.revision == 2
    finally:
        curator.hold.set()
    await reaches(stack, namespace, cid, 4)
    found = await memories(stack, namespace)
    assert sorted(found) == ["The user lives in Berlin-Mitte.", "The user lives in Paris."]
    paris = found["The user lives in Paris."]
    history = await stack.memory.ListMemoryRevisions(
        memory_pb.ListMemoryRevisionsRequest(namespace=namespace, memory_id=berlin.memory_id)
    )
    # The person's revision stands in the history; curation superseded it, not revision 1.
    assert [(r.revision, r.reason, r.content) for r in history.revisions] == [
        (1, "create", "The user lives in Berlin."),
        (2, "update", "The user lives in Berlin-Mitte."),
        (3, "superseded", "The user lives in Berlin-Mitte."),
    ]
    assert history.revisions[-1].superseded_by == paris.memory_id
    # The batch was refused once and proposed again: one more model call.
    assert curator.calls == calls + 2


async def test_a_flood_of_curation_requests_from_one_namespace_leaves_another_served(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    """Namespace A asks for the curation of 20 conversations at once (its cap is 8 waiting
    jobs): the requests beyond are refused with RetryInfo. Namespace B then runs AUTO
    turns: each is served, and B's job is curated while A's backlog still waits."""
    flood, other = namespace + "-a", namespace + "-b"
    Curator(model, residence)
    model.delay = 0.3  # A's jobs take a while: a backlog builds up
    cids = []
    for k in range(20):
        created = await stack.transcript.CreateConversation(
            transcript_pb.CreateConversationRequest(namespace=flood)
        )
        cid = created.conversation.conversation_id
        await stack.transcript.AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=flood, conversation_id=cid, messages=[user(f"I live in Town{k}.")]
            )
        )
        cids.append(cid)
    answers = await asyncio.gather(
        *(
            stack.memory.RequestCuration(
                memory_pb.RequestCurationRequest(namespace=flood, conversation_id=cid)
            )
            for cid in cids
        ),
        return_exceptions=True,
    )
    refused = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
    assert len(answers) - len(refused) <= 8 and refused
    for error in refused:
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason(error) in ("CURATION_QUEUE_FULL", "NAMESPACE_CONCURRENCY_LIMIT")
        assert status_detail(error, error_details_pb2.RetryInfo).retry_delay.ToNanoseconds() > 0
    assert (await backlog(stack, flood)).depth >= 3

    mine = "0193b2c4-0000-7000-8000-00000000e003"
    for text in ("Hello there.", "I live in Oslo."):
        await stack.agent.RunConversation(turn(other, mine, text))
    await reaches(stack, other, mine, 4)
    # B was curated before A's backlog drained: the queue took the namespaces in turn.
    assert (await backlog(stack, flood)).depth > 0
    assert list(await memories(stack, other)) == ["The user lives in Oslo."]
    model.delay = 0

    async def flood_drained() -> bool:
        return (await backlog(stack, flood)).depth == 0

    await wait_for(flood_drained, timeout=120)
