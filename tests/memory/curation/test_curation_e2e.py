"""Automatic curation through the whole system (issue 30): the all-in-one server with the
offline agent model and the offline proposer (what `make run` starts). A turn with
CURATION_MODE_AUTO (the all-in-one default) fills memory with its facts, each with its
exact source range; a changed fact supersedes the old one; a retracted entry's fact goes;
curated_through follows; a turn with curation off asks for nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client import AsyncClient, ConversationContextPolicy
from tests.support.grpc_calls import reason, user
from tests.support.stack import Stack, full_stack
from tests.support.waiting import wait_for

BERLIN, PARIS = "The user lives in Berlin.", "The user lives in Paris."


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with full_stack(
        shared_database_url,
        tmp_path_factory.mktemp("curation"),
        None,
        memory={"curation_poll_interval_s": 0.05},
        curation=True,  # the all-in-one server's default: AUTO
    ) as running:
        yield running


def turn(namespace: str, cid: str, text: str, **policy: Any) -> agent_pb.RunConversationRequest:
    return agent_pb.RunConversationRequest(
        namespace=namespace,
        conversation_id=cid,
        input=[user(text)],
        create_if_missing=True,
        policy=agent_pb.ContextPolicy(**policy),
    )


async def memories(stack: Stack, namespace: str) -> dict[str, memory_pb.Memory]:
    """Every memory of the namespace by content, whatever its validity."""
    listed = await stack.memory.ListMemories(
        memory_pb.ListMemoriesRequest(namespace=namespace, ignore_validity=True)
    )
    return {m.content: m for m in listed.memories}


async def conversation(stack: Stack, namespace: str, cid: str) -> transcript_pb.Conversation:
    got = await stack.transcript.GetConversation(
        transcript_pb.GetConversationRequest(namespace=namespace, conversation_id=cid)
    )
    return got.conversation


async def curated(stack: Stack, namespace: str, cid: str, through: int) -> None:
    """Wait until curation read the conversation through `through` (a turn asks for its
    curation in the background: its answer comes first)."""

    async def reached() -> bool:
        return (await conversation(stack, namespace, cid)).curated_through >= through

    await wait_for(reached, timeout=60)


async def drained(stack: Stack, namespace: str) -> None:
    async def empty() -> bool:
        backlog = await stack.memory.GetCurationBacklog(
            memory_pb.GetCurationBacklogRequest(namespace=namespace)
        )
        return backlog.depth == 0

    await wait_for(empty, timeout=60)


async def test_auto_turns_fill_memory_with_sources_and_supersede_a_changed_fact(
    stack: Stack, namespace: str
) -> None:
    cid = "0193b2c4-0000-7000-8000-0000000c0001"
    first = await stack.agent.RunConversation(turn(namespace, cid, "I live in Berlin."))
    assert (first.first_sequence, first.last_sequence) == (1, 2)

    await curated(stack, namespace, cid, 2)
    berlin = (await memories(stack, namespace))[BERLIN]
    assert [(s.conversation_id, s.from_sequence, s.through_sequence) for s in berlin.sources] == [
        (cid, 1, 1)
    ]
    assert dict(berlin.metadata) == {"runifold.origin": "curation"}

    await stack.agent.RunConversation(turn(namespace, cid, "I moved to Paris last month."))
    await curated(stack, namespace, cid, 4)
    found = await memories(stack, namespace)
    paris, berlin = found[PARIS], found[BERLIN]
    assert [(s.from_sequence, s.through_sequence) for s in paris.sources] == [(3, 3)]
    assert berlin.superseded_by == paris.memory_id and berlin.HasField("valid_until_time")
    assert not paris.HasField("valid_until_time")
    backlog = await stack.memory.GetCurationBacklog(
        memory_pb.GetCurationBacklogRequest(namespace=namespace)
    )
    assert backlog.facts_this_hour == 2 and backlog.model_calls_this_hour == 2

    # The same fact again is a duplicate: nothing new is stored.
    await stack.agent.RunConversation(turn(namespace, cid, "I live in Paris."))
    await curated(stack, namespace, cid, 6)
    assert sorted(await memories(stack, namespace)) == [BERLIN, PARIS]


async def test_a_turn_with_curation_off_asks_for_nothing(stack: Stack, namespace: str) -> None:
    cid = "0193b2c4-0000-7000-8000-0000000c0002"
    off = agent_pb.CURATION_MODE_OFF
    await stack.agent.RunConversation(turn(namespace, cid, "I live in Rome.", curation=off))
    backlog = await stack.memory.GetCurationBacklog(
        memory_pb.GetCurationBacklogRequest(namespace=namespace)
    )
    assert backlog.depth == 0
    assert await memories(stack, namespace) == {}
    assert (await conversation(stack, namespace, cid)).curated_through == 0
    # An operator asks for it: the entries after curated_through are curated.
    asked = await stack.memory.RequestCuration(
        memory_pb.RequestCurationRequest(namespace=namespace, conversation_id=cid)
    )
    assert asked.created and asked.job.incarnation > 0
    await drained(stack, namespace)
    assert list(await memories(stack, namespace)) == ["The user lives in Rome."]
    assert (await conversation(stack, namespace, cid)).curated_through == 2


async def test_a_retracted_entry_is_never_curated_and_its_curated_fact_goes(
    stack: Stack, namespace: str
) -> None:
    """Entry 1 is curated, then a write retracts it: the next job forgets the curated
    memory (the retraction is what the user took back). Entry 3 is retracted before any
    job reads it: it is never curated."""
    cid = "0193b2c4-0000-7000-8000-0000000c0003"
    await stack.agent.RunConversation(turn(namespace, cid, "My name is Alice."))
    await curated(stack, namespace, cid, 2)
    assert list(await memories(stack, namespace)) == ["The user's name is Alice."]
    added = await stack.transcript.AppendEntries(
        transcript_pb.AppendEntriesRequest(
            namespace=namespace, conversation_id=cid, messages=[user("I am allergic to peanuts.")]
        )
    )
    await stack.transcript.AppendEntries(
        transcript_pb.AppendEntriesRequest(
            namespace=namespace,
            conversation_id=cid,
            expected_version=added.version,
            retract_sequences=[1, 3],
        )
    )
    await stack.memory.RequestCuration(
        memory_pb.RequestCurationRequest(namespace=namespace, conversation_id=cid)
    )
    await drained(stack, namespace)
    assert await memories(stack, namespace) == {}
    assert (await conversation(stack, namespace, cid)).curated_through == 3


async def test_request_curation_of_a_conversation_elsewhere_is_not_found(
    stack: Stack, namespace: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stack.memory.RequestCuration(
            memory_pb.RequestCurationRequest(
                namespace=namespace, conversation_id="0193b2c4-0000-7000-8000-0000000c0009"
            )
        )
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert reason(missing.value) == "CONVERSATION_NOT_FOUND"


async def test_the_python_client_policy_asks_for_curation(stack: Stack, namespace: str) -> None:
    async with AsyncClient(stack.address, namespace=namespace) as client:
        conversation_id = "0193b2c4-0000-7000-8000-0000000c0004"
        policy = ConversationContextPolicy().with_curation("off")
        await client.run_conversation(
            "I work at Acme.", conversation_id=conversation_id, policy=policy
        )
        assert await memories(stack, namespace) == {}
        await client.run_conversation(
            "I like jazz.", conversation_id=conversation_id, policy=policy.with_curation("auto")
        )
        await curated(stack, namespace, conversation_id, 4)

        async def job_done() -> bool:
            # The cursor moves inside the job's last batch; the job ends right after.
            return (await client.curation_backlog()).depth == 0

        await wait_for(job_done, timeout=30)
        assert (await client.curation_backlog()).facts_this_hour == 2
        assert sorted(await memories(stack, namespace)) == [
            "The user likes jazz.",
            "The user works at Acme.",
        ]
