"""SummaryService through real gRPC servers: TranscriptService and SummaryService on
loopback, real PostgreSQL, the fake OpenAI-compatible model server, worker processes."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from prometheus_client import REGISTRY

from runifold.common.v1 import common_pb2
from runifold.summary.v1 import summary_service_pb2 as spb
from runifold.transcript.v1 import transcript_service_pb2 as tpb
from services.common import stubs
from services.common.postgres.pool import Database
from services.common.server import RunningServer, serving
from services.common.status import error_info
from services.llm.settings import ModelSettings
from services.summary.component import SummaryComponent
from services.summary.config import SummaryConfig
from services.transcript.component import TranscriptComponent
from tests.support.fake_openai import FakeOpenAI, FakeReply, fake_openai
from tests.support.grpc_calls import check_health_follows_schema
from tests.support.process import service_process
from tests.support.settings import server_settings
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from runifold.summary.v1.summary_service_pb2_grpc import SummaryServiceAsyncStub
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub

NO_WORKERS = SummaryConfig(workers=0)


def openai_config(fake: FakeOpenAI, **overrides: Any) -> SummaryConfig:
    base = SummaryConfig(
        chat_model=ModelSettings(url=fake.base_url, name="fake-model", max_retries=0),
        workers=0,
    )
    return replace(base, **overrides)


@dataclass
class Stack:
    """A TranscriptService server and a SummaryService server that reads it over gRPC."""

    transcript: TranscriptServiceAsyncStub
    summary: SummaryServiceAsyncStub
    summary_server: RunningServer
    transcript_address: str


@contextlib.asynccontextmanager
async def stack(database_url: str, config: SummaryConfig) -> AsyncIterator[Stack]:
    async with serving(
        [TranscriptComponent()], server_settings(), database_url=database_url
    ) as transcript_server:
        settings = server_settings(TRANSCRIPT_SERVICE_ADDR=transcript_server.address)
        async with (
            serving([SummaryComponent(config)], settings, database_url=database_url) as running,
            grpc.aio.insecure_channel(transcript_server.address) as tch,
            grpc.aio.insecure_channel(running.address) as sch,
        ):
            yield Stack(
                stubs.transcript(tch), stubs.summary(sch), running, transcript_server.address
            )


def message(index: int, tag: str = "") -> common_pb2.Message:
    role = common_pb2.ROLE_USER if index % 2 else common_pb2.ROLE_ASSISTANT
    return common_pb2.Message(role=role, text=f"{tag} message {index}".strip())


async def conversation(
    stub: TranscriptServiceAsyncStub, namespace: str, entries: int, tag: str = ""
) -> str:
    created = await stub.CreateConversation(tpb.CreateConversationRequest(namespace=namespace))
    cid = created.conversation.conversation_id
    for start in range(1, entries + 1, 250):
        await stub.AppendEntries(
            tpb.AppendEntriesRequest(
                conversation_id=cid,
                namespace=namespace,
                messages=[message(i, tag) for i in range(start, min(start + 250, entries + 1))],
            )
        )
    return cid


def failure(error: grpc.aio.AioRpcError) -> tuple[grpc.StatusCode, str]:
    info = error_info(error)
    assert info is not None and info.domain == "runifold.io"
    return error.code(), info.reason


async def current_through(stub: SummaryServiceAsyncStub, namespace: str, cid: str) -> int:
    got = await stub.GetSummary(spb.GetSummaryRequest(conversation_id=cid, namespace=namespace))
    return got.summary.through_sequence if got.HasField("summary") else 0


def summarize(cid: str, namespace: str, window: int, batch: int, passes: int, **budget: int) -> Any:
    return spb.SummarizeRequest(
        conversation_id=cid,
        namespace=namespace,
        window=window,
        summary_batch=batch,
        max_summary_passes=passes,
        budget=common_pb2.Budget(**budget),
    )


# -- the summarization workflow ------------------------------------------------------


async def test_5000_entries_leave_the_exact_backlog_then_finish(
    shared_database_url: str, namespace: str
) -> None:
    async with stack(shared_database_url, NO_WORKERS) as s:
        cid = await conversation(s.transcript, namespace, 5000)
        # 5,000 entries, window 16: 4,984 wait outside the window. Batch 256, 3 passes:
        # 768 summarized, 4,216 left. Those are 16 full batches and one of 120: 17 passes.
        first = await s.summary.Summarize(summarize(cid, namespace, 16, 256, 3))
        assert (first.passes, first.backlog) == (3, 4984 - 3 * 256)
        assert first.summary.through_sequence == 768 and first.summary.revision == 3
        assert first.usage.model_calls == 3
        second = await s.summary.Summarize(summarize(cid, namespace, 16, 256, 64))
        assert (second.passes, second.backlog) == (17, 0)
        assert second.summary.through_sequence == 4984 and second.summary.revision == 20
        assert second.usage.model_calls == 17
        assert "through entry 4984" in second.summary.text
        assert await current_through(s.summary, namespace, cid) == 4984


async def test_racing_summarizers_only_move_forward(
    shared_database_url: str, namespace: str
) -> None:
    async with fake_openai() as fake:
        arrived: list[asyncio.Event] = [asyncio.Event(), asyncio.Event()]

        async def both_in_flight(body: Any) -> FakeReply:
            # Hold each answer until both racers are waiting on the model: a real race.
            # Their texts differ, so the loser's commit cannot pass for a replay.
            index = len(fake.chat_requests) - 1
            arrived[index].set()
            await asyncio.gather(*(event.wait() for event in arrived))
            return FakeReply(text=f"summary by racer {index}")

        fake.respond_with(both_in_flight)
        async with stack(shared_database_url, openai_config(fake)) as s:
            cid = await conversation(s.transcript, namespace, 40)

            async def race() -> spb.SummarizeResponse | grpc.aio.AioRpcError:
                try:
                    return await s.summary.Summarize(summarize(cid, namespace, 4, 8, 1))
                except grpc.aio.AioRpcError as error:
                    return error

            results = await asyncio.gather(race(), race())
            # The loser's pass is dropped (a no-op, never a regression): it reports no
            # committed pass, the winner's summary, and the model call it spent.
            assert all(isinstance(r, spb.SummarizeResponse) for r in results)
            done = sorted(
                (r for r in results if isinstance(r, spb.SummarizeResponse)), key=lambda r: r.passes
            )
            assert [r.passes for r in done] == [0, 1]
            assert [r.summary.through_sequence for r in done] == [8, 8]
            assert done[0].summary.text == done[1].summary.text
            assert done[0].usage.model_calls == 1

            # Many racers, many passes each: whatever interleaving, never a step back.
            fake.respond_with(lambda body: FakeReply(text="a summary"))
            fake.delay = 0.01
            seen: list[int] = []

            async def racer() -> None:
                for _ in range(10):
                    reply = await s.summary.Summarize(summarize(cid, namespace, 4, 4, 64))
                    seen.append(reply.summary.through_sequence)
                    if reply.backlog == 0:
                        return

            await asyncio.gather(*(racer() for _ in range(4)))
            assert await current_through(s.summary, namespace, cid) == 36
            assert seen and max(seen) == 36
        db = Database(shared_database_url, server_settings())
        await db.open()
        try:
            async with db.connection() as conn:
                cursor = await conn.execute(
                    """SELECT through_sequence FROM summary.summary_history
                        WHERE namespace = %s ORDER BY revision""",
                    (namespace,),
                )
                history = [row[0] for row in await cursor.fetchall()]
        finally:
            await db.close()
        assert history == sorted(set(history)), "every revision covers more than the last"


async def test_no_summary_ends_between_a_tool_call_and_its_results(
    shared_database_url: str, namespace: str
) -> None:
    def group(turn: int) -> list[common_pb2.Message]:
        calls = [common_pb2.ToolCall(id=f"t{turn}-{i}", name="lookup") for i in range(2)]
        return [
            common_pb2.Message(role=common_pb2.ROLE_USER, text=f"question {turn}"),
            common_pb2.Message(role=common_pb2.ROLE_ASSISTANT, tool_calls=calls),
            *(
                common_pb2.Message(role=common_pb2.ROLE_TOOL, text="42", tool_call_id=call.id)
                for call in calls
            ),
            common_pb2.Message(role=common_pb2.ROLE_ASSISTANT, text=f"answer {turn}"),
        ]

    async with stack(shared_database_url, NO_WORKERS) as s:
        created = await s.transcript.CreateConversation(
            tpb.CreateConversationRequest(namespace=namespace)
        )
        cid = created.conversation.conversation_id
        messages = [m for turn in range(8) for m in group(turn)]
        await s.transcript.AppendEntries(
            tpb.AppendEntriesRequest(conversation_id=cid, namespace=namespace, messages=messages)
        )
        roles = {i + 1: m.role for i, m in enumerate(messages)}
        done = await s.summary.Summarize(summarize(cid, namespace, 3, 3, 64))
        assert done.backlog == 0 and done.passes > 8
        db = Database(shared_database_url, server_settings())
        await db.open()
        try:
            async with db.connection() as conn:
                cursor = await conn.execute(
                    "SELECT through_sequence FROM summary.summary_history "
                    "WHERE namespace = %s ORDER BY revision",
                    (namespace,),
                )
                ends = [row[0] for row in await cursor.fetchall()]
        finally:
            await db.close()
        ends.append(done.summary.through_sequence)
        assert len(ends) == done.passes
        for end in ends:
            assert roles.get(end + 1) != common_pb2.ROLE_TOOL, end
        # A commit that would cut a group is refused too.
        with pytest.raises(grpc.aio.AioRpcError) as split:
            await s.summary.CommitSummary(
                spb.CommitSummaryRequest(
                    conversation_id=cid,
                    namespace=namespace,
                    text="x",
                    through_sequence=len(messages) - 2,
                )
            )
        assert failure(split.value) == (grpc.StatusCode.INVALID_ARGUMENT, "SPLITS_TOOL_CALL")


async def test_bad_input_is_invalid_argument_and_writes_nothing(
    shared_database_url: str, namespace: str
) -> None:
    async with stack(shared_database_url, NO_WORKERS) as s:
        cid = await conversation(s.transcript, namespace, 10)

        def commit(text: str = "ok", through: int = 4, **extra: Any) -> Any:
            return spb.CommitSummaryRequest(
                conversation_id=cid,
                namespace=namespace,
                text=text,
                through_sequence=through,
                **extra,
            )

        invalid: dict[str, tuple[Any, Any, str]] = {
            "through 0": (s.summary.CommitSummary, commit(through=0), "INVALID_SEQUENCE"),
            "beyond": (s.summary.CommitSummary, commit(through=11), "SEQUENCE_OUT_OF_RANGE"),
            "empty": (s.summary.CommitSummary, commit(text=""), "INVALID_SUMMARY_TEXT"),
            "oversize": (
                s.summary.CommitSummary,
                commit(text="x" * (64 * 1024 + 1)),
                "SUMMARY_TOO_LARGE",
            ),
            "bad id": (
                s.summary.GetSummary,
                spb.GetSummaryRequest(conversation_id="nope", namespace=namespace),
                "INVALID_CONVERSATION_ID",
            ),
            "bad namespace": (
                s.summary.GetBacklog,
                spb.GetBacklogRequest(namespace="no spaces"),
                "INVALID_NAMESPACE",
            ),
            "window 0": (s.summary.Summarize, summarize(cid, namespace, 0, 8, 1), "INVALID_WINDOW"),
            "batch 4097": (
                s.summary.Summarize,
                summarize(cid, namespace, 4, 4097, 1),
                "INVALID_SUMMARY_BATCH",
            ),
            "passes 65": (
                s.summary.Summarize,
                summarize(cid, namespace, 4, 8, 65),
                "INVALID_MAX_SUMMARY_PASSES",
            ),
            "negative budget": (
                s.summary.Summarize,
                summarize(cid, namespace, 4, 8, 1, max_model_calls=-1),
                "INVALID_BUDGET",
            ),
            "job window": (
                s.summary.RequestSummary,
                spb.RequestSummaryRequest(
                    conversation_id=cid, namespace=namespace, window=0, summary_batch=8
                ),
                "INVALID_WINDOW",
            ),
            "job batch": (
                s.summary.RequestSummary,
                spb.RequestSummaryRequest(
                    conversation_id=cid, namespace=namespace, window=4, summary_batch=0
                ),
                "INVALID_SUMMARY_BATCH",
            ),
        }
        for case, (method, request, reason) in invalid.items():
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await method(request)
            assert failure(error.value) == (grpc.StatusCode.INVALID_ARGUMENT, reason), case
        assert await current_through(s.summary, namespace, cid) == 0
        backlog = await s.summary.GetBacklog(spb.GetBacklogRequest(namespace=namespace))
        assert backlog.depth == 0

        await s.summary.CommitSummary(commit(through=6))
        for case, request, code, reason in (
            ("older", commit(through=4), grpc.StatusCode.FAILED_PRECONDITION, "SUMMARY_NOT_NEWER"),
            (
                "same",
                commit(text="other", through=6),
                grpc.StatusCode.FAILED_PRECONDITION,
                "SUMMARY_NOT_NEWER",
            ),
            (
                "stale swap",
                commit(through=8, expected_through_sequence=0),
                grpc.StatusCode.ABORTED,
                "SUMMARY_CONFLICT",
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await s.summary.CommitSummary(request)
            assert failure(error.value) == (code, reason), case
        assert await current_through(s.summary, namespace, cid) == 6
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await s.summary.GetSummary(
                spb.GetSummaryRequest(conversation_id=str(uuid.uuid4()), namespace=namespace)
            )
        assert failure(missing.value) == (grpc.StatusCode.NOT_FOUND, "CONVERSATION_NOT_FOUND")


async def test_budget_and_deadline_bound_the_passes(
    shared_database_url: str, namespace: str
) -> None:
    async with fake_openai() as fake, stack(shared_database_url, openai_config(fake)) as s:
        cid = await conversation(s.transcript, namespace, 60)
        with pytest.raises(grpc.aio.AioRpcError) as exhausted:
            await s.summary.Summarize(summarize(cid, namespace, 4, 8, 5, max_model_calls=2))
        assert failure(exhausted.value) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "BUDGET_EXHAUSTED")
        assert await current_through(s.summary, namespace, cid) == 16  # the two passes, no more
        assert len(fake.chat_requests) == 2

        fake.respond_with(lambda body: FakeReply(text="   "))  # nothing worth committing
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await s.summary.Summarize(summarize(cid, namespace, 4, 8, 5))
        assert failure(refused.value) == (grpc.StatusCode.FAILED_PRECONDITION, "SUMMARY_INVALID")
        assert await current_through(s.summary, namespace, cid) == 16
        fake.respond_with(lambda body: FakeReply(text="a summary"))

        # The model answers after the caller's deadline: the call ends first, and the
        # late answer must not be committed by a pass nobody waits for any more.
        fake.delay = 3
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await s.summary.Summarize(summarize(cid, namespace, 4, 8, 5), timeout=0.5)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

        async def hung_request_answered() -> bool:
            requests = fake.chat_requests
            return len(requests) >= 4 and all(r.finished is not None for r in requests)

        await wait_for(hung_request_answered, timeout=10)
        assert len(fake.chat_requests) == 4, "no further pass after the deadline"
        assert fake.chat_requests[-1].status == 200  # answered, not cut off
        assert await current_through(s.summary, namespace, cid) == 16


# -- the queue -----------------------------------------------------------------------------


async def _backlog(stub: SummaryServiceAsyncStub, namespace: str) -> spb.GetBacklogResponse:
    return await stub.GetBacklog(spb.GetBacklogRequest(namespace=namespace))


async def _gauge_is(name: str, expected: float) -> bool:
    """This process's metric `name` reads `expected` (in-process servers share it)."""
    return REGISTRY.get_sample_value(name) == expected


async def _gauge_above(name: str, bound: float) -> bool:
    value = REGISTRY.get_sample_value(name)
    return value is not None and value > bound


async def test_summarizer_outage_loses_no_job_and_the_queue_drains(
    fresh_database_url: str, namespace: str
) -> None:
    async with fake_openai() as fake:
        config = openai_config(
            fake,
            workers=2,
            poll_interval_s=0.05,
            gauge_interval_s=0.05,
            backoff_base_s=0.05,
            backoff_max_s=0.2,
            max_failures=2,
        )
        fake.fail(503)
        async with stack(fresh_database_url, config) as s:
            cids = [await conversation(s.transcript, namespace, 30) for _ in range(8)]
            for cid in cids:
                job = await s.summary.RequestSummary(
                    spb.RequestSummaryRequest(
                        conversation_id=cid, namespace=namespace, window=4, summary_batch=8
                    )
                )
                assert job.created and job.job.state == spb.JOB_STATE_PENDING
            repeat = await s.summary.RequestSummary(
                spb.RequestSummaryRequest(
                    conversation_id=cids[0], namespace=namespace, window=4, summary_batch=8
                )
            )
            assert not repeat.created

            # Every job is tried, and tried again, far more often than max_failures:
            # an outage never parks a job.
            db = Database(fresh_database_url, server_settings())
            await db.open()

            async def all_retried() -> bool:
                async with db.connection() as conn:
                    cursor = await conn.execute(
                        "SELECT min(attempts), count(*) FROM summary.jobs WHERE namespace = %s",
                        (namespace,),
                    )
                    row = await cursor.fetchone()
                return row is not None and row[1] == 8 and row[0] >= 3

            try:
                await wait_for(all_retried, timeout=30)
                during = await _backlog(s.summary, namespace)
                assert (during.depth, during.failed_count) == (8, 0)
                # The queue gauges follow the queue (a fresh database: these are all its
                # jobs), so the gauge reading 0 at the end is the gauge moving, not idle.
                await wait_for(lambda: _gauge_is("runifold_summary_jobs_depth", 8))
                await wait_for(lambda: _gauge_above("runifold_summary_jobs_oldest_age_seconds", 0))
                assert during.oldest_pending_age.ToNanoseconds() > 0
                assert await current_through(s.summary, namespace, cids[0]) == 0

                fake.recover()

                async def drained() -> bool:
                    backlog = await _backlog(s.summary, namespace)
                    return backlog.depth == 0

                await wait_for(drained, timeout=30)
                async with db.connection() as conn:
                    cursor = await conn.execute(
                        "SELECT state, count(*) FROM summary.jobs WHERE namespace = %s "
                        "GROUP BY state",
                        (namespace,),
                    )
                    states = dict(await cursor.fetchall())
            finally:
                await db.close()
            assert states == {"done": 8}
            for cid in cids:
                assert await current_through(s.summary, namespace, cid) == 26
            after = await _backlog(s.summary, namespace)
            assert (after.depth, after.failed_count, after.running_count) == (0, 0, 0)
            assert after.oldest_pending_age.ToNanoseconds() == 0

            await wait_for(lambda: _gauge_is("runifold_summary_jobs_depth", 0))
            await wait_for(lambda: _gauge_is("runifold_summary_jobs_oldest_age_seconds", 0))
            assert REGISTRY.get_sample_value("runifold_summary_jobs_failed") == 0


async def test_a_job_of_an_erased_conversation_ends(
    fresh_database_url: str, namespace: str
) -> None:
    config = replace(NO_WORKERS, workers=1, poll_interval_s=0.05)
    async with stack(fresh_database_url, config) as s:
        cid = await conversation(s.transcript, namespace, 3)
        await s.transcript.DeleteConversation(
            tpb.DeleteConversationRequest(conversation_id=cid, namespace=namespace)
        )
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await s.summary.RequestSummary(
                spb.RequestSummaryRequest(
                    conversation_id=cid, namespace=namespace, window=1, summary_batch=1
                )
            )
        assert failure(error.value) == (grpc.StatusCode.NOT_FOUND, "CONVERSATION_NOT_FOUND")
        cid = await conversation(s.transcript, namespace, 3)
        # Enqueued while the conversation exists, erased before a worker runs it.
        component = s.summary_server.components[0]
        assert isinstance(component, SummaryComponent) and component.workers is not None
        await component.workers.stop()
        await s.summary.RequestSummary(
            spb.RequestSummaryRequest(
                conversation_id=cid, namespace=namespace, window=1, summary_batch=1
            )
        )
        await s.transcript.DeleteConversation(
            tpb.DeleteConversationRequest(conversation_id=cid, namespace=namespace)
        )
        await component.workers.start()

        async def gone() -> bool:
            return (await _backlog(s.summary, namespace)).depth == 0

        await wait_for(gone)
        assert (await _backlog(s.summary, namespace)).failed_count == 0


async def test_two_worker_processes_drain_one_queue_without_running_a_job_twice(
    fresh_database_url: str, namespace: str, tmp_path: Path
) -> None:
    async with fake_openai() as fake:
        fake.delay = 0.02
        async with serving(
            [TranscriptComponent()], server_settings(), database_url=fresh_database_url
        ) as transcript_server:
            env = {
                "TRANSCRIPT_SERVICE_ADDR": transcript_server.address,
                "RUNIFOLD_SUMMARY_MODEL_URL": fake.base_url,
                "RUNIFOLD_SUMMARY_MODEL_MAX_RETRIES": "0",
                "RUNIFOLD_SUMMARY_WORKERS": "2",
                "RUNIFOLD_SUMMARY_POLL_INTERVAL_S": "0.05",
                "RUNIFOLD_SUMMARY_JOB_LEASE_S": "5",
                "RUNIFOLD_DB_POOL_MIN": "1",
                "DATABASE_URL": fresh_database_url,
            }
            async with (
                service_process("services.summary", env, tmp_path / "first") as first,
                service_process("services.summary", env, tmp_path / "second") as second,
                grpc.aio.insecure_channel(transcript_server.address) as tch,
                grpc.aio.insecure_channel(first.address) as ch1,
                grpc.aio.insecure_channel(second.address) as ch2,
            ):
                transcript = stubs.transcript(tch)
                summaries = [stubs.summary(ch1), stubs.summary(ch2)]
                cids = [
                    await conversation(transcript, namespace, 40, tag=f"conv-{k}")
                    for k in range(24)
                ]
                for k, cid in enumerate(cids):
                    await summaries[k % 2].RequestSummary(
                        spb.RequestSummaryRequest(
                            conversation_id=cid, namespace=namespace, window=4, summary_batch=8
                        )
                    )

                async def drained() -> bool:
                    return (await _backlog(summaries[0], namespace)).depth == 0

                await wait_for(drained, timeout=60)
                for cid in cids:
                    assert await current_through(summaries[1], namespace, cid) == 36

    db = Database(fresh_database_url, server_settings())
    await db.open()
    try:
        async with db.connection() as conn:
            cursor = await conn.execute(
                "SELECT state, attempts, claimed_by FROM summary.jobs WHERE namespace = %s",
                (namespace,),
            )
            jobs = await cursor.fetchall()
    finally:
        await db.close()
    assert len(jobs) == 24
    # Each job was claimed exactly once (a second claim, or a lease taken over, would
    # have counted a second attempt) and finished.
    assert {(state, attempts) for state, attempts, _ in jobs} == {("done", 1)}
    processes = {claimed_by.rsplit(":", 1)[0] for _, _, claimed_by in jobs}
    assert len(processes) == 2, "both processes took jobs"
    # And the model calls of one conversation never overlapped in time (5 passes each).
    calls: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for request in fake.chat_requests:
        tags = set(re.findall(r"conv-\d+", request.messages[-1]["content"]))
        assert len(tags) == 1
        assert request.finished is not None
        calls[tags.pop()].append((request.started, request.finished))
    assert len(calls) == 24
    for spans in calls.values():
        spans.sort()
        assert len(spans) == 5
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end


async def test_health_follows_the_summary_schema(fresh_database_url: str) -> None:
    name = "runifold.summary.v1.SummaryService"
    async with stack(fresh_database_url, NO_WORKERS) as s:
        await check_health_follows_schema(
            fresh_database_url, s.summary_server.address, name, schema_service="summary"
        )
