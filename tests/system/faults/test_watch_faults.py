"""WatchConversation under faults, with real processes: PostgreSQL restarted under a
watcher (its listening connection drops), and a reader that stops reading.

Each test runs two TranscriptService processes (`python -m services.transcript`):
the watcher's and the writer's, so that what reaches the watcher crossed processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import grpc
import psutil  # type: ignore[import-untyped]  # no type stubs

from runifold.transcript.v1 import transcript_service_pb2 as pb
from runifold_client import AsyncClient
from services.common import stubs
from services.common.status import error_info
from services.transcript.config import WatchLimits
from tests.support.process import ServiceProcess, service_process, value
from tests.support.waiting import wait_for
from tests.system.faults.support import dedicated_postgres
from tests.transcript.watch.support import check_exactly_once_in_order

# The stalled reader's backlog, and the bound on what the watcher's process may grow by
# while it holds it: the stream holds a page (512 KiB) and the transport a window.
BACKLOG_APPENDS = 50
MESSAGES_PER_APPEND = 4
MESSAGE_BYTES = 200 * 1024
RSS_BOUND = 16 * 1024 * 1024


async def _append_until_acknowledged(client: AsyncClient, cid: str, text: str) -> None:
    """One append, retried with the same request id through an outage until it is answered."""
    request_id = str(uuid.uuid4())

    async def appended() -> bool:
        try:
            await client.append(cid, [text], request_id=request_id)
        except Exception:
            return False
        return True

    await wait_for(appended, timeout=60, interval=0.2)


async def test_a_postgres_restart_under_a_watcher_loses_nothing(tmp_path: Path) -> None:
    namespace = f"restart-{uuid.uuid4().hex[:8]}"
    async with dedicated_postgres() as postgres:
        base = {"DATABASE_URL": postgres.url, "RUNIFOLD_DB_TIMEOUT_S": "2"}
        # The watcher's pulse is off: after the restart only its listening connection,
        # re-made, can bring it the writes (and what it missed meanwhile).
        async with (
            service_process(
                "services.transcript", {**base, "RUNIFOLD_WATCH_POLL_S": "3600"}, tmp_path / "a"
            ) as watching,
            service_process("services.transcript", base, tmp_path / "b") as writing,
            AsyncClient(watching.address, namespace=namespace) as watcher,
            AsyncClient(writing.address, namespace=namespace, max_attempts=5) as writer,
        ):
            cid = (await writer.create_conversation()).conversation_id
            events: list[pb.WatchConversationResponse] = []

            async def follow() -> None:
                async for event in watcher.watch_conversation(cid):
                    events.append(event)

            def delivered() -> list[int]:
                return [
                    entry.sequence
                    for event in events
                    if event.WhichOneof("event") == "appended"
                    for entry in event.appended.entries
                ]

            following = asyncio.create_task(follow())
            try:
                for i in range(3):
                    await _append_until_acknowledged(writer, cid, f"before {i}")

                async def has(last: int) -> bool:
                    return last in delivered()

                await wait_for(lambda: has(3), timeout=30)
                await postgres.stop("fast")
                await postgres.start()
                for i in range(3):
                    await _append_until_acknowledged(writer, cid, f"after {i}")
                await wait_for(lambda: has(6), timeout=60)
                check_exactly_once_in_order(delivered(), 0, 6)
                assert not following.done()
            finally:
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await following


async def _rss(process: ServiceProcess) -> int:
    rss: int = psutil.Process(process.process.pid).memory_info().rss
    return rss


async def test_a_stalled_reader_is_cut_off_without_the_server_holding_its_backlog(
    shared_database_url: str, tmp_path: Path
) -> None:
    namespace = f"stalled-{uuid.uuid4().hex[:8]}"
    base = {"DATABASE_URL": shared_database_url, "RUNIFOLD_MIGRATE": "check"}
    options = [("grpc.http2.bdp_probe", 0)]  # the reader's window stays the default 64 KiB
    async with (
        service_process(
            "services.transcript", {**base, "RUNIFOLD_WATCH_SEND_TIMEOUT_S": "8"}, tmp_path / "a"
        ) as watching,
        service_process("services.transcript", base, tmp_path / "b") as writing,
        grpc.aio.insecure_channel(watching.address, options=options) as to_watching,
        AsyncClient(writing.address, namespace=namespace) as writer,
    ):
        cid = (await writer.create_conversation()).conversation_id
        stalled = stubs.transcript(to_watching).WatchConversation(
            pb.WatchConversationRequest(namespace=namespace, conversation_id=cid)
        )
        first = await stalled.read()  # the heartbeat of an empty conversation; then nothing
        assert isinstance(first, pb.WatchConversationResponse)
        assert first.WhichOneof("event") == "heartbeat"
        baseline = peak = await _rss(watching)

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, await _rss(watching))
                await asyncio.sleep(0.02)  # a sampling period, not a wait for a condition

        sampler = asyncio.create_task(sample())
        try:
            text = "x" * MESSAGE_BYTES
            for i in range(BACKLOG_APPENDS):
                await writer.append(cid, [f"{i} {text}"] * MESSAGES_PER_APPEND)

            async def cut_off() -> bool:
                scraped = await watching.scrape()
                return (
                    value(scraped, "runifold_watch_streams_cut_total", reason="WATCHER_TOO_SLOW")
                    == 1
                )

            await wait_for(cut_off, timeout=60, interval=0.2)
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        backlog = BACKLOG_APPENDS * MESSAGES_PER_APPEND * MESSAGE_BYTES
        assert peak - baseline < RSS_BOUND < backlog / 2, (peak - baseline, backlog)
        # Until its call ends, the cut stream still counts, with the event the transport
        # holds for it: a reader that never reads again cannot open streams without end.
        scraped = await watching.scrape()
        assert value(scraped, "runifold_watchers") == 1
        assert 0 < value(scraped, "runifold_watch_buffered_bytes") <= WatchLimits().page_charge

        # The reader reads again: what the transport held, then the status to resume on.
        got: list[int] = []
        try:
            while (event := await stalled.read()) is not grpc.aio.EOF:
                assert isinstance(event, pb.WatchConversationResponse)
                got.extend(entry.sequence for entry in event.appended.entries)
            raise AssertionError("the stalled stream ended without an error")
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            info = error_info(error)
            assert info is not None and info.reason == "WATCHER_TOO_SLOW"
        last = BACKLOG_APPENDS * MESSAGES_PER_APPEND
        assert len(got) < last  # it was cut off well before the end

        # The call has ended: the stream's slot and bytes are given back.
        async def given_back() -> bool:
            scraped = await watching.scrape()
            return (
                value(scraped, "runifold_watchers") == 0
                and value(scraped, "runifold_watch_buffered_bytes") == 0
            )

        await wait_for(given_back, timeout=10, interval=0.1)
        async with AsyncClient(watching.address, namespace=namespace) as reader:
            rest: list[int] = []
            async for event in reader.watch_conversation(cid, after_sequence=got[-1] if got else 0):
                rest.extend(entry.sequence for entry in event.appended.entries)
                if event.WhichOneof("event") == "heartbeat":
                    break
        check_exactly_once_in_order([*got, *rest], 0, last)
