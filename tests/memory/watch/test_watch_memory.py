"""WatchMemories' memory, measured on a real MemoryService process (`python -m
services.memory`): a flood of streams from one namespace whose reader never reads, over
memories of the largest content, while another namespace's stream is served.

The client is hostile: it grants the server HTTP/2's largest flow-control windows and
never reads its socket, so flow control never holds the server back. What bounds the
server is its byte budget (RUNIFOLD_MEMORY_WATCH_MAX_BUFFERED_BYTES_PER_NAMESPACE) and
its watcher limit per namespace: the process's resident memory (VmRSS) stays within the
bound docs/memory.md states, the flooding namespace's next stream is refused while
another namespace's opens and delivers, and the memory goes back to the system once the
streams have ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import grpc

from runifold.memory.v1 import memory_service_pb2 as pb
from services.common import stubs
from services.memory.config import DEFAULT_WATCH_BUFFERED_BYTES_PER_NAMESPACE, WatchLimits
from tests.memory.watch.support import Watcher, conversation, source
from tests.memory.watch.test_watch_replicas import _memory_env
from tests.support.fake_openai import FakeOpenAI
from tests.support.process import ServiceProcess, service_process, value
from tests.support.waiting import wait_for
from tests.transcript.watch.support import UnreadStreams

MiB = 1024 * 1024
PATH = "/runifold.memory.v1.MemoryService/WatchMemories"
# The namespace's limit of streams (RUNIFOLD_MEMORY_WATCH_MAX_WATCHERS_PER_NAMESPACE), all
# unread, over two connections, on 128 memories of the largest content (16 KiB: 2 MiB a
# stream, 64 MiB in all: far more than the budget and the sockets hold).
STREAMS = WatchLimits().max_watchers_per_namespace
CONNECTIONS = 2
MEMORIES = 128
CONTENT_BYTES = 16 * 1024
POOL_MAX = 8
# docs/memory.md: what the streams may add to a process's memory: twice the bytes
# charged (the changes as read, the message being written and grpc's copy of it), a
# stream's own state, and each pooled connection's input buffer (a page at most).
PER_STREAM_BYTES = 64 * 1024
PER_CONNECTION_BYTES = MiB
BOUND = (
    2 * DEFAULT_WATCH_BUFFERED_BYTES_PER_NAMESPACE
    + STREAMS * PER_STREAM_BYTES
    + POOL_MAX * PER_CONNECTION_BYTES
)
# Scrapes in a row that see the same (events delivered, bytes held): the streams stopped.
STILL = 5
# What may stay after the streams ended (the allocator's heaps, grpc's caches): the
# changes' many small objects leave the heaps fragmented, and glibc keeps pages it cannot
# trim. What the streams held is checked exactly by the metrics (0 bytes, 0 streams).
LEFTOVER = 24 * MiB


def _rss(process: ServiceProcess) -> int:
    """The process's resident memory now (VmRSS in /proc/<pid>/status), in bytes."""
    status = Path(f"/proc/{process.process.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


async def test_unread_streams_of_one_namespace_hold_its_byte_budget_and_no_more(
    fresh_database_url: str, tmp_path: Path, model: FakeOpenAI
) -> None:
    flooding, other = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("flood", "other"))
    async with service_process(
        "services.transcript", {"DATABASE_URL": fresh_database_url}, tmp_path / "t"
    ) as transcript_process:
        env = {
            **_memory_env(fresh_database_url, transcript_process.address, model),
            "RUNIFOLD_DB_POOL_MAX": str(POOL_MAX),
            # Nothing is cut off during the test: the budget alone bounds the streams.
            "RUNIFOLD_MEMORY_WATCH_SEND_TIMEOUT_S": "3600",
        }
        async with (
            service_process("services.memory", env, tmp_path / "m") as server,
            grpc.aio.insecure_channel(server.address) as channel,
            grpc.aio.insecure_channel(transcript_process.address) as to_transcript,
        ):
            memory, transcript = stubs.memory(channel), stubs.transcript(to_transcript)
            cid = await conversation(transcript, flooding)
            text = "x" * (CONTENT_BYTES - 16)
            for first in range(0, MEMORIES, POOL_MAX):
                await asyncio.gather(
                    *(
                        memory.UpsertMemory(
                            pb.UpsertMemoryRequest(
                                namespace=flooding, content=f"{i:>8} {text}", sources=[source(cid)]
                            )
                        )
                        for i in range(first, first + POOL_MAX)
                    )
                )
            request = pb.WatchMemoriesRequest(namespace=flooding)
            # One stream read to the end first: the process has done this work once.
            async with Watcher(memory, request) as reader:
                await reader.caught_up()
                assert len(reader.sequences()) == MEMORIES
            baseline = peak = _rss(server)

            async def sample() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, _rss(server))
                    await asyncio.sleep(0.02)  # a sampling period, not a wait for a condition

            sampler = asyncio.create_task(sample())
            share = STREAMS // CONNECTIONS
            clients = [
                await asyncio.to_thread(UnreadStreams, server.address, [request] * share, PATH)
                for _ in range(CONNECTIONS)
            ]
            try:
                # The streams run until the transport takes no more: each then holds the
                # rest of its page (a memory's page is smaller than a namespace's budget, so
                # the socket, not the budget, stops them here) or waits for room. Stopped:
                # every stream open, and nothing delivered or released between scrapes.
                seen: list[tuple[float, float]] = []

                async def stopped() -> bool:
                    scraped = await server.scrape()
                    seen.append(
                        (
                            value(scraped, "runifold_memory_watch_events_total"),
                            value(scraped, "runifold_memory_watch_buffered_bytes"),
                        )
                    )
                    return peak - baseline > BOUND or (
                        value(scraped, "runifold_memory_watchers") == STREAMS
                        and len(seen) >= STILL
                        and len(set(seen[-STILL:])) == 1
                    )

                try:
                    await wait_for(stopped, timeout=15, interval=0.2)
                except AssertionError:
                    scraped = await server.scrape()
                    raise AssertionError(
                        f"watchers {value(scraped, 'runifold_memory_watchers')}, waiting "
                        f"{value(scraped, 'runifold_memory_watch_budget_waiting')}, held "
                        f"{value(scraped, 'runifold_memory_watch_buffered_bytes') / MiB:.1f} "
                        f"MiB, grown {(peak - baseline) / MiB:.0f} MiB"
                    ) from None
                # Far more was asked for than the streams may hold, and they hold it.
                assert seen[-1][0] < (STREAMS + 1) * MEMORIES
                assert peak - baseline <= BOUND, (peak - baseline, BOUND)
                scraped = await server.scrape()
                assert value(scraped, "runifold_memory_watchers") == STREAMS
                held = value(scraped, "runifold_memory_watch_buffered_bytes")
                assert held <= DEFAULT_WATCH_BUFFERED_BYTES_PER_NAMESPACE

                # The flooding namespace is at its limit of streams; another is not.
                refused = Watcher(memory, request)
                await refused.until_ended()
                assert refused.reason() == "WATCHER_LIMIT"
                other_cid = await conversation(transcript, other)
                async with Watcher(memory, pb.WatchMemoriesRequest(namespace=other)) as theirs:
                    await theirs.caught_up()
                    written = await memory.UpsertMemory(
                        pb.UpsertMemoryRequest(
                            namespace=other, content=text, sources=[source(other_cid)]
                        )
                    )
                    await theirs.until_sequence(1)
                    assert theirs.changes()[0].memory == written.memory
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
                    value(scraped, "runifold_memory_watchers") == 0
                    and value(scraped, "runifold_memory_watch_buffered_bytes") == 0
                    and _rss(server) - baseline <= LEFTOVER
                )

            try:
                await wait_for(released, timeout=30, interval=0.2)
            except AssertionError:
                raise AssertionError(
                    f"still {(_rss(server) - baseline) / MiB:.0f} MiB above the baseline "
                    f"({baseline / MiB:.0f} MiB) after the streams ended"
                ) from None
