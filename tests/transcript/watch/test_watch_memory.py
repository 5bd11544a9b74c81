"""WatchConversation's memory, measured on a real TranscriptService process (`python -m
services.transcript`): many streams whose reader never reads, on large entries.

The client is hostile: it grants the server HTTP/2's largest flow-control windows and
never reads its socket, so flow control never holds the server back. What bounds the
server is its byte budget (RUNIFOLD_WATCH_MAX_BUFFERED_BYTES_PER_NAMESPACE): the
process's resident memory (VmRSS) stays within the bound docs/operations.md states,
another namespace's stream still delivers meanwhile, and the memory goes back to the
system once the streams have ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import grpc

from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from services.transcript.config import (
    DEFAULT_BUFFERED_BYTES_PER_NAMESPACE,
    WatchLimits,
)
from tests.support.grpc_calls import user
from tests.support.process import ServiceProcess, service_process, value
from tests.support.waiting import wait_for
from tests.transcript.watch.support import Follower, UnreadStreams

MiB = 1024 * 1024
# The namespace's limit of streams (RUNIFOLD_WATCH_MAX_WATCHERS_PER_NAMESPACE), all unread,
# over two connections, on a conversation of 80 entries of 250 KiB (20 MiB).
STREAMS = 128
CONNECTIONS = 2
ENTRIES = 80
ENTRY_BYTES = 250 * 1024
PER_APPEND = 10
POOL_MAX = 8
# docs/operations.md: what the streams may add to a process's memory: twice the bytes
# charged (the entries as read, the message being written and grpc's copy of it), a
# stream's own state, and each pooled connection's input buffer (a page at most).
PER_STREAM_BYTES = 64 * 1024
PER_CONNECTION_BYTES = MiB
BOUND = (
    2 * DEFAULT_BUFFERED_BYTES_PER_NAMESPACE
    + STREAMS * PER_STREAM_BYTES
    + POOL_MAX * PER_CONNECTION_BYTES
)
# What may stay after the streams ended (the allocator's heaps, grpc's caches).
LEFTOVER = 16 * MiB


def _rss(process: ServiceProcess) -> int:
    """The process's resident memory now (VmRSS in /proc/<pid>/status), in bytes."""
    status = Path(f"/proc/{process.process.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


async def test_unread_streams_of_one_namespace_hold_its_byte_budget_and_no_more(
    shared_database_url: str, tmp_path: Path
) -> None:
    flooding, other = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("flood", "other"))
    env = {
        "DATABASE_URL": shared_database_url,
        "RUNIFOLD_MIGRATE": "check",
        "RUNIFOLD_DB_POOL_MAX": str(POOL_MAX),
        # Nothing is cut off during the test: the budget alone bounds the streams.
        "RUNIFOLD_WATCH_SEND_TIMEOUT_S": "3600",
    }
    async with (
        service_process("services.transcript", env, tmp_path) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = stubs.transcript(channel)
        created = await stub.CreateConversation(pb.CreateConversationRequest(namespace=flooding))
        cid = created.conversation.conversation_id
        text = "x" * (ENTRY_BYTES - 16)
        for first in range(0, ENTRIES, PER_APPEND):
            await stub.AppendEntries(
                pb.AppendEntriesRequest(
                    namespace=flooding,
                    conversation_id=cid,
                    messages=[user(f"{first + i} {text}") for i in range(PER_APPEND)],
                )
            )
        request = pb.WatchConversationRequest(namespace=flooding, conversation_id=cid)
        # One stream read to the end first: the process has done this work once.
        async with Follower(stub, request) as reader:
            await reader.caught_up()
            assert len(reader.sequences()) == ENTRIES
        baseline = peak = _rss(server)

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, _rss(server))
                await asyncio.sleep(0.02)  # a sampling period, not a wait for a condition

        sampler = asyncio.create_task(sample())
        share = STREAMS // CONNECTIONS
        clients = [
            await asyncio.to_thread(UnreadStreams, server.address, [request] * share)
            for _ in range(CONNECTIONS)
        ]
        try:
            # Every stream has asked for room: those that got some hold a page each,
            # the rest wait for the namespace's budget.
            pages = DEFAULT_BUFFERED_BYTES_PER_NAMESPACE // WatchLimits().page_charge

            async def stuck() -> bool:
                scraped = await server.scrape()
                waiting = value(scraped, "runifold_watch_budget_waiting")
                return waiting >= STREAMS - 2 * pages or peak - baseline > BOUND

            try:
                await wait_for(stuck, timeout=40, interval=0.2)
            except AssertionError:
                scraped = await server.scrape()
                raise AssertionError(
                    f"watchers {value(scraped, 'runifold_watchers')}, waiting "
                    f"{value(scraped, 'runifold_watch_budget_waiting')}, held "
                    f"{value(scraped, 'runifold_watch_buffered_bytes') / MiB:.1f} MiB, grown "
                    f"{(peak - baseline) / MiB:.0f} MiB"
                ) from None
            assert peak - baseline <= BOUND, (peak - baseline, BOUND)
            scraped = await server.scrape()
            assert value(scraped, "runifold_watchers") == STREAMS
            held = value(scraped, "runifold_watch_buffered_bytes")
            assert held <= DEFAULT_BUFFERED_BYTES_PER_NAMESPACE

            # Meanwhile another namespace's stream delivers.
            theirs = await stub.CreateConversation(pb.CreateConversationRequest(namespace=other))
            other_cid = theirs.conversation.conversation_id
            watch = pb.WatchConversationRequest(namespace=other, conversation_id=other_cid)
            async with Follower(stub, watch) as follower:
                await follower.caught_up()
                appended = await stub.AppendEntries(
                    pb.AppendEntriesRequest(
                        namespace=other, conversation_id=other_cid, messages=[user(text)]
                    )
                )
                await follower.until_sequence(appended.last_sequence)
            assert peak - baseline <= BOUND, (peak - baseline, BOUND)
        finally:
            for client in clients:
                client.close()
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler

        # The streams end with their connections; their memory goes back to the system.
        async def released() -> bool:
            scraped = await server.scrape()
            return (
                value(scraped, "runifold_watchers") == 0
                and value(scraped, "runifold_watch_buffered_bytes") == 0
                and _rss(server) - baseline <= LEFTOVER
            )

        try:
            await wait_for(released, timeout=30, interval=0.2)
        except AssertionError:
            raise AssertionError(
                f"still {(_rss(server) - baseline) / MiB:.0f} MiB above the baseline "
                f"({baseline / MiB:.0f} MiB) after the streams ended"
            ) from None
