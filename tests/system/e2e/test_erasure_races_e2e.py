"""Erasure races with the writes derived from a conversation, across services.

EraseConversation runs while a summarizer is inside its model call (a Summarize RPC,
or a background job), and while an UpsertMemory sits between its source check and
its write (held by a proxy between MemoryService and TranscriptService). Whatever
finishes last, nothing derived from the erased conversation survives, and a
conversation made again under the same id (of any length) never sees any of it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from tests.support.fake_openai import FakeOpenAI, FakeReply
from tests.support.grpc_calls import reason, user
from tests.support.held import holding_proxy
from tests.support.stack import Stack, full_stack
from tests.support.waiting import wait_for

GET_CONVERSATION = "/runifold.transcript.v1.TranscriptService/GetConversation"


class HeldSummarizer:
    """The fake model answers only once `release` is set."""

    def __init__(self, model: FakeOpenAI) -> None:
        self.model = model
        self.release = asyncio.Event()
        model.requests.clear()
        model.respond_with(self._respond)

    async def _respond(self, body: Any) -> FakeReply:
        await asyncio.wait_for(self.release.wait(), 30)
        return FakeReply(text="a summary of the old conversation", usage=(40, 8))

    async def asked(self) -> bool:
        return len(self.model.chat_requests) >= 1


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, model: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with full_stack(
        shared_database_url,
        tmp_path_factory.mktemp("fence"),
        model,
        summary_env={
            "RUNIFOLD_SUMMARY_MODEL_URL": model.base_url,
            "RUNIFOLD_SUMMARY_MODEL_MAX_RETRIES": "0",
        },
    ) as running:
        yield running


async def conversation(stack: Stack, namespace: str, entries: int, cid: str = "") -> str:
    created = await stack.transcript.CreateConversation(
        transcript_pb.CreateConversationRequest(namespace=namespace, conversation_id=cid)
    )
    cid = created.conversation.conversation_id
    await stack.transcript.AppendEntries(
        transcript_pb.AppendEntriesRequest(
            namespace=namespace,
            conversation_id=cid,
            messages=[user(f"message {i}") for i in range(entries)],
        )
    )
    return cid


async def erase(stack: Stack, namespace: str, cid: str) -> agent_pb.EraseConversationResponse:
    erased = await stack.agent.EraseConversation(
        agent_pb.EraseConversationRequest(namespace=namespace, conversation_id=cid), timeout=30
    )
    assert erased.complete, erased
    return erased


async def stored_rows(database_url: str, table: str, cid: str) -> int:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(
            f"SELECT count(*) FROM {table} WHERE conversation_id = %s".encode(),
            (uuid.UUID(cid),),
        )
        row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def assert_made_again_sees_nothing_old(stack: Stack, namespace: str, cid: str) -> None:
    """The id made again, longer than before: no old summary, job or memory."""
    again = await conversation(stack, namespace, 120, cid)
    assert again == cid
    got = await stack.summary.GetSummary(
        summary_pb.GetSummaryRequest(namespace=namespace, conversation_id=cid)
    )
    assert not got.HasField("summary")
    backlog = await stack.summary.GetBacklog(summary_pb.GetBacklogRequest(namespace=namespace))
    assert backlog.depth == 0
    listed = await stack.memory.ListMemories(
        memory_pb.ListMemoriesRequest(namespace=namespace, conversation_id=cid)
    )
    assert list(listed.memories) == []


async def test_a_summarize_in_its_model_call_cannot_commit_after_the_erasure(
    stack: Stack, model: FakeOpenAI, namespace: str, shared_database_url: str
) -> None:
    held = HeldSummarizer(model)
    cid = await conversation(stack, namespace, 40)
    summarizing = asyncio.ensure_future(
        stack.summary.Summarize(
            summary_pb.SummarizeRequest(
                namespace=namespace, conversation_id=cid, window=4, summary_batch=8
            ),
            timeout=30,
        )
    )
    await wait_for(held.asked)
    await erase(stack, namespace, cid)
    held.release.set()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await summarizing
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert reason(refused.value) == "CONVERSATION_ERASED"
    for table in ("summary.summaries", "summary.summary_history"):
        assert await stored_rows(shared_database_url, table, cid) == 0, table
    await assert_made_again_sees_nothing_old(stack, namespace, cid)


async def test_a_background_job_in_its_model_call_cannot_commit_after_the_erasure(
    stack: Stack, model: FakeOpenAI, namespace: str, shared_database_url: str
) -> None:
    held = HeldSummarizer(model)
    cid = await conversation(stack, namespace, 40)
    await stack.summary.RequestSummary(
        summary_pb.RequestSummaryRequest(
            namespace=namespace, conversation_id=cid, window=4, summary_batch=8
        )
    )
    await wait_for(held.asked)  # the worker claimed the job and called the model
    await erase(stack, namespace, cid)
    held.release.set()

    async def job_gone() -> bool:
        backlog = await stack.summary.GetBacklog(summary_pb.GetBacklogRequest(namespace=namespace))
        return backlog.depth == 0 and backlog.running_count == 0

    await wait_for(job_gone, timeout=30)
    for table in ("summary.summaries", "summary.summary_history", "summary.jobs"):
        assert await stored_rows(shared_database_url, table, cid) == 0, table
    await assert_made_again_sees_nothing_old(stack, namespace, cid)


async def test_an_upsert_between_its_source_check_and_its_write_cannot_outlive_the_erasure(
    shared_database_url: str, namespace: str, tmp_path: Path
) -> None:
    # Every call to TranscriptService goes through the proxy (the services reach each
    # other over gRPC even in one process), so one reply can be held.
    async with (
        holding_proxy() as proxy,
        full_stack(
            shared_database_url,
            tmp_path,
            None,
            settings={"TRANSCRIPT_SERVICE_ADDR": proxy.address},
        ) as stack,
    ):
        proxy.connect(stack.address)
        cid = await conversation(stack, namespace, 6)
        held, release = proxy.hold_reply(GET_CONVERSATION)
        upserting = asyncio.ensure_future(
            stack.memory.UpsertMemory(
                memory_pb.UpsertMemoryRequest(
                    namespace=namespace,
                    content="The user keeps the keys under the mat.",
                    sources=[
                        memory_pb.MemorySource(
                            conversation_id=cid, from_sequence=1, through_sequence=2
                        )
                    ],
                ),
                timeout=60,
            )
        )
        await asyncio.wait_for(held.wait(), 30)  # the source check passed, not answered
        await erase(stack, namespace, cid)
        release.set()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await upserting
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert reason(refused.value) == "SOURCE_NOT_FOUND"
        async with await psycopg.AsyncConnection.connect(shared_database_url) as conn:
            cursor = await conn.execute(
                "SELECT count(*) FROM memory.memories WHERE namespace = %s", (namespace,)
            )
            assert await cursor.fetchone() == (0,)
        await assert_made_again_sees_nothing_old(stack, namespace, cid)
