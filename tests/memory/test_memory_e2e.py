"""MemoryService through a real gRPC server (with TranscriptService for source checks),
real PostgreSQL, the real embedding model and the Qdrant Edge engine."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
import qdrant_edge as qe
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2

from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as pb
from runifold.transcript.v1 import transcript_service_pb2 as tpb
from services.common import stubs
from services.common.postgres.pool import Database
from services.common.server import RunningServer
from services.common.status import error_info
from services.memory.component import MemoryComponent
from services.memory.index.edge import EdgeIndex
from services.memory.index.model import IndexPoint
from services.memory.index.qdrant.adapter import QdrantIndex
from services.memory.store import PostgresMemoryStore
from tests.memory.support import memory_config, memory_server, outbox_drained
from tests.support.grpc_calls import reason
from tests.support.settings import server_settings
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from runifold.memory.v1.memory_service_pb2_grpc import MemoryServiceAsyncStub
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub


class Client:
    """Stubs of one server and the helpers the tests share."""

    def __init__(self, channel: grpc.aio.Channel, component: MemoryComponent) -> None:
        self.memory: MemoryServiceAsyncStub = stubs.memory(channel)
        self.transcript: TranscriptServiceAsyncStub = stubs.transcript(channel)
        self.health = stubs.health(channel)
        self.component = component

    async def conversation(self, namespace: str, entries: int = 4) -> str:
        created = await self.transcript.CreateConversation(
            tpb.CreateConversationRequest(namespace=namespace)
        )
        cid = created.conversation.conversation_id
        await self.transcript.AppendEntries(
            tpb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=cid,
                messages=[
                    common_pb2.Message(role=common_pb2.ROLE_USER, text=f"message {i}")
                    for i in range(entries)
                ],
            )
        )
        return cid

    async def upsert(
        self, namespace: str, content: str, cid: str, **fields: Any
    ) -> pb.UpsertMemoryResponse:
        sources = fields.pop("sources", None) or [
            pb.MemorySource(conversation_id=cid, from_sequence=1, through_sequence=2)
        ]
        return await self.memory.UpsertMemory(
            pb.UpsertMemoryRequest(namespace=namespace, content=content, sources=sources, **fields)
        )

    async def search(self, namespace: str, query: str, limit: int = 5, **fields: Any) -> Any:
        return await self.memory.SearchMemories(
            pb.SearchMemoriesRequest(namespace=namespace, query=query, limit=limit, **fields)
        )

    async def drained(self) -> bool:
        return await outbox_drained(self.component)

    async def index_keys(self) -> set[tuple[str, uuid.UUID]]:
        assert self.component.index is not None
        return await self.component.index.keys()


@pytest.fixture
async def served(
    shared_database_url: str, tmp_path: Path
) -> AsyncIterator[tuple[RunningServer, Client]]:
    config = memory_config(tmp_path)
    async with (
        memory_server(shared_database_url, config) as (running, comp),
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        yield running, Client(channel, comp)


@pytest.fixture
def client(served: tuple[RunningServer, Client]) -> Client:
    return served[1]


async def test_upsert_get_search_roundtrip(client: Client, namespace: str) -> None:
    cid = await client.conversation(namespace)
    made = await client.upsert(
        namespace, "The user's dog is called Biscuit.", cid, metadata={"kind": "pet"}
    )
    memory = made.memory
    assert made.created and memory.revision == 1 and memory.namespace == namespace
    assert memory.embedding_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert memory.embedding_dimension == 384
    got = await client.memory.GetMemory(
        pb.GetMemoryRequest(namespace=namespace, memory_id=memory.memory_id)
    )
    assert got.memory == memory
    await wait_for(client.drained)
    found = await client.search(namespace, "what is the name of my pet?")
    assert not found.degraded
    assert [r.memory.memory_id for r in found.results] == [memory.memory_id]
    assert 0.2 < found.results[0].score <= 1.0
    # min_score and the metadata filter narrow the same search.
    none = await client.search(namespace, "what is the name of my pet?", min_score=0.99)
    assert list(none.results) == []
    other = await client.search(namespace, "pet name", metadata_filter={"kind": "food"})
    assert list(other.results) == []


async def test_correction_is_a_new_revision_and_search_sees_only_it(
    client: Client, namespace: str
) -> None:
    cid = await client.conversation(namespace)
    first = (await client.upsert(namespace, "The user lives in Lisbon.", cid)).memory
    second = (
        await client.upsert(
            namespace,
            "The user moved to Oslo in March.",
            cid,
            memory_id=first.memory_id,
            expected_revision=1,
        )
    ).memory
    assert second.revision == 2 and second.create_time == first.create_time
    await wait_for(client.drained)
    found = await client.search(namespace, "where does the user live?")
    assert [(r.memory.content, r.memory.revision) for r in found.results] == [
        ("The user moved to Oslo in March.", 2)
    ]
    assert client.component.store is not None
    history = await client.component.store.history(namespace, uuid.UUID(first.memory_id))
    assert [(h.revision, h.kind, h.content) for h in history] == [
        (1, "write", "The user lives in Lisbon."),
        (2, "write", "The user moved to Oslo in March."),
    ]


async def test_two_writers_at_one_revision_exactly_one_wins(client: Client, namespace: str) -> None:
    cid = await client.conversation(namespace)
    memory = (await client.upsert(namespace, "Favourite colour: green.", cid)).memory

    async def write(i: int) -> Any:
        try:
            return await client.upsert(
                namespace,
                f"Favourite colour: shade {i}.",
                cid,
                memory_id=memory.memory_id,
                expected_revision=1,
            )
        except grpc.aio.AioRpcError as error:
            return error

    results = await asyncio.gather(*(write(i) for i in range(8)))
    wins = [r for r in results if isinstance(r, pb.UpsertMemoryResponse)]
    losses = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(wins) == 1 and len(losses) == 7
    assert wins[0].memory.revision == 2
    for loss in losses:
        assert loss.code() == grpc.StatusCode.ABORTED
        info = error_info(loss)
        assert info is not None and info.reason == "REVISION_CONFLICT"
        assert info.metadata["current_revision"] == "2"
    got = await client.memory.GetMemory(
        pb.GetMemoryRequest(namespace=namespace, memory_id=memory.memory_id)
    )
    assert got.memory.content == wins[0].memory.content and got.memory.revision == 2
    # A second create with the same id is ALREADY_EXISTS.
    with pytest.raises(grpc.aio.AioRpcError) as exists:
        await client.upsert(namespace, "again", cid, memory_id=memory.memory_id)
    assert exists.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert reason(exists.value) == "MEMORY_ALREADY_EXISTS"


async def test_two_namespaces_with_identical_content_never_see_each_other(
    client: Client, namespace: str
) -> None:
    ns_a, ns_b = f"{namespace}-a", f"{namespace}-b"
    facts = [
        "The user is allergic to peanuts.",
        "The user's manager is called Priya.",
        "The user prefers tea over coffee.",
    ]
    ids: dict[str, list[str]] = {}
    shared_id = str(uuid.uuid4())
    for ns in (ns_a, ns_b):
        cid = await client.conversation(ns)
        ids[ns] = [(await client.upsert(ns, fact, cid)).memory.memory_id for fact in facts]
        # The same memory id in both namespaces: two unrelated memories.
        ids[ns].append(
            (await client.upsert(ns, "Shared id fact.", cid, memory_id=shared_id)).memory.memory_id
        )
    await wait_for(client.drained)
    for ns, other in ((ns_a, ns_b), (ns_b, ns_a)):
        own = set(ids[ns])
        for query in ("food allergy", "who is the boss", "favourite drink", "shared id"):
            found = await client.search(ns, query, limit=256)
            assert {r.memory.memory_id for r in found.results} <= own
            assert all(r.memory.namespace == ns for r in found.results)
        listed = await client.memory.ListMemories(pb.ListMemoriesRequest(namespace=ns))
        assert {m.memory_id for m in listed.memories} == own
        for memory_id in set(ids[other]) - {shared_id}:
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await client.memory.GetMemory(
                    pb.GetMemoryRequest(namespace=ns, memory_id=memory_id)
                )
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
            assert reason(missing.value) == "MEMORY_NOT_FOUND"
            gone = await client.memory.DeleteMemory(
                pb.DeleteMemoryRequest(namespace=ns, memory_id=memory_id)
            )
            assert not gone.deleted
    # Deleting the shared id in one namespace leaves the other's untouched.
    deleted = await client.memory.DeleteMemory(
        pb.DeleteMemoryRequest(namespace=ns_a, memory_id=shared_id)
    )
    assert deleted.deleted
    kept = await client.memory.GetMemory(pb.GetMemoryRequest(namespace=ns_b, memory_id=shared_id))
    assert kept.memory.content == "Shared id fact."
    # The other namespace's memories all survived the attempts.
    listed_b = await client.memory.ListMemories(pb.ListMemoriesRequest(namespace=ns_b))
    assert len(listed_b.memories) == len(facts) + 1


async def test_deleted_memory_never_returned_while_the_indexer_is_stopped(
    client: Client, namespace: str
) -> None:
    cid = await client.conversation(namespace)
    memory = (await client.upsert(namespace, "The user's locker code is 4417.", cid)).memory
    await wait_for(client.drained)
    assert client.component.indexer is not None
    await client.component.indexer.stop()
    try:
        deleted = await client.memory.DeleteMemory(
            pb.DeleteMemoryRequest(namespace=namespace, memory_id=memory.memory_id)
        )
        assert deleted.deleted
        # The index still holds the point: the search must drop it on re-read.
        assert (namespace, uuid.UUID(memory.memory_id)) in await client.index_keys()
        found = await client.search(namespace, "what is the locker code?")
        assert not found.degraded and list(found.results) == []
        assert not await client.drained()
    finally:
        client.component.indexer.start()
    await wait_for(client.drained)
    assert (namespace, uuid.UUID(memory.memory_id)) not in await client.index_keys()
    assert client.component.store is not None
    history = await client.component.store.history(namespace, uuid.UUID(memory.memory_id))
    assert [(h.kind, h.content) for h in history] == [("write", None), ("delete", None)]


async def test_index_outage_degrades_search_then_the_outbox_catches_up(
    client: Client, namespace: str, shared_database_url: str
) -> None:
    cid = await client.conversation(namespace)
    before = (await client.upsert(namespace, "The user plays the cello.", cid)).memory
    await wait_for(client.drained)
    index = client.component.index
    assert isinstance(index, EdgeIndex)
    # A real outage: close the shard and hold its lock, as another process would;
    # every attempt to reopen it now fails. The indexer reopens a closed index on
    # its next poll, so it pauses while the lock changes hands (else it can win it).
    assert client.component.indexer is not None
    await client.component.indexer.stop()
    await index.close()
    holder = await asyncio.to_thread(qe.EdgeShard.load, str(index.path))
    client.component.indexer.start()
    try:
        written = [
            (await client.upsert(namespace, f"The user owns {n} bicycles.", cid)).memory
            for n in range(3)
        ]
        await client.memory.DeleteMemory(
            pb.DeleteMemoryRequest(namespace=namespace, memory_id=before.memory_id)
        )
        found = await client.search(namespace, "bicycles")
        assert found.degraded
        assert {r.memory.memory_id for r in found.results} == {m.memory_id for m in written}
        assert not await client.drained()
        # Health stays SERVING: the service degrades, it does not stop.
        reply = await client.health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await asyncio.to_thread(holder.close)
    await wait_for(client.drained, timeout=20)
    found = await client.search(namespace, "how many bicycles does the user own?")
    assert not found.degraded and len(found.results) == 3
    db = Database(shared_database_url, server_settings())
    await db.open()
    try:
        store = PostgresMemoryStore(db)
        in_postgres = {
            (m.namespace, m.memory_id)
            for m in await store.scan(None, 1_000_000)
            if m.namespace == namespace
        }
    finally:
        await db.close()
    # This server's shard holds this test's namespace only (other tests share the database).
    assert len(in_postgres) == 3
    assert await client.index_keys() == in_postgres


async def test_qdrant_server_unreachable_upserts_succeed_and_search_degrades(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    # A Qdrant server adapter pointed at a closed port: nothing listens there.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    index = QdrantIndex(
        "sentence-transformers/all-MiniLM-L6-v2", 384, url=f"http://127.0.0.1:{port}"
    )
    async with (
        memory_server(shared_database_url, memory_config(tmp_path), index=index) as (
            running,
            component,
        ),
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        client = Client(channel, component)
        cid = await client.conversation(namespace)
        made = await client.upsert(namespace, "The user's car is a red Volvo.", cid)
        assert made.created
        found = await client.search(namespace, "what car does the user drive?")
        assert found.degraded
        assert [r.memory.memory_id for r in found.results] == [made.memory.memory_id]
        assert not await client.drained()
        # Leave nothing behind in the shared database's outbox.
        await client.memory.DeleteMemory(
            pb.DeleteMemoryRequest(namespace=namespace, memory_id=made.memory.memory_id)
        )
    db = Database(shared_database_url, server_settings())
    await db.open()
    try:
        async with db.connection() as conn:
            await conn.execute("DELETE FROM memory.outbox WHERE namespace = %s", (namespace,))
    finally:
        await db.close()


async def test_bad_input_is_rejected_with_a_reason_and_writes_nothing(
    client: Client, namespace: str
) -> None:
    cid = await client.conversation(namespace, entries=4)
    elsewhere = await client.conversation(f"{namespace}-other", entries=4)

    def source(conversation: str, low: int, high: int) -> list[pb.MemorySource]:
        return [
            pb.MemorySource(conversation_id=conversation, from_sequence=low, through_sequence=high)
        ]

    cases: list[tuple[dict[str, Any], grpc.StatusCode, str]] = [
        ({"content": ""}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CONTENT"),
        ({"content": "   "}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CONTENT"),
        ({"content": "x" * (16 * 1024 + 1)}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CONTENT"),
        ({"sources": []}, grpc.StatusCode.INVALID_ARGUMENT, "NO_SOURCES"),
        ({"sources": source(cid, 3, 2)}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SOURCE_RANGE"),
        ({"sources": source(cid, 0, 2)}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SOURCE_RANGE"),
        ({"sources": source(cid, 2, 5)}, grpc.StatusCode.INVALID_ARGUMENT, "SOURCE_OUT_OF_RANGE"),
        ({"sources": source(elsewhere, 1, 2)}, grpc.StatusCode.NOT_FOUND, "SOURCE_NOT_FOUND"),
        (
            {"sources": source(str(uuid.uuid4()), 1, 1)},
            grpc.StatusCode.NOT_FOUND,
            "SOURCE_NOT_FOUND",
        ),
        (
            {"sources": source("not-a-uuid", 1, 1)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_CONVERSATION_ID",
        ),
        ({"memory_id": "nope"}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MEMORY_ID"),
        (
            {"expected_revision": 1, "memory_id": str(uuid.uuid4())},
            grpc.StatusCode.NOT_FOUND,
            "MEMORY_NOT_FOUND",
        ),
        (
            {"ttl": Duration(seconds=60), "expire_time": Timestamp(seconds=2_000_000_000)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_EXPIRY",
        ),
        ({"ttl": Duration(seconds=-5)}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_EXPIRY"),
        ({"metadata": {"": "x"}}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_METADATA"),
    ]
    for fields, code, expected in cases:
        request: dict[str, Any] = {"content": "A valid fact.", "sources": source(cid, 1, 4)}
        request.update(fields)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.memory.UpsertMemory(pb.UpsertMemoryRequest(namespace=namespace, **request))
        assert (error.value.code(), reason(error.value)) == (code, expected), fields.keys()
    for limit in (257, -1):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.search(namespace, "anything", limit=limit)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason(error.value) == "INVALID_LIMIT"
    for query in ("", "q" * (4 * 1024 + 1)):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await client.search(namespace, query)
        assert reason(error.value) == "INVALID_QUERY"
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await client.memory.ForgetSource(
            pb.ForgetSourceRequest(
                namespace=namespace, conversation_id=cid, from_sequence=3, through_sequence=1
            )
        )
    assert reason(error.value) == "INVALID_SOURCE_RANGE"
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await client.memory.ListMemories(pb.ListMemoriesRequest(namespace="bad namespace!"))
    assert reason(error.value) == "INVALID_NAMESPACE"
    # Nothing was written: no memory, no history, no outbox row.
    listed = await client.memory.ListMemories(pb.ListMemoriesRequest(namespace=namespace))
    assert list(listed.memories) == []
    assert client.component.db is not None
    async with client.component.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT (SELECT count(*) FROM memory.revisions WHERE namespace = %s),"
            " (SELECT count(*) FROM memory.outbox WHERE namespace = %s)",
            (namespace, namespace),
        )
        assert await cursor.fetchone() == (0, 0)


async def test_forget_source_erases_overlapping_memories_only(
    client: Client, namespace: str
) -> None:
    cid = await client.conversation(namespace, entries=10)
    other = await client.conversation(namespace, entries=10)

    def src(conversation: str, low: int, high: int) -> pb.MemorySource:
        return pb.MemorySource(
            conversation_id=conversation, from_sequence=low, through_sequence=high
        )

    early = (await client.upsert(namespace, "Early fact.", cid, sources=[src(cid, 1, 3)])).memory
    late = (await client.upsert(namespace, "Late fact.", cid, sources=[src(cid, 7, 9)])).memory
    mixed = (
        await client.upsert(
            namespace, "Mixed fact.", cid, sources=[src(other, 1, 2), src(cid, 4, 5)]
        )
    ).memory
    unrelated = (
        await client.upsert(namespace, "Other fact.", other, sources=[src(other, 3, 4)])
    ).memory
    by_conversation = await client.memory.ListMemories(
        pb.ListMemoriesRequest(namespace=namespace, conversation_id=cid)
    )
    assert {m.memory_id for m in by_conversation.memories} == {
        early.memory_id,
        late.memory_id,
        mixed.memory_id,
    }
    forgot = await client.memory.ForgetSource(
        pb.ForgetSourceRequest(
            namespace=namespace, conversation_id=cid, from_sequence=3, through_sequence=5
        )
    )
    assert forgot.deleted_count == 2  # early (1..3) and mixed (4..5) overlap 3..5
    # Another namespace cannot forget this namespace's memories.
    elsewhere = await client.memory.ForgetSource(
        pb.ForgetSourceRequest(namespace=f"{namespace}-x", conversation_id=cid)
    )
    assert elsewhere.deleted_count == 0
    whole = await client.memory.ForgetSource(
        pb.ForgetSourceRequest(namespace=namespace, conversation_id=cid)
    )
    assert whole.deleted_count == 1  # late
    listed = await client.memory.ListMemories(pb.ListMemoriesRequest(namespace=namespace))
    assert [m.memory_id for m in listed.memories] == [unrelated.memory_id]
    await wait_for(client.drained)
    found = await client.search(namespace, "fact", limit=10)
    assert [r.memory.memory_id for r in found.results] == [unrelated.memory_id]


async def test_expired_memories_vanish_and_are_swept(client: Client, namespace: str) -> None:
    cid = await client.conversation(namespace)
    soon = datetime.now(UTC) + timedelta(seconds=1)
    stamp = Timestamp()
    stamp.FromDatetime(soon)
    short = (await client.upsert(namespace, "A fleeting fact.", cid, expire_time=stamp)).memory
    lasting = (
        await client.upsert(namespace, "A lasting fact.", cid, ttl=Duration(seconds=3600))
    ).memory
    assert lasting.HasField("expire_time") and short.expire_time == stamp
    await wait_for(client.drained)

    async def expired() -> bool:
        try:
            await client.memory.GetMemory(
                pb.GetMemoryRequest(namespace=namespace, memory_id=short.memory_id)
            )
        except grpc.aio.AioRpcError as error:
            return error.code() == grpc.StatusCode.NOT_FOUND
        return False

    await wait_for(expired, timeout=10)
    found = await client.search(namespace, "fact", limit=10)
    assert [r.memory.memory_id for r in found.results] == [lasting.memory_id]

    async def swept() -> bool:
        return (namespace, uuid.UUID(short.memory_id)) not in await client.index_keys()

    await wait_for(swept, timeout=10)
    assert client.component.store is not None
    history = await client.component.store.history(namespace, uuid.UUID(short.memory_id))
    assert [(h.kind, h.reason) for h in history] == [("write", "create"), ("delete", "expired")]


async def test_list_pages_and_tokens_bound_to_the_request(client: Client, namespace: str) -> None:
    cid = await client.conversation(namespace)
    made = {(await client.upsert(namespace, f"Fact {i}.", cid)).memory.memory_id for i in range(5)}
    seen: list[str] = []
    token = ""
    while True:
        page = await client.memory.ListMemories(
            pb.ListMemoriesRequest(namespace=namespace, page_size=2, page_token=token)
        )
        seen += [m.memory_id for m in page.memories]
        token = page.next_page_token
        if not token:
            break
    assert seen == sorted(made)
    first = await client.memory.ListMemories(
        pb.ListMemoriesRequest(namespace=namespace, page_size=2)
    )
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await client.memory.ListMemories(
            pb.ListMemoriesRequest(
                namespace=f"{namespace}-b", page_size=2, page_token=first.next_page_token
            )
        )
    assert reason(error.value) == "INVALID_PAGE_TOKEN"


async def test_delete_with_expected_revision(client: Client, namespace: str) -> None:
    cid = await client.conversation(namespace)
    memory = (await client.upsert(namespace, "Deletable.", cid)).memory
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await client.memory.DeleteMemory(
            pb.DeleteMemoryRequest(
                namespace=namespace, memory_id=memory.memory_id, expected_revision=7
            )
        )
    assert error.value.code() == grpc.StatusCode.ABORTED
    assert reason(error.value) == "REVISION_CONFLICT"
    done = await client.memory.DeleteMemory(
        pb.DeleteMemoryRequest(namespace=namespace, memory_id=memory.memory_id, expected_revision=1)
    )
    again = await client.memory.DeleteMemory(
        pb.DeleteMemoryRequest(namespace=namespace, memory_id=memory.memory_id)
    )
    assert done.deleted and not again.deleted
    # Re-creating the id continues its revisions: a stale CAS can never hit the new one.
    recreated = (
        await client.upsert(namespace, "Back again.", cid, memory_id=memory.memory_id)
    ).memory
    assert recreated.revision == 3


async def test_stale_index_revision_is_rescored_against_current_content(
    client: Client, namespace: str
) -> None:
    cid = await client.conversation(namespace)
    memory = (await client.upsert(namespace, "The user's sister is named Hannah.", cid)).memory
    await wait_for(client.drained)
    assert client.component.indexer is not None and client.component.index is not None
    await client.component.indexer.stop()
    try:
        await client.upsert(
            namespace,
            "The user collects vintage stamps from Peru.",
            cid,
            memory_id=memory.memory_id,
            expected_revision=1,
        )
        found = await client.search(
            namespace, "what is the user's sister called?", mode=pb.SEARCH_MODE_DENSE
        )
        # The index still scores revision 1; the answer is revision 2, scored on its text.
        assert [r.memory.revision for r in found.results] == [2]
        assert found.results[0].score < 0.3
        # Hybrid: its cosine is of the current text too (its BM25 of the indexed one).
        hybrid = await client.search(namespace, "what is the user's sister called?")
        assert hybrid.mode == pb.SEARCH_MODE_HYBRID
        assert hybrid.results[0].dense_score == pytest.approx(found.results[0].score, abs=1e-5)
        assert client.component.embedder is not None
        again = await client.search(namespace, "stamp collection hobby")
        assert again.results[0].score > found.results[0].score
    finally:
        client.component.indexer.start()
    await wait_for(client.drained)


async def test_reindex_rebuilds_a_lost_index(
    client: Client, namespace: str, tmp_path: Path
) -> None:
    from services.memory.outbox.indexer import reindex

    cid = await client.conversation(namespace)
    made = [(await client.upsert(namespace, f"Reindexed fact {i}.", cid)).memory for i in range(3)]
    await wait_for(client.drained)
    component = client.component
    assert component.index is not None and component.store is not None
    assert component.embedder is not None
    # A ghost point that PostgreSQL does not back (as after a lost delete).
    ghost = (namespace, uuid.uuid4())
    await component.index.upsert([IndexPoint(ghost[0], ghost[1], 1, [0.1] * 384, {})])
    # The points of the live memories lost (no tombstone: as after losing the index).
    await component.index.purge([(namespace, uuid.UUID(m.memory_id)) for m in made])
    indexed, orphans = await reindex(component.store, component.index, component.embedder)
    keys = await component.index.keys()
    assert ghost not in keys and orphans >= 1
    assert {(namespace, uuid.UUID(m.memory_id)) for m in made} <= keys
    assert indexed >= 3


async def test_reindex_command_rebuilds_the_edge_index(
    fresh_database_url: str, tmp_path: Path, namespace: str
) -> None:
    """`python -m services.memory reindex` on a stopped server's data: all ids indexed."""
    import os
    import subprocess
    import sys

    config = memory_config(tmp_path / "index")
    async with (
        memory_server(fresh_database_url, config) as (running, component),
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        client = Client(channel, component)
        cid = await client.conversation(namespace)
        made = {
            (await client.upsert(namespace, f"Fact number {i}.", cid)).memory.memory_id
            for i in range(3)
        }
        await wait_for(client.drained)
    # Lose the index, as after a disk loss or a model change.
    import shutil

    shutil.rmtree(tmp_path / "index")
    env = {
        **os.environ,
        "DATABASE_URL": fresh_database_url,
        "RUNIFOLD_MEMORY_INDEX_DIR": str(tmp_path / "index"),
        "RUNIFOLD_LOG_LEVEL": "WARNING",
        "HF_HUB_OFFLINE": "1",
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "services.memory", "reindex"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3 memories indexed" in done.stderr
    index = EdgeIndex(tmp_path / "index", "sentence-transformers/all-MiniLM-L6-v2", 384)
    await index.start()
    try:
        assert {str(mid) for _, mid in await index.keys()} == made
    finally:
        await index.close()
