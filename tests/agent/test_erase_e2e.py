"""EraseConversation across real services: everything derived goes, and a retry finishes
what an unavailable service left, completing the same receipt (never a second one).

Two real servers: one hosts TranscriptService, SummaryService and AgentService;
MemoryService runs in a second one that the test stops and starts again (on the
same port) to make it unavailable for a while.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from runifold.agent.v1 import agent_service_pb2 as pb
from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.agent.component import AgentComponent
from services.agent.config import AgentConfig
from services.common import stubs
from services.common.postgres.pool import Database
from services.common.server import Component, RunningServer, serving
from services.common.status import error_info
from services.memory.component import MemoryComponent
from services.summary.component import SummaryComponent
from services.summary.config import SummaryConfig
from services.transcript.component import TranscriptComponent
from tests.memory.support import memory_config
from tests.support.settings import server_settings
from tests.support.stack import full_stack
from tests.support.waiting import wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def memory_server(
    database_url: str, port: int, transcript_address: str, index_dir: Path
) -> AsyncIterator[RunningServer]:
    settings = server_settings(
        RUNIFOLD_LISTEN=f"127.0.0.1:{port}", TRANSCRIPT_SERVICE_ADDR=transcript_address
    )
    async with serving(
        [MemoryComponent(memory_config(index_dir))], settings, database_url=database_url
    ) as running:
        yield running


async def test_erase_removes_everything_and_resumes_after_an_outage(
    shared_database_url: str, database: Database, namespace: str, tmp_path: Path
) -> None:
    memory_port = free_port()
    main_settings = server_settings(MEMORY_SERVICE_ADDR=f"127.0.0.1:{memory_port}")
    components: list[Component] = [
        TranscriptComponent(),
        SummaryComponent(SummaryConfig.from_env({"RUNIFOLD_SUMMARY_WORKERS": "0"})),
        AgentComponent(AgentConfig()),
    ]
    async with (
        serving(
            components, main_settings, database_url=shared_database_url, extras={"all_in_one": True}
        ) as main,
        grpc.aio.insecure_channel(main.address) as channel,
        grpc.aio.insecure_channel(f"127.0.0.1:{memory_port}") as memory_channel,
    ):
        transcript, summary = stubs.transcript(channel), stubs.summary(channel)
        agent, memory = stubs.agent(channel), stubs.memory(memory_channel)
        created = await transcript.CreateConversation(
            transcript_pb.CreateConversationRequest(namespace=namespace)
        )
        cid = created.conversation.conversation_id
        other = (
            await transcript.CreateConversation(
                transcript_pb.CreateConversationRequest(namespace=namespace)
            )
        ).conversation
        for target in (cid, other.conversation_id):
            await transcript.AppendEntries(
                transcript_pb.AppendEntriesRequest(
                    namespace=namespace,
                    conversation_id=target,
                    messages=[
                        common_pb2.Message(role=common_pb2.ROLE_USER, text=f"m{i}")
                        for i in range(30)
                    ],
                )
            )
        await summary.CommitSummary(
            summary_pb.CommitSummaryRequest(
                namespace=namespace, conversation_id=cid, text="a summary", through_sequence=10
            )
        )
        await summary.CommitSummary(
            summary_pb.CommitSummaryRequest(
                namespace=namespace,
                conversation_id=cid,
                text="a newer summary",
                through_sequence=12,
            )
        )
        await summary.RequestSummary(
            summary_pb.RequestSummaryRequest(
                namespace=namespace, conversation_id=cid, window=4, summary_batch=4
            )
        )

        index = tmp_path / "index"
        async with memory_server(shared_database_url, memory_port, main.address, index):
            mine = await memory.UpsertMemory(
                memory_pb.UpsertMemoryRequest(
                    namespace=namespace,
                    content="derived from the erased conversation",
                    sources=[
                        memory_pb.MemorySource(
                            conversation_id=cid, from_sequence=1, through_sequence=3
                        )
                    ],
                )
            )
            kept = await memory.UpsertMemory(
                memory_pb.UpsertMemoryRequest(
                    namespace=namespace,
                    content="derived from another conversation",
                    sources=[
                        memory_pb.MemorySource(
                            conversation_id=other.conversation_id,
                            from_sequence=1,
                            through_sequence=3,
                        )
                    ],
                )
            )

        # MemoryService is down: the summaries are erased (and fenced), memory is reported
        # as remaining, and the transcript waits for it (the id cannot be made again while
        # memories of this incarnation exist).
        first = await agent.EraseConversation(
            pb.EraseConversationRequest(namespace=namespace, conversation_id=cid), timeout=30
        )
        assert not first.complete and list(first.remaining) == ["memory", "transcript"]
        assert first.entries_deleted == 0 and first.summaries_erased
        # Its receipt is recorded meanwhile: what this call erased, and every part left.
        partial = first.receipt
        assert (partial.summaries, partial.summary_jobs, partial.memories) == (2, 1, 0)
        assert list(partial.remaining) == ["memory", "memory_index", "transcript"]
        assert not partial.HasField("complete_time")
        still_there = await transcript.GetConversation(
            transcript_pb.GetConversationRequest(namespace=namespace, conversation_id=cid)
        )
        assert still_there.conversation.last_sequence == 30
        backlog = await summary.GetBacklog(summary_pb.GetBacklogRequest(namespace=namespace))
        assert backlog.depth == 0
        async with database.connection() as conn:
            for table in ("summaries", "summary_history", "jobs"):
                cursor = await conn.execute(
                    f"SELECT count(*) FROM summary.{table} WHERE conversation_id = %s".encode(),
                    (uuid.UUID(cid),),
                )
                assert await cursor.fetchone() == (0,), table

        async with memory_server(shared_database_url, memory_port, main.address, index):
            # The agent's channel to MemoryService reconnects in the background: retry
            # the erase until it completes, as a client would.
            retries: list[pb.EraseConversationResponse] = []

            async def erased() -> bool:
                retries.append(
                    await agent.EraseConversation(
                        pb.EraseConversationRequest(namespace=namespace, conversation_id=cid),
                        timeout=30,
                    )
                )
                return retries[-1].complete

            await wait_for(erased, timeout=30, interval=0.2)
            assert list(retries[-1].remaining) == []
            # One receipt: the retries completed the first call's, whose summary counts it
            # kept (the retries erased no summary).
            assert {r.receipt.receipt_id for r in retries if r.HasField("receipt")} == {
                partial.receipt_id
            }
            done = retries[-1].receipt
            assert (done.entries, done.appends, done.summaries, done.summary_jobs) == (30, 1, 2, 1)
            assert (done.memories, done.memory_revisions, done.index_points) == (1, 1, 1)
            async with database.connection() as conn:
                cursor = await conn.execute(
                    "SELECT count(*) FROM transcript.erasure_receipts WHERE conversation_id = %s",
                    (uuid.UUID(cid),),
                )
                assert await cursor.fetchone() == (1,)
            assert sum(r.memories_deleted for r in retries) == 1
            assert [r.entries_deleted for r in retries if r.entries_deleted] == [30]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await transcript.GetConversation(
                    transcript_pb.GetConversationRequest(namespace=namespace, conversation_id=cid)
                )
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await memory.GetMemory(
                    memory_pb.GetMemoryRequest(namespace=namespace, memory_id=mine.memory.memory_id)
                )
            assert error_info(caught.value).reason == "MEMORY_NOT_FOUND"  # type: ignore[union-attr]
            still = await memory.GetMemory(
                memory_pb.GetMemoryRequest(namespace=namespace, memory_id=kept.memory.memory_id)
            )
            assert still.memory.content == "derived from another conversation"

            async def never_found() -> bool:
                found = await memory.SearchMemories(
                    memory_pb.SearchMemoriesRequest(
                        namespace=namespace, query="derived from the erased conversation", limit=5
                    )
                )
                return not found.degraded and all(
                    r.memory.memory_id != mine.memory.memory_id for r in found.results
                )

            await wait_for(never_found, timeout=30)

            # Idempotent: erasing again is complete and finds nothing more.
            third = await agent.EraseConversation(
                pb.EraseConversationRequest(namespace=namespace, conversation_id=cid)
            )
            assert third.complete and (third.entries_deleted, third.memories_deleted) == (0, 0)
        untouched = await transcript.GetConversation(
            transcript_pb.GetConversationRequest(
                namespace=namespace, conversation_id=other.conversation_id
            )
        )
        assert untouched.conversation.last_sequence == 30


async def test_erasing_a_source_erases_what_was_derived_from_its_forks(
    shared_database_url: str, namespace: str, tmp_path: Path
) -> None:
    """A fork goes with its source's transcript, and so must the summary and memories made
    from the fork's own entries: erased for the fork's incarnation before the transcript
    (the only place the fork can be found), and counted in the source's receipt."""
    async with full_stack(
        shared_database_url,
        tmp_path,
        None,
        summary_env={"RUNIFOLD_SUMMARY_WORKERS": "0"},
    ) as stack:
        transcript, summary, memory = stack.transcript, stack.summary, stack.memory
        source = (
            await transcript.CreateConversation(
                transcript_pb.CreateConversationRequest(namespace=namespace)
            )
        ).conversation.conversation_id
        await transcript.AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=source,
                messages=[
                    common_pb2.Message(role=common_pb2.ROLE_USER, text=f"shared {i}")
                    for i in range(2)
                ],
            )
        )
        fork = (
            await transcript.ForkConversation(
                transcript_pb.ForkConversationRequest(
                    namespace=namespace, conversation_id=source, through_sequence=2
                )
            )
        ).conversation
        grandchild = (
            await transcript.ForkConversation(
                transcript_pb.ForkConversationRequest(
                    namespace=namespace, conversation_id=fork.conversation_id, through_sequence=2
                )
            )
        ).conversation
        listed = await transcript.ListForks(
            transcript_pb.ListForksRequest(namespace=namespace, conversation_id=source)
        )
        assert [
            (f.conversation_id, f.incarnation, f.source_conversation_id) for f in listed.forks
        ] == [
            (fork.conversation_id, fork.incarnation, source),
            (grandchild.conversation_id, grandchild.incarnation, fork.conversation_id),
        ]
        derived: list[str] = []
        for target in (fork.conversation_id, grandchild.conversation_id):
            await transcript.AppendEntries(
                transcript_pb.AppendEntriesRequest(
                    namespace=namespace,
                    conversation_id=target,
                    messages=[
                        common_pb2.Message(role=common_pb2.ROLE_USER, text=f"own {i}")
                        for i in range(2)
                    ],
                )
            )
            await summary.CommitSummary(
                summary_pb.CommitSummaryRequest(
                    namespace=namespace,
                    conversation_id=target,
                    text="a summary of the fork",
                    through_sequence=4,
                )
            )
            made = await memory.UpsertMemory(
                memory_pb.UpsertMemoryRequest(
                    namespace=namespace,
                    content=f"the fork {target} said its own thing",
                    sources=[
                        memory_pb.MemorySource(
                            conversation_id=target, from_sequence=3, through_sequence=4
                        )
                    ],
                )
            )
            derived.append(made.memory.memory_id)

        # A deletion naming the forks an erasure erased refuses one it did not name (a
        # fork made after its listing), in its transaction: nothing is deleted.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await transcript.DeleteConversation(
                transcript_pb.DeleteConversationRequest(
                    namespace=namespace,
                    conversation_id=source,
                    erased_forks=transcript_pb.ErasedForks(forks=[listed.forks[0]]),
                )
            )
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(refused.value).reason == "FORKS_CHANGED"  # type: ignore[union-attr]
        still = await transcript.GetConversation(
            transcript_pb.GetConversationRequest(
                namespace=namespace, conversation_id=grandchild.conversation_id
            )
        )
        assert still.conversation.incarnation == grandchild.incarnation

        erased = await stack.agent.EraseConversation(
            pb.EraseConversationRequest(namespace=namespace, conversation_id=source), timeout=30
        )
        assert erased.complete or list(erased.remaining) == ["memory_index"]
        assert (erased.memories_deleted, erased.summaries_erased) == (2, True)
        receipt = erased.receipt
        assert (receipt.forks, receipt.summaries, receipt.memories) == (2, 2, 2)
        for target in (fork.conversation_id, grandchild.conversation_id):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await transcript.GetConversation(
                    transcript_pb.GetConversationRequest(
                        namespace=namespace, conversation_id=target
                    )
                )
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await summary.GetSummary(
                    summary_pb.GetSummaryRequest(namespace=namespace, conversation_id=target)
                )
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        for memory_id in derived:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await memory.GetMemory(
                    memory_pb.GetMemoryRequest(namespace=namespace, memory_id=memory_id)
                )
            assert error_info(caught.value).reason == "MEMORY_NOT_FOUND"  # type: ignore[union-attr]
        listed_memories = await memory.ListMemories(
            memory_pb.ListMemoriesRequest(namespace=namespace)
        )
        assert list(listed_memories.memories) == []

        async def never_found() -> bool:
            found = await memory.SearchMemories(
                memory_pb.SearchMemoriesRequest(
                    namespace=namespace, query="the fork said its own thing", limit=5
                )
            )
            return not found.degraded and not found.results

        await wait_for(never_found, timeout=30)
