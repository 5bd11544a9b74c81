"""PostgreSQL stopped under a write load, then started again.

TranscriptService runs as production runs it (`python -m services.transcript`,
its own process) on a PostgreSQL of the test's own. Writers append with request
ids; PostgreSQL is stopped in the middle. The test requires: every failed call is
UNAVAILABLE with ErrorInfo STORE_UNAVAILABLE (never INTERNAL), health turns
NOT_SERVING, no acknowledged append is lost, no partial append exists, and once
PostgreSQL is back the same process serves again by itself (health SERVING, the
writers' retries and new appends succeed) with no restart and no operator. A
database that is up but stalled past the statement timeout is UNAVAILABLE too.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from tests.support.fake_openai import FakeReply, fake_openai
from tests.support.grpc_calls import health_status, user
from tests.support.process import service_process, value
from tests.support.waiting import wait_for
from tests.system.faults.support import (
    NOT_SERVING,
    SERVING,
    Acked,
    channel_to,
    check_exactly_once,
    dedicated_postgres,
    failure,
    run_writer,
    start_writers,
    stop_tasks,
    stored_appends,
)

WRITERS = 8
UNAVAILABLE = "UNAVAILABLE/STORE_UNAVAILABLE"
TRANSCRIPT = "runifold.transcript.v1.TranscriptService"

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_postgres_outage_under_write_load(tmp_path: Path, mode: str) -> None:
    namespace = f"fault-{uuid.uuid4().hex[:8]}"
    async with dedicated_postgres() as postgres:
        env = {
            "DATABASE_URL": postgres.url,
            "RUNIFOLD_HEALTH_INTERVAL_S": "0.1",
            "RUNIFOLD_DB_TIMEOUT_S": "1",
            "RUNIFOLD_DB_POOL_MIN": "2",
            "RUNIFOLD_DB_POOL_MAX": "8",
        }
        async with (
            service_process("services.transcript", env, tmp_path) as process,
            channel_to(process.address) as channel,
        ):
            stub = stubs.transcript(channel)
            load = await start_writers(stub, namespace, WRITERS)
            writers = [
                asyncio.create_task(run_writer(lambda: stub, load, writer))
                for writer in load.writers
            ]

            async def acknowledged(count: int) -> bool:
                return load.acknowledged >= count

            async def health_is(status: int) -> bool:
                return await health_status(process.address) == status

            async def every_writer_refused() -> bool:
                return load.failures[UNAVAILABLE] >= WRITERS

            try:
                await wait_for(lambda: acknowledged(5 * WRITERS), timeout=30)
                # Stop PostgreSQL while the writers keep writing.
                await postgres.stop(mode)
                before = load.acknowledged
                await wait_for(lambda: health_is(NOT_SERVING), timeout=15)
                await wait_for(every_writer_refused, timeout=15)
                # Nothing commits while the database is down.
                assert load.acknowledged - before <= WRITERS
                assert await health_status(process.address, TRANSCRIPT) == NOT_SERVING

                await postgres.start()
                # The same process, untouched, serves again: health, then every writer's
                # retried append and three more each.
                await wait_for(lambda: health_is(SERVING), timeout=30)
                assert await health_status(process.address, TRANSCRIPT) == SERVING
                await load.progress(3)
                load.stopping = True
                await asyncio.wait_for(asyncio.gather(*writers), timeout=60)
            finally:
                await stop_tasks(writers)
            assert process.process.returncode is None, "the service process died"
            metrics = await process.scrape()

        assert set(load.failures) == {UNAVAILABLE}, load.failures
        assert all(not w.unknown for w in load.writers)
        check_exactly_once(load, await stored_appends(postgres.url, namespace))
        assert value(metrics, "runifold_store_errors_total", store="transcript") >= WRITERS
        assert (
            value(
                metrics,
                "grpc_server_handled_total",
                grpc_method="AppendEntries",
                grpc_code="UNAVAILABLE",
            )
            == load.failures[UNAVAILABLE]
        )
        assert value(metrics, "grpc_server_handled_total", grpc_code="INTERNAL") == 0


async def test_a_stalled_database_is_unavailable_not_internal(
    fresh_database_url: str, tmp_path: Path
) -> None:
    """PostgreSQL up but stalled (a row locked past the statement timeout): the append
    is UNAVAILABLE/STORE_UNAVAILABLE, counted as a store error, and its retry under the
    same request id commits once the stall ends."""
    namespace = f"stall-{uuid.uuid4().hex[:8]}"
    env = {"DATABASE_URL": fresh_database_url, "RUNIFOLD_DB_STATEMENT_TIMEOUT_MS": "300"}
    async with (
        service_process("services.transcript", env, tmp_path) as process,
        channel_to(process.address) as channel,
    ):
        stub = stubs.transcript(channel)
        load = await start_writers(stub, namespace, 1)
        writer = load.writers[0]
        request = pb.AppendEntriesRequest(
            namespace=namespace,
            conversation_id=writer.conversation_id,
            expected_version=0,
            request_id="stalled-append",
            messages=[user("written once")],
        )
        async with await psycopg.AsyncConnection.connect(fresh_database_url) as locker:
            await locker.execute(
                "SELECT 1 FROM transcript.conversations WHERE conversation_id = %s FOR UPDATE",
                (uuid.UUID(writer.conversation_id),),
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.AppendEntries(request, timeout=10)
            assert failure(caught.value) == UNAVAILABLE
            await locker.rollback()
        first = await stub.AppendEntries(request, timeout=10)
        again = await stub.AppendEntries(request, timeout=10)
        metrics = await process.scrape()
    assert (first.version, first.replayed, again.version, again.replayed) == (1, False, 1, True)
    writer.acked.append(Acked("stalled-append", ("written once",), 1, 1, 1))
    check_exactly_once(load, await stored_appends(fresh_database_url, namespace))
    assert value(metrics, "runifold_store_errors_total", store="transcript") == 1
    assert value(metrics, "grpc_server_handled_total", grpc_code="INTERNAL") == 0


async def test_a_turn_whose_commit_meets_an_outage_commits_once_postgres_is_back(
    tmp_path: Path,
) -> None:
    """The model answered; PostgreSQL is down when the turn appends: the agent sends the
    same append again (its request id is the turn id) until PostgreSQL is back, and the
    turn commits, with the one model call it made: completed model work is not lost to a
    blip, nor run twice."""
    namespace = f"outage-{uuid.uuid4().hex[:8]}"
    release = asyncio.Event()
    async with dedicated_postgres() as postgres, fake_openai() as model:

        async def respond(body: Any) -> FakeReply:
            await asyncio.wait_for(release.wait(), 60)
            return FakeReply(text="the answer", usage=(10, 3))

        model.respond_with(respond)
        env = {
            "DATABASE_URL": postgres.url,
            "RUNIFOLD_AGENT_MODEL_URL": model.base_url,
            "RUNIFOLD_AGENT_MODEL_NAME": "fake-model",
            "RUNIFOLD_AGENT_MODEL_MAX_RETRIES": "0",
            "RUNIFOLD_SUMMARY_WORKERS": "0",
        }
        async with (
            service_process("services", env, tmp_path) as process,
            channel_to(process.address) as channel,
        ):
            transcript, agent = stubs.transcript(channel), stubs.agent(channel)
            created = await transcript.CreateConversation(
                pb.CreateConversationRequest(namespace=namespace)
            )
            cid = created.conversation.conversation_id
            running = asyncio.ensure_future(
                agent.RunConversation(
                    agent_pb.RunConversationRequest(
                        namespace=namespace,
                        conversation_id=cid,
                        input=[user("hello")],
                        turn_id="turn-through-an-outage",
                    ),
                    timeout=90,
                )
            )

            async def asked() -> bool:
                return bool(model.chat_requests)

            await wait_for(asked, timeout=30)
            await postgres.stop("fast")
            release.set()  # the answer comes while the database is down

            async def retried() -> bool:
                metrics = await process.scrape()
                return value(metrics, "runifold_turn_write_retries_total", what="commit") >= 1

            await wait_for(retried, timeout=30)
            await postgres.start()
            result = await running
            page = await transcript.ListEntries(
                pb.ListEntriesRequest(namespace=namespace, conversation_id=cid)
            )
        assert result.conversation_version == 1 and not result.replayed
        assert [e.message.text for e in page.entries] == ["hello", "the answer"]
        assert len(model.chat_requests) == 1
