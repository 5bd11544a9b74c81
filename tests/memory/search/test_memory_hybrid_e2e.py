"""Search modes through the real service (issue 21): a real gRPC server, real
PostgreSQL, the real embedding model, on each index back-end (Qdrant Edge,
qdrant-client's local mode, pgvector), on a namespace of the labelled set."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from runifold.memory.v1 import memory_service_pb2 as pb
from services.memory.component import MIGRATIONS
from services.memory.index.model import IndexPoint, NamespacedQuery
from services.memory.outbox.indexer import reindex, to_point
from services.memory.search.lexical import SearchMode, query_terms
from tests.memory.search.retrieval_set import retrieval_set
from tests.memory.support import memory_config, memory_server
from tests.memory.test_memory_e2e import Client
from tests.support.grpc_calls import reason
from tests.support.waiting import wait_for

MODES = {
    "dense": pb.SEARCH_MODE_DENSE,
    "lexical": pb.SEARCH_MODE_LEXICAL,
    "hybrid": pb.SEARCH_MODE_HYBRID,
}


@pytest.fixture(params=["edge", "qdrant", "pgvector"])
async def client(
    request: pytest.FixtureRequest, fresh_database_url: str, tmp_path: Path
) -> AsyncIterator[Client]:
    config = memory_config(tmp_path, index=request.param)
    async with (
        memory_server(fresh_database_url, config) as (running, component),
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        yield Client(channel, component)


async def _store_namespace(client: Client, namespace: str) -> dict[str, str]:
    """The labelled set's facts of one namespace, stored under `namespace`: key -> id."""
    facts, _ = retrieval_set()
    cid = await client.conversation(namespace)
    ids = {}
    for fact in facts:
        if fact.namespace == "people-a":
            ids[fact.key] = (await client.upsert(namespace, fact.text, cid)).memory.memory_id
    await wait_for(client.drained)
    return ids


async def test_names_and_numbers_dense_misses_hybrid_finds(client: Client, namespace: str) -> None:
    ids = await _store_namespace(client, namespace)
    _, questions = retrieval_set()
    asked = [q for q in questions if q.namespace == "people-a" and q.kind in ("name", "number")]
    found: dict[str, int] = {"dense": 0, "hybrid": 0}
    rescued = []
    for question in asked:
        answer = ids[question.answers[0]]
        top: dict[str, list[str]] = {}
        for mode in ("dense", "hybrid"):
            reply = await client.search(namespace, question.text, 5, mode=MODES[mode])
            assert reply.mode == MODES[mode] and not reply.degraded
            top[mode] = [r.memory.memory_id for r in reply.results]
            found[mode] += answer in top[mode]
            for r in reply.results:
                # Each result reports the scores it was ranked by.
                assert r.HasField("dense_score")
                assert r.HasField("lexical_score") == (mode == "hybrid")
        if answer not in top["dense"] and answer in top["hybrid"]:
            rescued.append(question.text)
    assert rescued, "no name or number question that dense search misses and hybrid finds"
    assert found["hybrid"] > found["dense"]
    # The default mode is hybrid; lexical finds a badge number first.
    badge = next(q for q in asked if q.text.startswith("Who holds badge"))
    default = await client.search(namespace, badge.text, 3)
    assert default.mode == pb.SEARCH_MODE_HYBRID
    lexical = await client.search(namespace, badge.text, 3, mode=pb.SEARCH_MODE_LEXICAL)
    assert lexical.results[0].memory.memory_id == ids[badge.answers[0]]
    assert not lexical.results[0].HasField("dense_score")
    assert lexical.results[0].score == lexical.results[0].lexical_score > 0


async def test_no_mode_returns_a_deleted_memory_or_another_namespace(
    client: Client, namespace: str
) -> None:
    cid = await client.conversation(namespace)
    kept = (await client.upsert(namespace, "Locker 4471 holds the spare keys", cid)).memory
    gone = (await client.upsert(namespace, "Locker 4471 holds the old bike", cid)).memory
    other = f"{namespace}-x"
    other_cid = await client.conversation(other)
    await client.upsert(other, "Locker 4471 holds the spare keys", other_cid)
    await wait_for(client.drained)
    # The index still holds the deleted memory (the indexer is stopped): the store's
    # re-read drops it in every mode.
    assert client.component.indexer is not None
    await client.component.indexer.stop()
    try:
        await client.memory.DeleteMemory(
            pb.DeleteMemoryRequest(namespace=namespace, memory_id=gone.memory_id)
        )
        for mode in MODES.values():
            reply = await client.search(namespace, "what is in locker 4471?", 10, mode=mode)
            assert [r.memory.memory_id for r in reply.results] == [kept.memory_id]
    finally:
        client.component.indexer.start()
    await wait_for(client.drained)


async def test_min_score_bounds_the_cosine_and_is_refused_in_lexical_mode(
    client: Client, namespace: str
) -> None:
    cid = await client.conversation(namespace)
    await client.upsert(namespace, "Locker 4471 holds the spare keys", cid)
    await wait_for(client.drained)
    reply = await client.search(namespace, "locker 4471", 5, min_score=0.99)
    assert list(reply.results) == []  # the fused score may be higher; the cosine is not
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.search(namespace, "locker 4471", 5, min_score=0.5, mode=MODES["lexical"])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(refused.value) == "INVALID_MIN_SCORE"
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await client.search(namespace, "locker 4471", 5, mode=9)
    assert reason(unknown.value) == "INVALID_SEARCH_MODE"


async def test_reindex_and_the_outbox_fill_lexical_vectors_of_old_memories(
    client: Client, namespace: str
) -> None:
    """Memories indexed before lexical vectors (points without one) are found by their
    words after `reindex`, and after the outbox replay that migration 0005 queues."""
    component = client.component
    assert component.index is not None and component.store is not None
    assert component.embedder is not None
    cid = await client.conversation(namespace)
    made = [
        (await client.upsert(namespace, f"Badge QX-{7000 + i} opens door {i}", cid)).memory
        for i in range(3)
    ]
    await wait_for(client.drained)
    query = NamespacedQuery.inside(
        namespace, [0.0] * 384, 10, mode=SearchMode.LEXICAL, lexical=query_terms("badge 7001")
    )

    async def make_old() -> None:
        # As indexed before lexical vectors: the same revision, no lexical vector.
        assert component.index is not None and component.embedder is not None
        assert component.store is not None
        keys = [(namespace, uuid.UUID(m.memory_id)) for m in made]
        await component.index.purge(keys)
        current = await component.store.get_many(namespace, [k[1] for k in keys], {})
        vectors = await component.embedder.embed([m.content for m in current])
        points = [to_point(m, v) for m, v in zip(current, vectors, strict=True)]
        await component.index.upsert(
            [IndexPoint(p.namespace, p.memory_id, p.revision, p.vector, {}) for p in points]
        )
        assert await component.index.search(query) == []

    assert component.indexer is not None
    await component.indexer.stop()
    try:
        await make_old()
        await reindex(component.store, component.index, component.embedder)
        hits = await component.index.search(query)
        # "badge" is in all three, "7001" in one.
        assert len(hits) == 3 and str(hits[0].memory_id) == made[1].memory_id
        await make_old()
    finally:
        component.indexer.start()
    # Migration 0005's own statement, while the service runs.
    replay = (MIGRATIONS / "0005_lexical_vectors.sql").read_text()
    async with component.store.db.connection() as conn:
        await conn.execute(replay)
    await wait_for(client.drained)
    hits = await component.index.search(query)
    assert len(hits) == 3 and str(hits[0].memory_id) == made[1].memory_id
