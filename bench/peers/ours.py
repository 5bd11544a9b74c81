"""Runifold in the peer benchmark, through gRPC, with the same workloads as the peers.

Conversations: TranscriptService alone (`python -m services.transcript`, its own
process). An append is AppendEntries of one message with compare-and-swap
(`expected_version`) and a `request_id`; the fill appends 250 messages a call
(the service's limit per append). "Last 16" is one LoadView with window 16 and
`summarized_through` just before the window (the one call an agent makes to load
its context); "all" pages through ListEntries, 1,000 entries a page.

Search: the all-in-one server (`python -m services`) with its defaults: the
embedded Qdrant Edge index and the local all-MiniLM-L6-v2 model, which embeds
the query inside SearchMemories. Facts are written with UpsertMemory (8 in
flight), each citing an entry of a source conversation of its tenant; the index
catches up through the outbox, and ingest ends when the outbox is empty.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import psycopg

from bench.common import outbox_drained, seed_conversation, server_process
from bench.peers.workload import (
    Event,
    exact_answers,
    load_model,
    run_conversations,
    run_search,
    tables_bytes,
)
from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs

NAMESPACE = "bench-peers"
_ROLE = {"user": common_pb2.ROLE_USER, "assistant": common_pb2.ROLE_ASSISTANT}


@dataclass
class Handle:
    conversation_id: str
    version: int = 0
    last_sequence: int = 0


def _message(event: Event) -> common_pb2.Message:
    return common_pb2.Message(role=_ROLE[event.role], text=event.text)


class OurConversations:
    name = "Runifold TranscriptService (gRPC)"

    def __init__(self, channel: grpc.aio.Channel, url: str) -> None:
        self.stub = stubs.transcript(channel)
        self.url = url

    async def create(self, index: int) -> Handle:
        created = await self.stub.CreateConversation(
            pb.CreateConversationRequest(namespace=NAMESPACE)
        )
        return Handle(created.conversation.conversation_id)

    async def _append(self, handle: Handle, events: Sequence[Event]) -> None:
        reply = await self.stub.AppendEntries(
            pb.AppendEntriesRequest(
                namespace=NAMESPACE,
                conversation_id=handle.conversation_id,
                expected_version=handle.version,
                request_id=str(uuid.uuid4()),
                messages=[_message(e) for e in events],
            )
        )
        handle.version, handle.last_sequence = reply.version, reply.last_sequence

    async def fill(self, handle: Handle, events: Sequence[Event]) -> None:
        for low in range(0, len(events), 250):
            await self._append(handle, events[low : low + 250])

    async def append(self, handle: Handle, event: Event) -> None:
        await self._append(handle, [event])

    async def load_last(self, handle: Handle, count: int) -> list[str]:
        view = await self.stub.LoadView(
            pb.LoadViewRequest(
                namespace=NAMESPACE,
                conversation_id=handle.conversation_id,
                window=count,
                summary_batch=1,
                summarized_through=max(0, handle.last_sequence - count),
            )
        )
        return [e.message.text for e in view.window]

    async def load_all(self, handle: Handle) -> list[str]:
        texts: list[str] = []
        token = ""
        while True:
            page = await self.stub.ListEntries(
                pb.ListEntriesRequest(
                    namespace=NAMESPACE,
                    conversation_id=handle.conversation_id,
                    page_size=1000,
                    page_token=token,
                )
            )
            texts += [e.message.text for e in page.entries]
            token = page.next_page_token
            if not token:
                return texts

    async def storage_bytes(self) -> int:
        return await tables_bytes(self.url, ["transcript"])


class OurSearch:
    name = "Runifold SearchMemories (gRPC, Qdrant Edge)"

    def __init__(self, channel: grpc.aio.Channel, url: str) -> None:
        self.memory = stubs.memory(channel)
        self.transcript = stubs.transcript(channel)
        self.url = url

    async def ingest(self, namespace: int, texts: Sequence[str]) -> None:
        tenant = f"tenant-{namespace}"
        source = await seed_conversation(self.transcript, tenant, ["the notes"])

        async def writer(part: Sequence[str]) -> None:
            for text in part:
                await self.memory.UpsertMemory(
                    memory_pb.UpsertMemoryRequest(
                        namespace=tenant,
                        content=text,
                        sources=[
                            memory_pb.MemorySource(
                                conversation_id=source, from_sequence=1, through_sequence=1
                            )
                        ],
                    ),
                    timeout=60,
                )

        await asyncio.gather(*(writer(texts[w::8]) for w in range(8)))

    async def ready(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await outbox_drained(conn, interval=0.2)

    async def search(self, namespace: int, query: str) -> list[str]:
        found = await self.memory.SearchMemories(
            memory_pb.SearchMemoriesRequest(namespace=f"tenant-{namespace}", query=query, limit=5),
            timeout=60,
        )
        if found.degraded:
            raise AssertionError("search degraded: the index is not serving")
        return [r.memory.content for r in found.results]


async def conversations(url: str, sizes: Sequence[int]) -> dict[str, Any]:
    env = {"RUNIFOLD_DB_POOL_MIN": "4", "RUNIFOLD_DB_POOL_MAX": "16"}
    async with (
        server_process("services.transcript", url, env) as address,
        grpc.aio.insecure_channel(address) as channel,
    ):
        return await run_conversations(OurConversations(channel, url), sizes)


async def search(url: str) -> dict[str, Any]:
    started = time.perf_counter()
    exact = exact_answers(load_model(threads=1))
    print(f"exact answers in {time.perf_counter() - started:.1f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="runifold-bench-peers-") as data:
        env = {"RUNIFOLD_DATA_DIR": data, "RUNIFOLD_SUMMARY_WORKERS": "0"}
        async with (
            server_process("services", url, env) as address,
            grpc.aio.insecure_channel(address) as channel,
        ):
            return await run_search(OurSearch(channel, url), exact)
