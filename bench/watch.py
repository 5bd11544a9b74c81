"""WatchConversation benchmarks (issue 18).

1. Append-to-delivery latency: a writer appends one message at a time and a watcher
   follows the conversation; each latency runs from the moment AppendEntries is sent
   to the moment the watcher receives the entry. Measured with the writer and the
   watcher on one TranscriptService process, and on two processes (the write then
   reaches the watcher's process through PostgreSQL's NOTIFY), each with 1 and with
   1,000 watchers open on the watcher's process (999 of them idle, on other
   conversations). The AppendEntries round trip alone is printed beside it. Goal: p50
   under 5 ms.
2. The cost of 1,000 idle watchers on one process: its RSS before and after they
   open, and its CPU while they idle for 30 s (heartbeats every 30 s, the pulse every
   5 s). Goal: under 100 MiB and 2% of a core.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from pathlib import Path

import grpc

from bench.common import Stats, new_database, server
from bench.stats import rss_mib
from runifold.transcript.v1 import transcript_service_pb2 as pb
from runifold_client.policy import user
from services.common import stubs

IDLE = 1000
APPENDS = 300
# A multiple of the default heartbeat interval (30 s): each stream beats once in it.
IDLE_SECONDS = 30.0
ENV = {
    "RUNIFOLD_WATCH_MAX_WATCHERS": str(IDLE + 100),
    "RUNIFOLD_WATCH_MAX_WATCHERS_PER_NAMESPACE": str(IDLE + 100),
    "RUNIFOLD_MAX_CONCURRENT_RPCS": str(2 * IDLE + 200),
}


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _idle_cpu(pid: int) -> float:
    """The share of a core a process uses over IDLE_SECONDS while nobody calls it."""
    cpu_start, wall_start = _cpu_seconds(pid), time.perf_counter()
    await asyncio.sleep(IDLE_SECONDS)  # the idle period being measured
    return (_cpu_seconds(pid) - cpu_start) / (time.perf_counter() - wall_start)


async def _create(stub: object, namespace: str) -> str:
    reply = await stub.CreateConversation(  # type: ignore[attr-defined]
        pb.CreateConversationRequest(namespace=namespace)
    )
    return str(reply.conversation.conversation_id)


async def _idle_watchers(
    channel: grpc.aio.Channel, namespace: str, count: int
) -> list[grpc.aio.UnaryStreamCall[pb.WatchConversationRequest, pb.WatchConversationResponse]]:
    """`count` streams on conversations of their own, each past its first heartbeat."""
    stub = stubs.transcript(channel)
    calls = []
    for _ in range(count):
        cid = await _create(stub, namespace)
        call = stub.WatchConversation(
            pb.WatchConversationRequest(namespace=namespace, conversation_id=cid)
        )
        calls.append(call)
    for call in calls:
        await call.read()  # the heartbeat of an empty conversation: it is open
    return calls


async def delivery(
    writer_address: str, watcher_address: str, namespace: str, label: str
) -> tuple[Stats, Stats]:
    """Append-to-delivery latencies, and the AppendEntries round trips, of APPENDS appends."""
    async with (
        grpc.aio.insecure_channel(writer_address) as to_writer,
        grpc.aio.insecure_channel(watcher_address) as to_watcher,
    ):
        writer, watcher = stubs.transcript(to_writer), stubs.transcript(to_watcher)
        cid = await _create(writer, namespace)
        call = watcher.WatchConversation(
            pb.WatchConversationRequest(namespace=namespace, conversation_id=cid)
        )
        await call.read()  # caught up
        arrived: dict[int, float] = {}
        waiting: dict[int, asyncio.Event] = {}

        async def read() -> None:
            while (event := await call.read()) is not grpc.aio.EOF:
                assert isinstance(event, pb.WatchConversationResponse)
                for entry in event.appended.entries:
                    arrived[entry.sequence] = time.perf_counter()
                    if entry.sequence in waiting:
                        waiting[entry.sequence].set()

        reader = asyncio.create_task(read())
        deliveries: list[float] = []
        round_trips: list[float] = []
        message = user("benchmark message")
        start_all = time.perf_counter()
        try:
            for sequence in range(1, APPENDS + 1):
                waiting[sequence] = asyncio.Event()
                sent = time.perf_counter()
                await writer.AppendEntries(
                    pb.AppendEntriesRequest(
                        namespace=namespace, conversation_id=cid, messages=[message]
                    )
                )
                round_trips.append(time.perf_counter() - sent)
                await asyncio.wait_for(waiting[sequence].wait(), 30)
                deliveries.append(arrived[sequence] - sent)
        finally:
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await reader
        elapsed = time.perf_counter() - start_all
    return (
        Stats(f"append to delivery, {label}", deliveries, elapsed),
        Stats(f"AppendEntries round trip, {label}", round_trips, elapsed),
    )


async def run(postgres_url: str) -> list[str]:
    url = new_database(postgres_url)
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    lines = ["## WatchConversation", ""]
    async with (
        server("services.transcript", url, ENV) as (watching, watcher_pid),
        server("services.transcript", url, ENV) as (writing, _),
    ):
        rows: list[Stats] = []
        for watchers in (1, IDLE):
            async with contextlib.AsyncExitStack() as stack:
                if watchers > 1:
                    channel = await stack.enter_async_context(grpc.aio.insecure_channel(watching))
                    before_mib = rss_mib(watcher_pid) or 0.0
                    baseline = await _idle_cpu(watcher_pid)
                    calls = await _idle_watchers(channel, namespace, watchers - 1)
                    await asyncio.sleep(2.0)  # let the opening settle before measuring
                    after_mib = rss_mib(watcher_pid) or 0.0
                    cpu = await _idle_cpu(watcher_pid)
                    idle_line = (
                        f"{len(calls)} idle watchers on one process: RSS {before_mib:.0f} -> "
                        f"{after_mib:.0f} MiB (+{after_mib - before_mib:.0f} MiB); its CPU "
                        f"while idle {baseline * 100:.1f}% of a core without them, "
                        f"{cpu * 100:.1f}% with them (+{(cpu - baseline) * 100:.1f}%)  "
                        "(goal: under 100 MiB and 2%)"
                    )
                same = await delivery(
                    watching, watching, namespace, f"one process, {watchers} open"
                )
                across = await delivery(
                    writing, watching, namespace, f"two processes, {watchers} open"
                )
                rows += [*same, *across]
                if watchers > 1:
                    for call in calls:
                        call.cancel()
    lines += [row.row() for row in rows]
    lines.append(idle_line)
    delivered = [row for row in rows if row.name.startswith("append to delivery")]
    lines.append(
        "append-to-delivery p50: "
        + ", ".join(f"{row.name.split(', ', 1)[1]} {row.p50:.2f} ms" for row in delivered)
        + "  (goal: under 5 ms)"
    )
    return lines
