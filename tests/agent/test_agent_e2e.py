"""AgentService end to end: every service for real, the model behind a fake OpenAI server."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from runifold.agent.v1 import agent_service_pb2 as pb
from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common.status import error_info
from tests.support.fake_openai import FakeOpenAI, FakeReply, FakeToolCall
from tests.support.grpc_calls import reason, user
from tests.support.stack import Stack, full_stack
from tests.support.waiting import wait_for

ROLE_USER = common_pb2.ROLE_USER


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, model: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with full_stack(shared_database_url, tmp_path_factory.mktemp("agent"), model) as running:
        yield running


@pytest.fixture(autouse=True)
def reset_model(model: FakeOpenAI) -> None:
    model.recover()
    model.delay = 0
    model.respond_with(lambda body: FakeReply(text="Noted.", usage=(20, 2)))
    model.requests.clear()


async def conversation(stack: Stack, namespace: str, entries: int = 0) -> str:
    created = await stack.transcript.CreateConversation(
        transcript_pb.CreateConversationRequest(namespace=namespace)
    )
    cid = created.conversation.conversation_id
    if entries:
        await stack.transcript.AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=cid,
                expected_version=0,
                messages=[user(f"earlier message {i + 1}") for i in range(entries)],
            )
        )
    return cid


def turn(namespace: str, cid: str, text: str, **fields: Any) -> pb.RunConversationRequest:
    return pb.RunConversationRequest(
        namespace=namespace, conversation_id=cid, input=[user(text)], **fields
    )


async def transcript_texts(stack: Stack, namespace: str, cid: str) -> list[tuple[int, str]]:
    page = await stack.transcript.ListEntries(
        transcript_pb.ListEntriesRequest(namespace=namespace, conversation_id=cid, page_size=1000)
    )
    return [(e.message.role, e.message.text) for e in page.entries]


async def version(stack: Stack, namespace: str, cid: str) -> int:
    got = await stack.transcript.GetConversation(
        transcript_pb.GetConversationRequest(namespace=namespace, conversation_id=cid)
    )
    return got.conversation.version


async def test_memories_and_summary_reach_the_model_as_untrusted_data(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    cid = await conversation(stack, namespace, entries=40)
    await stack.summary.CommitSummary(
        summary_pb.CommitSummaryRequest(
            namespace=namespace,
            conversation_id=cid,
            through_sequence=24,
            text="We agreed to store transcripts in PostgreSQL.",
        )
    )
    fact = "The user's favourite colour is teal."
    await stack.memory.UpsertMemory(
        memory_pb.UpsertMemoryRequest(
            namespace=namespace,
            content=fact,
            sources=[
                memory_pb.MemorySource(conversation_id=cid, from_sequence=1, through_sequence=2)
            ],
        )
    )

    async def indexed() -> bool:
        found = await stack.memory.SearchMemories(
            memory_pb.SearchMemoriesRequest(namespace=namespace, query="favourite colour", limit=3)
        )
        return any(r.memory.content == fact for r in found.results) and not found.degraded

    await wait_for(indexed, timeout=30)

    result = await stack.agent.RunConversation(
        turn(
            namespace,
            cid,
            "Which colour do I like?",
            system_instructions="Be brief.",
            policy=pb.ContextPolicy(window=16, summary_batch=64, memory_limit=4),
        )
    )
    messages = model.chat_requests[-1].messages
    systems = [m for m in messages if m["role"] == "system"]
    assert [m["content"] for m in systems] == ["Be brief."]
    untrusted = [m for m in messages if 'trust="untrusted"' in (m.get("content") or "")]
    assert len(untrusted) == 1 and untrusted[0]["role"] == "user"
    assert fact.replace("'", "&#x27;") in untrusted[0]["content"] or fact in untrusted[0]["content"]
    assert "We agreed to store transcripts in PostgreSQL." in untrusted[0]["content"]
    assert messages[-1] == {"role": "user", "content": "Which colour do I like?"}
    assert len(result.context.memory_ids) == 1
    assert result.context.summary_through_sequence == 24

    stored = await transcript_texts(stack, namespace, cid)
    assert stored[-2:] == [
        (ROLE_USER, "Which colour do I like?"),
        (common_pb2.ROLE_ASSISTANT, "Noted."),
    ]
    assert all(role != common_pb2.ROLE_SYSTEM for role, _ in stored)
    assert not any(
        "Be brief." in text or "teal" in text or "PostgreSQL" in text for _, text in stored
    )


async def test_two_turns_at_one_version_one_commits_the_other_keeps_its_outcome(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    cid = await conversation(stack, namespace, entries=2)
    both_asked = asyncio.Event()

    async def once_both_turns_wait(body: Any) -> FakeReply:
        # Hold each answer until both turns are waiting on the model: both read
        # version 1 before either commits, so they really overlap.
        if len(model.chat_requests) >= 2:
            both_asked.set()
        await asyncio.wait_for(both_asked.wait(), 30)  # bounded: a lone turn fails, not hangs
        return FakeReply(text=f"answer to {body['messages'][-1]['content']}", usage=(30, 4))

    model.respond_with(once_both_turns_wait)
    calls = [stack.agent.RunConversation(turn(namespace, cid, text)) for text in ("one", "two")]
    results = await asyncio.gather(*calls, return_exceptions=True)
    wins = [r for r in results if isinstance(r, pb.RunConversationResponse)]
    losses = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(wins) == 1 and len(losses) == 1
    loss = losses[0]
    assert loss.code() == grpc.StatusCode.ABORTED and reason(loss) == "TURN_CONFLICT"
    detail = _turn_conflict(loss)
    assert detail.expected_version == 1 and detail.current_version == 2
    assert detail.outcome.output[0].text.startswith("answer to ")
    # Each turn kept its own answer: the loser's outcome is not the winner's.
    answers = {wins[0].outcome.output[0].text, detail.outcome.output[0].text}
    assert answers == {"answer to one", "answer to two"}
    assert detail.outcome.usage.output_tokens == 4 and detail.outcome.usage.model_calls == 1
    assert len(model.chat_requests) == 2, "the model is never re-run"
    assert await version(stack, namespace, cid) == 2


def _turn_conflict(error: grpc.aio.AioRpcError) -> pb.TurnConflict:
    from grpc_status import rpc_status

    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(pb.TurnConflict.DESCRIPTOR):
            value = pb.TurnConflict()
            detail.Unpack(value)
            return value
    raise AssertionError("no TurnConflict detail")


async def test_a_retried_turn_id_returns_the_first_outcome_without_a_model_call(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    cid = await conversation(stack, namespace)
    request = turn(namespace, cid, "remember this turn", turn_id=str(uuid.uuid4()))
    first = await stack.agent.RunConversation(request)
    assert len(model.chat_requests) == 1
    again = await stack.agent.RunConversation(request)
    assert len(model.chat_requests) == 1
    assert again.replayed and not first.replayed
    assert again.outcome == first.outcome
    assert (again.conversation_version, again.first_sequence, again.last_sequence) == (1, 1, 2)


async def test_deadline_during_the_model_call_appends_nothing(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    cid = await conversation(stack, namespace)
    model.delay = 3
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stack.agent.RunConversation(turn(namespace, cid, "slow"), timeout=1)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

    async def model_call_over() -> bool:
        return all(r.finished is not None for r in model.chat_requests)

    await wait_for(model_call_over, timeout=10)
    assert await version(stack, namespace, cid) == 0


async def test_budget_exhausted_during_summarization_appends_nothing(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    cid = await conversation(stack, namespace, entries=40)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stack.agent.RunConversation(
            turn(
                namespace,
                cid,
                "hi",
                policy=pb.ContextPolicy(
                    window=16,
                    summary_batch=8,
                    summary_mode=pb.SUMMARY_MODE_AUTO,
                    max_summary_passes=3,
                ),
                budget=common_pb2.Budget(max_model_calls=2),
            )
        )
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reason(caught.value) == "BUDGET_EXHAUSTED"
    assert model.chat_requests == []
    assert await version(stack, namespace, cid) == 1


async def test_model_server_down_is_unavailable_and_appends_nothing(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    cid = await conversation(stack, namespace)
    model.fail(503)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stack.agent.RunConversation(turn(namespace, cid, "hello?"))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert reason(caught.value) == "MODEL_UNAVAILABLE"
    assert await version(stack, namespace, cid) == 0


async def test_summary_required_enqueues_a_job_the_workers_complete(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    cid = await conversation(stack, namespace, entries=40)
    request = turn(
        namespace,
        cid,
        "what now?",
        turn_id=str(uuid.uuid4()),
        policy=pb.ContextPolicy(window=16, summary_batch=8),
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stack.agent.RunConversation(request)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason(caught.value) == "SUMMARY_REQUIRED"
    assert error_info(caught.value).metadata["backlog"] == "24"  # type: ignore[union-attr]
    assert model.chat_requests == []

    async def summarized() -> bool:
        got = await stack.summary.GetSummary(
            summary_pb.GetSummaryRequest(namespace=namespace, conversation_id=cid)
        )
        return got.summary.through_sequence == 24

    await wait_for(summarized, timeout=30)
    result = await stack.agent.RunConversation(request)
    assert result.context.summary_through_sequence == 24
    assert (result.first_sequence, result.last_sequence) == (41, 42)


async def test_tool_calls_round_trip_over_two_turns(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    def respond(body: dict[str, Any]) -> FakeReply:
        last = body["messages"][-1]
        if last["role"] == "tool":
            return FakeReply(text=f"It is {last['content']} in Oslo.")
        return FakeReply(tool_calls=[FakeToolCall("weather", json.dumps({"city": "Oslo"}))])

    model.respond_with(respond)
    cid = await conversation(stack, namespace)
    tools = [
        common_pb2.ToolDefinition(
            name="weather",
            description="current weather",
            parameters_json_schema='{"type": "object"}',
        )
    ]
    first = await stack.agent.RunConversation(turn(namespace, cid, "Weather in Oslo?", tools=tools))
    assert [c.name for c in first.tool_calls] == ["weather"]
    assert model.chat_requests[0].body["tools"][0]["function"]["name"] == "weather"
    call = first.tool_calls[0]
    second = await stack.agent.RunConversation(
        pb.RunConversationRequest(
            namespace=namespace,
            conversation_id=cid,
            tools=tools,
            input=[
                common_pb2.Message(
                    role=common_pb2.ROLE_TOOL, text="3 degrees", tool_call_id=call.id
                )
            ],
        )
    )
    assert second.outcome.output[0].text == "It is 3 degrees in Oslo."
    sent = model.chat_requests[1].messages
    assert sent[-2]["role"] == "assistant" and sent[-2]["tool_calls"][0]["id"] == call.id
    assert sent[-1] == {"role": "tool", "content": "3 degrees", "tool_call_id": call.id}
    roles = [role for role, _ in await transcript_texts(stack, namespace, cid)]
    assert roles == [
        ROLE_USER,
        common_pb2.ROLE_ASSISTANT,
        common_pb2.ROLE_TOOL,
        common_pb2.ROLE_ASSISTANT,
    ]


async def test_stream_reports_progress_text_and_the_committed_result(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    model.respond_with(lambda body: FakeReply(text="streamed words arrive one by one"))
    cid = await conversation(stack, namespace)
    events = [
        event
        async for event in stack.agent.StreamConversation(
            pb.StreamConversationRequest(
                namespace=namespace, conversation_id=cid, input=[user("stream please")]
            )
        )
    ]
    kinds = [event.WhichOneof("event") for event in events]
    assert kinds[0] == "progress" and kinds[-1] == "result"
    text = "".join(e.text_delta.text for e in events if e.HasField("text_delta"))
    assert text == "streamed words arrive one by one"
    assert events[-1].result.outcome.output[0].text == text
    stages = [e.progress.stage for e in events if e.HasField("progress")]
    assert stages == [
        pb.TURN_STAGE_LOADING_CONTEXT,
        pb.TURN_STAGE_CALLING_MODEL,
        pb.TURN_STAGE_COMMITTING,
    ]
    assert model.chat_requests[-1].body["stream"] is True


async def test_input_mistakes_are_refused_before_the_model(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    cid = await conversation(stack, namespace)
    bad = [
        pb.RunConversationRequest(
            namespace=namespace,
            conversation_id=cid,
            input=[common_pb2.Message(role=common_pb2.ROLE_SYSTEM, text="obey")],
        ),
        turn(namespace, cid, "x", policy=pb.ContextPolicy(window=5000)),
        turn(namespace, cid, "x", policy=pb.ContextPolicy(memory_limit=257)),
        turn(namespace + "-other", cid, "x"),
    ]
    codes = []
    for request in bad:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stack.agent.RunConversation(request)
        codes.append((caught.value.code(), reason(caught.value)))
    assert codes == [
        (grpc.StatusCode.INVALID_ARGUMENT, "SYSTEM_ROLE_NOT_ALLOWED"),
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_WINDOW"),
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MEMORY_LIMIT"),
        (grpc.StatusCode.NOT_FOUND, "CONVERSATION_NOT_FOUND"),
    ]
    assert model.chat_requests == []
