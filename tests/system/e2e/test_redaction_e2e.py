"""No message, summary or memory content in logs or error messages, over a full turn.

Every logger is captured at DEBUG (libraries included) through the project's JSON
formatter while a turn with a summary and a memory runs end to end, and while
requests carrying content fail; then the content is looked for in every line.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
import pytest

from runifold.agent.v1 import agent_service_pb2 as pb
from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from tests.support.fake_openai import FakeOpenAI, FakeReply, fake_openai
from tests.support.http_calls import post_json
from tests.support.stack import HTTP_ON, Stack, full_stack
from tests.support.waiting import wait_for

SECRETS = {
    "user": "my passport number is X99-SECRET-1",
    "system": "internal policy SECRET-SYSTEM-2",
    "summary": "the summary mentions SECRET-SUMMARY-3",
    "memory": "the user's bank is SECRET-MEMORY-4",
    "answer": "the model answers SECRET-ANSWER-5",
    "bad": "rejected text SECRET-BAD-6",
}


@pytest.fixture
async def stack(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Stack, FakeOpenAI]]:
    async with (
        fake_openai() as model,
        full_stack(
            shared_database_url, tmp_path_factory.mktemp("redaction"), model, http=HTTP_ON
        ) as running,
    ):
        model.respond_with(lambda body: FakeReply(text=SECRETS["answer"]))
        yield running, model


async def test_a_full_turn_leaves_no_content_in_logs_or_errors(
    stack: tuple[Stack, FakeOpenAI], captured: io.StringIO, namespace: str
) -> None:
    running, model = stack
    created = await running.transcript.CreateConversation(
        transcript_pb.CreateConversationRequest(namespace=namespace)
    )
    cid = created.conversation.conversation_id
    await running.transcript.AppendEntries(
        transcript_pb.AppendEntriesRequest(
            namespace=namespace,
            conversation_id=cid,
            messages=[
                common_pb2.Message(role=common_pb2.ROLE_USER, text=f"{SECRETS['user']} {i}")
                for i in range(20)
            ],
        )
    )
    await running.summary.CommitSummary(
        summary_pb.CommitSummaryRequest(
            namespace=namespace, conversation_id=cid, through_sequence=4, text=SECRETS["summary"]
        )
    )
    memory = await running.memory.UpsertMemory(
        memory_pb.UpsertMemoryRequest(
            namespace=namespace,
            content=SECRETS["memory"],
            sources=[
                memory_pb.MemorySource(conversation_id=cid, from_sequence=1, through_sequence=2)
            ],
        )
    )

    async def indexed() -> bool:
        found = await running.memory.SearchMemories(
            memory_pb.SearchMemoriesRequest(namespace=namespace, query="which bank", limit=2)
        )
        return any(r.memory.memory_id == memory.memory.memory_id for r in found.results)

    await wait_for(indexed, timeout=30)

    result = await running.agent.RunConversation(
        pb.RunConversationRequest(
            namespace=namespace,
            conversation_id=cid,
            system_instructions=SECRETS["system"],
            input=[common_pb2.Message(role=common_pb2.ROLE_USER, text=SECRETS["user"])],
            policy=pb.ContextPolicy(
                window=16,
                summary_batch=64,
                memory_limit=2,
                summary_mode=pb.SUMMARY_MODE_AUTO,
                max_summary_passes=2,
            ),
        )
    )
    assert result.outcome.output[0].text == SECRETS["answer"]
    contents = [m.get("content") or "" for m in model.chat_requests[-1].messages]
    assert any(SECRETS["memory"] in c and SECRETS["summary"] in c for c in contents)

    # Failures that carry content: the content is in neither the error nor the log.
    failures: list[Awaitable[object]] = [
        running.transcript.AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=cid,
                messages=[common_pb2.Message(role=common_pb2.ROLE_SYSTEM, text=SECRETS["bad"])],
            )
        ),
        running.transcript.AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=cid,
                expected_version=0,
                messages=[common_pb2.Message(role=common_pb2.ROLE_USER, text=SECRETS["bad"])],
            )
        ),
        running.memory.UpsertMemory(
            memory_pb.UpsertMemoryRequest(
                namespace=namespace,
                content=SECRETS["bad"],
                sources=[
                    memory_pb.MemorySource(
                        conversation_id=cid, from_sequence=5, through_sequence=999
                    )
                ],
            )
        ),
        running.agent.RunConversation(
            pb.RunConversationRequest(
                namespace=namespace,
                conversation_id=cid,
                input=[common_pb2.Message(role=common_pb2.ROLE_USER, text=SECRETS["bad"] + "\x00")],
            )
        ),
    ]
    for failure in failures:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await failure
        error = caught.value
        assert "SECRET" not in (error.details() or "")
        assert not any("SECRET" in repr(value) for _, value in error.trailing_metadata() or ())

    lines = captured.getvalue()
    assert lines.count('"message": "rpc"') >= 8, "the access log was captured"
    leaked = [name for name, text in SECRETS.items() if text.split()[-1] in lines]
    assert not leaked and "SECRET" not in lines, f"content leaked into logs: {leaked}"


async def test_calls_over_the_http_port_leave_no_content_in_logs_or_errors(
    stack: tuple[Stack, FakeOpenAI], captured: io.StringIO, namespace: str
) -> None:
    """The same over Connect JSON: a turn, and failing requests that carry content
    (rejected, conflicting, undecodable), answered and logged without it."""
    running, _ = stack
    base, transcript = running.http_url, "runifold.transcript.v1.TranscriptService"
    created = await post_json(base, f"{transcript}/CreateConversation", {"namespace": namespace})
    cid = created.body["conversation"]["conversationId"]
    turn = await post_json(
        base,
        "runifold.agent.v1.AgentService/RunConversation",
        {
            "namespace": namespace,
            "conversationId": cid,
            "systemInstructions": SECRETS["system"],
            "input": [{"role": "ROLE_USER", "text": SECRETS["user"]}],
        },
    )
    assert turn.status == 200, turn.body
    failures: list[dict[str, Any]] = [
        {"messages": [{"role": "ROLE_SYSTEM", "text": SECRETS["bad"]}]},
        {"expectedVersion": "0", "messages": [{"role": "ROLE_USER", "text": SECRETS["bad"]}]},
        # Undecodable: the parser's words would quote the value.
        {"expectedVersion": SECRETS["bad"], "messages": [{"text": SECRETS["bad"]}]},
        {"messages": [{"role": "ROLE_USER", "text": SECRETS["bad"] + "\x00"}]},
    ]
    for failure in failures:
        reply = await post_json(
            base,
            f"{transcript}/AppendEntries",
            {"namespace": namespace, "conversationId": cid, **failure},
        )
        assert reply.status >= 400, reply.body
        assert "SECRET" not in json.dumps(reply.body), reply.body
        assert not any("SECRET" in value for value in reply.headers.values())

    lines = captured.getvalue()
    assert lines.count('"message": "rpc"') >= 6, "the access log was captured"
    assert "SECRET" not in lines, "content leaked into logs"
