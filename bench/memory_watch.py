"""WatchMemories benchmarks (issue 30).

1. Upsert-to-delivery lag: a writer upserts one memory at a time and a watcher follows
   the namespace; each lag runs from the moment UpsertMemory is sent to the moment the
   watcher receives its CREATED change. Measured with the writer and the watcher on one
   MemoryService process, and on two (the change then reaches the watcher's process
   through PostgreSQL's NOTIFY). The UpsertMemory round trip alone is printed beside it.
2. The memory of an idle stream: a process's RSS before and after IDLE streams open
   (each on a namespace of its own, past its first heartbeat), divided by IDLE.

Embeddings come from the fake OpenAI-compatible server (no local model to load), the
index is pgvector in the same database.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import grpc

from bench.common import Stats, new_database, seed_conversation, server, server_process
from bench.stats import rss_mib
from runifold.memory.v1 import memory_service_pb2 as pb
from services.common import stubs
from tests.support.fake_openai import fake_openai

IDLE = 1000
UPSERTS = 200
ENV = {
    "RUNIFOLD_MEMORY_INDEX": "pgvector",
    "RUNIFOLD_EMBEDDINGS": "openai",
    "RUNIFOLD_EMBEDDINGS_MODEL": "fake-embeddings",
    "RUNIFOLD_EMBEDDINGS_DIMENSION": "8",
    "RUNIFOLD_MEMORY_WATCH_MAX_WATCHERS": str(IDLE + 100),
    "RUNIFOLD_MAX_CONCURRENT_RPCS": str(2 * IDLE + 200),
}


async def delivery(
    writer_address: str, watcher_address: str, namespace: str, cid: str, label: str
) -> tuple[Stats, Stats]:
    """Upsert-to-delivery lags, and the UpsertMemory round trips, of UPSERTS upserts."""
    async with (
        grpc.aio.insecure_channel(writer_address) as to_writer,
        grpc.aio.insecure_channel(watcher_address) as to_watcher,
    ):
        writer, watcher = stubs.memory(to_writer), stubs.memory(to_watcher)
        source = [pb.MemorySource(conversation_id=cid, from_sequence=1, through_sequence=1)]
        call = watcher.WatchMemories(pb.WatchMemoriesRequest(namespace=namespace))
        while True:  # replayed changes of an earlier run, then caught up
            event = await call.read()
            assert isinstance(event, pb.WatchMemoriesResponse)
            if event.WhichOneof("event") == "heartbeat":
                break
        arrived: dict[str, float] = {}
        waiting: dict[str, asyncio.Event] = {}

        async def read() -> None:
            while (event := await call.read()) is not grpc.aio.EOF:
                assert isinstance(event, pb.WatchMemoriesResponse)
                if event.WhichOneof("event") == "change":
                    memory_id = event.change.memory_id
                    arrived[memory_id] = time.perf_counter()
                    waiting.setdefault(memory_id, asyncio.Event()).set()

        reader = asyncio.create_task(read())
        lags: list[float] = []
        round_trips: list[float] = []
        start_all = time.perf_counter()
        try:
            for i in range(UPSERTS):
                memory_id = str(uuid.uuid4())
                waiting.setdefault(memory_id, asyncio.Event())
                sent = time.perf_counter()
                await writer.UpsertMemory(
                    pb.UpsertMemoryRequest(
                        namespace=namespace,
                        memory_id=memory_id,
                        content=f"benchmark fact {i}",
                        sources=source,
                    )
                )
                round_trips.append(time.perf_counter() - sent)
                await asyncio.wait_for(waiting[memory_id].wait(), 30)
                lags.append(arrived[memory_id] - sent)
        finally:
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
        elapsed = time.perf_counter() - start_all
    return (
        Stats(f"upsert to delivery, {label}", lags, elapsed),
        Stats(f"UpsertMemory round trip, {label}", round_trips, elapsed),
    )


async def idle_streams(address: str, pid: int, count: int) -> str:
    """The RSS an idle stream adds to its process (`count` of them, one per namespace)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = stubs.memory(channel)
        before = rss_mib(pid) or 0.0
        prefix = f"idle-{uuid.uuid4().hex[:6]}"
        calls = [
            stub.WatchMemories(pb.WatchMemoriesRequest(namespace=f"{prefix}-{i}"))
            for i in range(count)
        ]
        try:
            for call in calls:
                await call.read()  # the heartbeat of an empty namespace: it is open
            await asyncio.sleep(2.0)  # let the opening settle before measuring
            after = rss_mib(pid) or 0.0
        finally:
            for call in calls:
                call.cancel()
    per_stream_kib = (after - before) * 1024 / count
    return (
        f"{count} idle WatchMemories streams on one process: RSS {before:.0f} -> {after:.0f} "
        f"MiB (+{after - before:.0f} MiB, {per_stream_kib:.0f} KiB a stream)"
    )


async def run(postgres_url: str) -> list[str]:
    url = new_database(postgres_url)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    lines = ["## WatchMemories", ""]
    async with (
        fake_openai() as model,
        server_process("services.transcript", url) as transcript_address,
    ):
        env = {
            **ENV,
            "TRANSCRIPT_SERVICE_ADDR": transcript_address,
            "RUNIFOLD_EMBEDDINGS_URL": model.base_url,
        }
        async with (
            server("services.memory", url, env) as (watching, watcher_pid),
            server("services.memory", url, env) as (writing, _),
            grpc.aio.insecure_channel(transcript_address) as to_transcript,
        ):
            cid = await seed_conversation(stubs.transcript(to_transcript), namespace, ["facts"])
            same = await delivery(watching, watching, namespace, cid, "one process")
            across = await delivery(writing, watching, namespace, cid, "two processes")
            idle_line = await idle_streams(watching, watcher_pid, IDLE)
    rows = [*same, *across]
    lines += [row.row() for row in rows]
    lines.append(idle_line)
    lines.append(
        "upsert-to-delivery p50: "
        + ", ".join(
            f"{row.name.split(', ', 1)[1]} {row.p50:.2f} ms"
            for row in rows
            if row.name.startswith("upsert to delivery")
        )
    )
    return lines
