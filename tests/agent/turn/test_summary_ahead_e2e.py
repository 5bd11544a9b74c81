"""Summaries that stay ahead, through the real services (issue 29): a chat loop under
SUMMARY_MODE_REQUIRE whose summary queue keeps up is never refused, and every prompt is
one summary plus one window.

Every service runs in one real server (the summary workers and the offline summarizer on
PostgreSQL); the agent's model is the fake OpenAI server, which records each prompt.
Between turns the test waits until the namespace's summary queue is empty: that is "the
queue keeps up", made exact. Without the jobs ahead, the tenth turn finds entries 1..2
outside its window with no summary and is refused.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client.policy import user
from tests.support.fake_openai import FakeOpenAI, FakeReply, fake_openai
from tests.support.stack import Stack, full_stack
from tests.support.waiting import wait_for

TURNS = 30
WINDOW = 16


@pytest.fixture(scope="module")
async def model() -> AsyncIterator[FakeOpenAI]:
    async with fake_openai() as fake:
        yield fake


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory, model: FakeOpenAI
) -> AsyncIterator[Stack]:
    async with full_stack(shared_database_url, tmp_path_factory.mktemp("ahead"), model) as s:
        yield s


async def test_a_require_chat_loop_whose_queue_keeps_up_is_never_refused(
    stack: Stack, model: FakeOpenAI, namespace: str
) -> None:
    model.respond_with(lambda body: FakeReply(text=f"answer to {body['messages'][-1]['content']}"))
    before = len(model.chat_requests)
    created = await stack.transcript.CreateConversation(
        transcript_pb.CreateConversationRequest(namespace=namespace)
    )
    cid = created.conversation.conversation_id
    policy = agent_pb.ContextPolicy(
        window=WINDOW, summary_batch=64, summary_mode=agent_pb.SUMMARY_MODE_REQUIRE
    )

    async def queue_idle() -> bool:
        backlog = await stack.summary.GetBacklog(summary_pb.GetBacklogRequest(namespace=namespace))
        return backlog.depth == 0

    results = []
    for k in range(1, TURNS + 1):
        result = await stack.agent.RunConversation(
            agent_pb.RunConversationRequest(
                namespace=namespace,
                conversation_id=cid,
                input=[user(f"message {k}")],
                turn_id=str(uuid.uuid4()),
                policy=policy,
            )
        )
        results.append(result)
        await wait_for(queue_idle, timeout=30)

    page = await stack.transcript.ListEntries(
        transcript_pb.ListEntriesRequest(namespace=namespace, conversation_id=cid, page_size=100)
    )
    texts = [entry.message.text for entry in page.entries]
    assert len(texts) == 2 * TURNS
    prompts = model.chat_requests[before:]
    assert len(prompts) == TURNS, "one model call a turn, no refusal"
    for k, (result, prompt) in enumerate(zip(results, prompts, strict=True), start=1):
        context = result.context
        # The summary covers at least everything before the window: nothing waited.
        assert context.summary_through_sequence >= context.window_first_sequence - 1
        messages = [m["content"] for m in prompt.messages]
        summary_block = [m for m in messages if 'trust="untrusted"' in m]
        verbatim = [m for m in messages if 'trust="untrusted"' not in m]
        # The prompt: at most one summary block, the window's newest entries verbatim
        # (never cut for the summary ahead), the input.
        assert verbatim == [*texts[: 2 * (k - 1)][-WINDOW:], f"message {k}"], f"turn {k}"
        assert len(summary_block) <= 1
        if k > 9:  # a summary exists from then on, and is the one the turn reports
            through = f'through_sequence="{context.summary_through_sequence}"'
            assert summary_block and through in summary_block[0]
    # The summary ran ahead: it also covers the oldest entries of the last window.
    assert results[-1].context.summary_through_sequence >= results[-1].context.window_first_sequence
