"""WatchMemories through a real gRPC server (MemoryService with TranscriptService for the
source checks) on real PostgreSQL: every kind of change once and in order, replay and
resume, expiry, erasure, namespaces, invalid requests, limits, shutdown, heartbeats, and
the Python client's resume across a restart.

Across processes (writers on one replica, the watcher on another):
tests/memory/watch/test_watch_replicas.py; memory under unread streams:
tests/memory/watch/test_watch_memory.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2
from google.rpc import error_details_pb2

from runifold.memory.v1 import memory_service_pb2 as pb
from services.common import stubs
from services.common.server import RunningServer
from services.common.settings import Settings
from services.memory.component import MemoryComponent
from services.memory.config import MemoryConfig, WatchLimits
from tests.memory.support import BruteForceIndex, HashEmbedder, memory_config, memory_server
from tests.memory.watch.support import Watcher, check_exactly_once_in_order, conversation, source
from tests.support.grpc_calls import status_detail
from tests.support.settings import server_settings
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from runifold.memory.v1.memory_service_pb2_grpc import MemoryServiceAsyncStub
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub


@dataclass
class Server:
    """A server's stubs, and the MemoryComponent it hosts."""

    memory: MemoryServiceAsyncStub
    transcript: TranscriptServiceAsyncStub
    running: RunningServer
    component: MemoryComponent

    async def upsert(self, namespace: str, content: str, cid: str, **fields: Any) -> pb.Memory:
        sources = fields.pop("sources", None) or [source(cid)]
        reply = await self.memory.UpsertMemory(
            pb.UpsertMemoryRequest(namespace=namespace, content=content, sources=sources, **fields)
        )
        return reply.memory

    def watch(self, namespace: str, after: int = 0, **fields: Any) -> Watcher:
        return Watcher(
            self.memory,
            pb.WatchMemoriesRequest(namespace=namespace, after_change_sequence=after, **fields),
        )


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


def _config(tmp_path: Path, sweep_interval_s: float = 0.1, **watch: float) -> MemoryConfig:
    return memory_config(
        tmp_path,
        sweep_interval_s=sweep_interval_s,
        watch=replace(WatchLimits(), **watch),  # type: ignore[arg-type]
    )


@contextlib.asynccontextmanager
async def _server(
    database_url: str, config: MemoryConfig, settings: Settings | None = None
) -> AsyncIterator[Server]:
    async with (
        memory_server(
            database_url,
            config,
            index=BruteForceIndex(HashEmbedder.dimension),
            embedder=HashEmbedder(),
            settings=settings,
        ) as (running, component),
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        yield Server(stubs.memory(channel), stubs.transcript(channel), running, component)


@pytest.fixture
async def server(shared_database_url: str, tmp_path: Path) -> AsyncIterator[Server]:
    async with _server(shared_database_url, _config(tmp_path)) as running:
        yield running


async def test_every_kind_of_change_is_delivered_once_in_order_with_its_memory(
    server: Server, namespace: str
) -> None:
    cid = await conversation(server.transcript, namespace)
    a = await server.upsert(namespace, "The user likes tea.", cid)
    a2 = await server.upsert(
        namespace, "The user likes green tea.", cid, memory_id=a.memory_id, expected_revision=1
    )
    # The replay, then a heartbeat that says where it stands.
    watcher = await server.watch(namespace).caught_up()
    assert watcher.kinds() == [(a.memory_id, "created", 1), (a.memory_id, "updated", 2)]
    assert [c.memory.content for c in watcher.changes()] == [
        "The user likes tea.",
        "The user likes green tea.",
    ]
    assert watcher.heartbeats()[0].change_sequence == 2

    # Live: a supersession, a deletion, a deletion that reopens what it superseded, an
    # erasure with its source, an expiry.
    b = await server.upsert(namespace, "The user lives in Lyon.", cid)
    c_reply = await server.memory.UpsertMemory(
        pb.UpsertMemoryRequest(
            namespace=namespace,
            content="The user lives in Paris.",
            sources=[source(cid, 2, 2)],
            valid_from_time=_now(),
            supersedes=[pb.SupersededMemory(memory_id=b.memory_id)],
        )
    )
    c = c_reply.memory
    await server.memory.DeleteMemory(
        pb.DeleteMemoryRequest(namespace=namespace, memory_id=a.memory_id)
    )
    await server.memory.DeleteMemory(
        pb.DeleteMemoryRequest(namespace=namespace, memory_id=c.memory_id)
    )
    d = await server.upsert(
        namespace, "The user's sister is Ana.", cid, sources=[source(cid, 3, 3)]
    )
    forgot = await server.memory.ForgetSource(
        pb.ForgetSourceRequest(
            namespace=namespace, conversation_id=cid, from_sequence=3, through_sequence=3
        )
    )
    assert forgot.deleted_count == 1
    e = await server.upsert(
        namespace, "The user is at the airport.", cid, ttl=duration_pb2.Duration(seconds=1)
    )
    await watcher.until(lambda w: (e.memory_id, "expired", 2) in w.kinds())

    assert watcher.kinds() == [
        (a.memory_id, "created", 1),
        (a.memory_id, "updated", 2),
        (b.memory_id, "created", 1),
        # The new memory first, then the one it superseded (one transaction).
        (c.memory_id, "created", 1),
        (b.memory_id, "superseded", 2),
        (a.memory_id, "deleted", 3),
        (c.memory_id, "deleted", 2),
        # Its successor deleted: its validity is open again.
        (b.memory_id, "updated", 3),
        (d.memory_id, "created", 1),
        (d.memory_id, "erased", 2),
        (e.memory_id, "created", 1),
        (e.memory_id, "expired", 2),
    ]
    check_exactly_once_in_order(watcher.sequences(), 0, 12)
    changes = {(c.memory_id, c.revision): c for c in watcher.changes()}
    superseded = changes[(b.memory_id, 2)].memory
    assert superseded.superseded_by == c.memory_id and superseded.HasField("valid_until_time")
    reopened = changes[(b.memory_id, 3)].memory
    assert not reopened.superseded_by and not reopened.HasField("valid_until_time")
    # Memories that left carry no content; the others, the memory as of that revision.
    for change in watcher.changes():
        removal = change.kind in (
            pb.MEMORY_EVENT_KIND_DELETED,
            pb.MEMORY_EVENT_KIND_EXPIRED,
            pb.MEMORY_EVENT_KIND_ERASED,
        )
        assert change.HasField("memory") != removal, change
        if not removal:
            assert change.memory.revision == change.revision
            assert change.memory.memory_id == change.memory_id
            assert change.memory.namespace == namespace
    assert changes[(a.memory_id, 2)].memory == a2

    # Nothing more comes, and a heartbeat says the stream stands at the last change.
    await watcher.close()
    again = await server.watch(namespace, after=12).caught_up()
    assert again.changes() == [] and again.heartbeats()[0].change_sequence == 12
    await again.close()


async def test_a_stream_resumed_from_the_middle_sees_the_rest_exactly_once(
    server: Server, namespace: str
) -> None:
    cid = await conversation(server.transcript, namespace)
    made = [await server.upsert(namespace, f"Fact {i}.", cid) for i in range(6)]
    first = await server.watch(namespace).caught_up()
    check_exactly_once_in_order(first.sequences(), 0, 6)
    await first.close()

    resumed = await server.watch(namespace, after=3).caught_up()
    check_exactly_once_in_order(resumed.sequences(), 3, 6)
    assert [c.memory_id for c in resumed.changes()] == [m.memory_id for m in made[3:]]
    for i in range(2):
        await server.upsert(namespace, f"Later fact {i}.", cid)
    await resumed.until_sequence(8)
    check_exactly_once_in_order(resumed.sequences(), 3, 8)
    await resumed.close()

    # A change of a memory erased since is replayed without its content: the erasure
    # took the content of the memory's whole history.
    await server.memory.ForgetSource(
        pb.ForgetSourceRequest(namespace=namespace, conversation_id=cid)
    )
    replay = await server.watch(namespace).caught_up()
    check_exactly_once_in_order(replay.sequences(), 0, 16)
    assert [kind for _, kind, _ in replay.kinds()] == ["created"] * 8 + ["erased"] * 8
    assert not any(c.HasField("memory") for c in replay.changes())
    await replay.close()


async def test_a_long_replay_comes_in_pages_each_change_once(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    async with _server(shared_database_url, _config(tmp_path, page_changes=3)) as server:
        cid = await conversation(server.transcript, namespace)
        for i in range(10):
            await server.upsert(namespace, f"Fact {i}.", cid)
        watcher = await server.watch(namespace, after=1).caught_up()
        check_exactly_once_in_order(watcher.sequences(), 1, 10)
        assert watcher.heartbeats()[0].change_sequence == 10
        await watcher.close()


async def test_an_expiry_is_one_change_whether_the_sweeper_or_a_new_create_removes_it(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    # The sweeper runs at the start only: what removes the lapsed memory is the create.
    async with _server(shared_database_url, _config(tmp_path, sweep_interval_s=3600)) as server:
        cid = await conversation(server.transcript, namespace)
        lapsing = await server.upsert(
            namespace, "The user waits at gate 4.", cid, ttl=duration_pb2.Duration(seconds=1)
        )
        watcher = await server.watch(namespace).caught_up()

        async def lapsed() -> bool:
            try:
                await server.memory.GetMemory(
                    pb.GetMemoryRequest(namespace=namespace, memory_id=lapsing.memory_id)
                )
            except grpc.aio.AioRpcError as error:
                return error.code() == grpc.StatusCode.NOT_FOUND
            return False

        # Reads that find it lapsed write nothing: no change.
        await wait_for(lapsed, timeout=10, interval=0.1)
        listed = await server.memory.ListMemories(pb.ListMemoriesRequest(namespace=namespace))
        assert list(listed.memories) == []
        again = await server.upsert(
            namespace, "The user waits at gate 9.", cid, memory_id=lapsing.memory_id
        )
        await watcher.until_sequence(3)
        assert watcher.kinds() == [
            (lapsing.memory_id, "created", 1),
            (lapsing.memory_id, "expired", 2),
            (lapsing.memory_id, "created", 3),
        ]
        assert again.revision == 3
        await watcher.close()


async def test_another_namespaces_stream_sees_nothing_of_this_one(
    server: Server, namespace: str
) -> None:
    other = f"{namespace}-other"
    cid = await conversation(server.transcript, namespace)
    theirs = await server.watch(other).caught_up()
    mine = await server.watch(namespace).caught_up()
    for i in range(3):
        await server.upsert(namespace, f"Fact {i}.", cid)
    await server.memory.ForgetSource(
        pb.ForgetSourceRequest(namespace=namespace, conversation_id=cid)
    )
    await mine.until_sequence(6)
    # A change of its own after them: had the other's changes reached it, they would be
    # before this one.
    other_cid = await conversation(server.transcript, other)
    own = await server.upsert(other, "Their fact.", other_cid)
    await theirs.until_sequence(1)
    assert theirs.kinds() == [(own.memory_id, "created", 1)]
    assert [h.change_sequence for h in theirs.heartbeats()] == [0]
    # Each namespace counts its own changes.
    check_exactly_once_in_order(mine.sequences(), 0, 6)
    for watcher in (mine, theirs):
        await watcher.close()


@pytest.mark.parametrize(
    ("fields", "reason", "field"),
    [
        ({"after_change_sequence": -1}, "INVALID_SEQUENCE", "after_change_sequence"),
        ({"after_change_sequence": 5}, "SEQUENCE_OUT_OF_RANGE", "after_change_sequence"),
        (
            {"heartbeat_interval": duration_pb2.Duration(nanos=500_000_000)},
            "INVALID_HEARTBEAT_INTERVAL",
            "heartbeat_interval",
        ),
        ({"namespace": "not a namespace"}, "INVALID_NAMESPACE", "namespace"),
    ],
)
async def test_invalid_requests_are_refused_with_the_field(
    server: Server, namespace: str, fields: dict[str, Any], reason: str, field: str
) -> None:
    request = pb.WatchMemoriesRequest(namespace=namespace)
    for name, value in fields.items():
        if isinstance(value, duration_pb2.Duration):
            getattr(request, name).CopyFrom(value)
        else:
            setattr(request, name, value)
    watcher = Watcher(server.memory, request)
    await watcher.until_ended()
    assert watcher.error is not None
    assert watcher.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert watcher.reason() == reason
    violation = status_detail(watcher.error, error_details_pb2.BadRequest).field_violations[0]
    assert violation.field == field


async def test_watchers_beyond_the_limits_are_refused_with_a_retry_delay(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    config = _config(tmp_path, max_watchers=3, max_watchers_per_namespace=2, retry_after_s=7.0)
    async with _server(shared_database_url, config) as server:

        async def open_one(ns: str) -> Watcher:
            watcher = server.watch(ns)
            await watcher.until(lambda w: bool(w.heartbeats()) or w.ended)
            return watcher

        def refused(watcher: Watcher, scope: str, limit: int) -> None:
            assert watcher.error is not None, watcher.kinds()
            assert watcher.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert watcher.reason() == "WATCHER_LIMIT"
            delay = status_detail(watcher.error, error_details_pb2.RetryInfo).retry_delay
            assert delay.ToTimedelta() == timedelta(seconds=7)

        open_ = [await open_one(namespace), await open_one(namespace)]
        assert all(not w.ended for w in open_)
        refused(await open_one(namespace), "namespace", 2)
        open_.append(await open_one(f"{namespace}-b"))
        assert not open_[-1].ended
        refused(await open_one(f"{namespace}-c"), "process", 3)
        # A stream that ends gives its place back.
        await open_[0].close()
        again = await open_one(namespace)
        try:
            assert not again.ended and again.heartbeats()
        finally:
            for watcher in [*open_[1:], again]:
                await watcher.close()


async def test_a_quiet_stream_gets_heartbeats_with_the_last_change(
    server: Server, namespace: str
) -> None:
    cid = await conversation(server.transcript, namespace)
    await server.upsert(namespace, "A fact.", cid)
    watcher = server.watch(namespace, heartbeat_interval=duration_pb2.Duration(seconds=1))
    await watcher.until(lambda w: len(w.heartbeats()) >= 3, timeout=20)
    assert {h.change_sequence for h in watcher.heartbeats()} == {1}
    times = [h.read_time.ToDatetime() for h in watcher.heartbeats()]
    assert times == sorted(times)
    await watcher.close()


async def test_shutdown_ends_streams_with_a_status_clients_resume_from(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    settings = server_settings(RUNIFOLD_SHUTDOWN_GRACE_S="30")
    async with _server(shared_database_url, _config(tmp_path), settings) as server:
        watcher = await server.watch(namespace).caught_up()
        stopping = asyncio.create_task(server.running.stop(grace=30))
        await watcher.until_ended()
        assert watcher.error is not None
        assert watcher.error.code() == grpc.StatusCode.UNAVAILABLE
        assert watcher.reason() == "SERVER_SHUTTING_DOWN"
        await stopping


async def test_the_python_client_resumes_across_a_server_restart(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    from runifold_client import AsyncClient

    # Writes go through another replica, which stays up throughout.
    async with _server(shared_database_url, _config(tmp_path / "writer")) as writing:
        writer = AsyncClient(writing.running.address, namespace=namespace)
        cid = await conversation(writing.transcript, namespace)
        for i in range(2):
            await writer.upsert_memory(f"Fact {i}.", sources=[source(cid)])
        events: list[pb.WatchMemoriesResponse] = []

        def sequences() -> list[int]:
            return [e.change.change_sequence for e in events if e.WhichOneof("event") == "change"]

        async with _server(shared_database_url, _config(tmp_path / "first")) as first:
            port = first.running.port
            watcher = AsyncClient(f"127.0.0.1:{port}", namespace=namespace)

            async def follow() -> None:
                async for event in watcher.watch_memories(heartbeat_interval=1.0):
                    events.append(event)

            following = asyncio.create_task(follow())

            async def delivered(last: int) -> bool:
                return last in sequences() or following.done()

            await wait_for(lambda: delivered(2), timeout=30, interval=0.01)
            # The watching replica goes away (SERVER_SHUTTING_DOWN); writes go on.
        for i in range(2, 4):
            await writer.upsert_memory(f"Fact {i}.", sources=[source(cid)])
        # The same port again: the client's next attempt finds a server there.
        restarted = server_settings(RUNIFOLD_LISTEN=f"127.0.0.1:{port}")
        async with _server(shared_database_url, _config(tmp_path / "second"), restarted):
            await writer.upsert_memory("Fact 4.", sources=[source(cid)])
            await wait_for(lambda: delivered(5), timeout=60, interval=0.05)
            assert not following.done(), following
            check_exactly_once_in_order(sequences(), 0, 5)
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        await watcher.close()
        await writer.close()
