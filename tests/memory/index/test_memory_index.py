"""The vector index contract, run against all three adapters on their real engines:
Qdrant Edge (in-process), qdrant-client (local mode, the server adapter's API) and
pgvector (real PostgreSQL with HNSW and iterative scan)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import numpy as np
import psycopg
import pytest
import qdrant_edge as qe
from qdrant_client import AsyncQdrantClient, models

from services.common.errors import DomainError
from services.memory.index.edge import EdgeIndex
from services.memory.index.model import (
    IndexPoint,
    NamespacedQuery,
    Term,
    Tombstone,
    ValidAt,
    collection_name,
    hybrid_collection_name,
    point_id,
)
from services.memory.index.pgvector.adapter import PgvectorIndex
from services.memory.index.protocol import IndexMismatch, IndexUnavailable, VectorIndex
from services.memory.index.qdrant.adapter import QdrantIndex
from services.memory.search import lexical
from services.memory.search.lexical import Fusion, FusionMethod, SearchMode
from tests.memory.support import reference_search

MODEL = "test/contract-model"
DIM = 16
ADAPTERS = ["edge", "qdrant", "pgvector"]

Factory = Callable[[int], Awaitable[VectorIndex]]


@pytest.fixture(params=ADAPTERS)
async def make_index(
    request: pytest.FixtureRequest, tmp_path: Path, fresh_database_url: str
) -> AsyncIterator[Factory]:
    """Opens an adapter of the parametrized kind for a dimension; closes them all after."""
    kind = request.param
    opened: list[VectorIndex] = []

    async def make(dimension: int) -> VectorIndex:
        index: VectorIndex
        if kind == "edge":
            index = EdgeIndex(tmp_path / "edge", MODEL, dimension)
        elif kind == "qdrant":
            index = QdrantIndex(MODEL, dimension, path=str(tmp_path / "qdrant"))
        else:
            index = PgvectorIndex(fresh_database_url, MODEL, dimension, ef_search=100)
        await index.start()
        opened.append(index)
        return index

    make.kind = kind  # type: ignore[attr-defined]
    make.url = fresh_database_url  # type: ignore[attr-defined]
    make.path = tmp_path  # type: ignore[attr-defined]
    yield make
    for index in opened:
        await index.close()


def unit(rng: np.random.Generator, dimension: int = DIM) -> list[float]:
    vector = rng.normal(size=dimension)
    return list(vector / np.linalg.norm(vector))


def point(namespace: str, vector: list[float], **metadata: str) -> IndexPoint:
    return IndexPoint(namespace, uuid.uuid4(), 1, vector, metadata)


def test_a_query_cannot_be_built_without_a_valid_namespace() -> None:
    with pytest.raises(TypeError):
        NamespacedQuery("ns", [0.0], 1, (Term("namespace", "ns"),), object())
    with pytest.raises(DomainError):
        NamespacedQuery.inside("", [0.0], 1)
    with pytest.raises(DomainError):
        NamespacedQuery.inside("a b", [0.0], 1)
    query = NamespacedQuery.inside("ns", [0.0], 3, {"b": "2", "a": "1"})
    assert query.terms[0] == Term("namespace", "ns")
    assert [t.field for t in query.terms if isinstance(t, Term)] == ["namespace", "tags", "tags"]
    # The valid time comes after the namespace (and never in its place).
    timed = NamespacedQuery.inside("ns", [0.0], 3, valid_at=12.5)
    assert timed.terms == (Term("namespace", "ns"), ValidAt(12.5))


async def test_search_stays_inside_the_namespace(make_index: Factory) -> None:
    index = await make_index(DIM)
    rng = np.random.default_rng(1)
    vectors = [unit(rng) for _ in range(20)]
    # Identical vectors in both namespaces: only the namespace tells them apart.
    in_a = [point("ns-a", v) for v in vectors]
    in_b = [point("ns-b", v) for v in vectors]
    await index.upsert(in_a + in_b)
    hits = await index.search(NamespacedQuery.inside("ns-a", vectors[3], 50))
    assert {h.memory_id for h in hits} == {p.memory_id for p in in_a}
    assert hits[0].memory_id == in_a[3].memory_id and hits[0].score == pytest.approx(1.0, abs=1e-4)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert await index.search(NamespacedQuery.inside("ns-c", vectors[3], 5)) == []


async def test_metadata_terms_filter_exactly(make_index: Factory) -> None:
    index = await make_index(DIM)
    rng = np.random.default_rng(2)
    vector = unit(rng)
    red = point("ns", vector, colour="red", size="s")
    blue = point("ns", vector, colour="blue", size="s")
    tricky = point("ns", vector, **{"colour=red": ""})  # must not match colour=red
    await index.upsert([red, blue, tricky])
    hits = await index.search(NamespacedQuery.inside("ns", vector, 10, {"colour": "red"}))
    assert [h.memory_id for h in hits] == [red.memory_id]
    both = await index.search(NamespacedQuery.inside("ns", vector, 10, {"size": "s"}))
    assert {h.memory_id for h in both} == {red.memory_id, blue.memory_id}


async def test_upsert_replaces_and_delete_removes(make_index: Factory) -> None:
    index = await make_index(DIM)
    rng = np.random.default_rng(3)
    first, second = unit(rng), unit(rng)
    p = point("ns", first)
    await index.upsert([p])
    await index.upsert([IndexPoint("ns", p.memory_id, 2, second, {})])
    hits = await index.search(NamespacedQuery.inside("ns", second, 5))
    assert [(h.memory_id, h.revision) for h in hits] == [(p.memory_id, 2)]
    assert hits[0].score == pytest.approx(1.0, abs=1e-4)
    assert await index.keys() == {("ns", p.memory_id)}
    # The same memory id in another namespace is another point.
    await index.upsert([IndexPoint("ns-2", p.memory_id, 1, first, {})])
    await index.delete([Tombstone("ns", p.memory_id, 3), Tombstone("ns", uuid.uuid4(), 1)])
    assert await index.keys() == {("ns-2", p.memory_id)}
    assert await index.search(NamespacedQuery.inside("ns", second, 5)) == []


async def test_data_survives_close_and_reopen(make_index: Factory) -> None:
    index = await make_index(DIM)
    rng = np.random.default_rng(4)
    p = point("ns", unit(rng))
    await index.upsert([p])
    await index.close()
    with pytest.raises(IndexUnavailable):
        await index.search(NamespacedQuery.inside("ns", p.vector, 1))
    await index.start()
    assert await index.keys() == {("ns", p.memory_id)}


async def test_filtered_recall_against_brute_force(make_index: Factory) -> None:
    """3,000 points over 30 namespaces: the namespaced top-10 matches exact search."""
    index = await make_index(DIM)
    rng = np.random.default_rng(5)
    namespaces = [f"ns-{i}" for i in range(30)]
    points = [point(namespaces[i % 30], unit(rng)) for i in range(3000)]
    for start in range(0, len(points), 500):
        await index.upsert(points[start : start + 500])
    await index.optimize()
    total = found = 0
    for q in range(30):
        namespace = namespaces[q]
        vector = unit(rng)
        mine = [p for p in points if p.namespace == namespace]
        exact = sorted(mine, key=lambda p: -float(np.dot(vector, p.vector)))[:10]
        hits = await index.search(NamespacedQuery.inside(namespace, vector, 10))
        total += 10
        found += len({p.memory_id for p in exact} & {h.memory_id for h in hits})
    recall = found / total
    print(f"{make_index.kind}: filtered recall@10 = {recall:.3f}")  # type: ignore[attr-defined]
    assert recall >= 0.95


async def test_a_collection_of_another_size_or_distance_is_refused(make_index: Factory) -> None:
    kind = make_index.kind  # type: ignore[attr-defined]
    name = collection_name(MODEL, DIM)
    for size, distance in ((DIM * 2, "cosine"), (DIM, "dot")):
        if kind == "edge":
            path = make_index.path / f"edge-{size}-{distance}"  # type: ignore[attr-defined]
            shard = qe.EdgeShard.create(
                str(path / name),
                qe.EdgeConfig(
                    vectors=qe.EdgeVectorParams(
                        size, qe.Distance.Cosine if distance == "cosine" else qe.Distance.Dot
                    )
                ),
            )
            shard.close()
            index: VectorIndex = EdgeIndex(path, MODEL, DIM)
        elif kind == "qdrant":
            path = make_index.path / f"qdrant-{size}-{distance}"  # type: ignore[attr-defined]
            client = AsyncQdrantClient(path=str(path))
            await client.create_collection(
                name,
                vectors_config=models.VectorParams(
                    size=size,
                    distance=models.Distance.COSINE
                    if distance == "cosine"
                    else models.Distance.DOT,
                ),
            )
            await client.close()
            index = QdrantIndex(MODEL, DIM, path=str(path))
        else:
            url = make_index.url  # type: ignore[attr-defined]
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                await conn.execute(f"DROP TABLE IF EXISTS memory.{name}")
                await conn.execute(
                    f"CREATE TABLE memory.{name} (point_id uuid PRIMARY KEY, namespace text,"
                    f" memory_id uuid, revision bigint, tags text[], embedding vector({size}))"
                )
                ops = "vector_cosine_ops" if distance == "cosine" else "vector_ip_ops"
                await conn.execute(
                    f"CREATE INDEX {name}_hnsw ON memory.{name} USING hnsw (embedding {ops})"
                )
            index = PgvectorIndex(url, MODEL, DIM)
        with pytest.raises(IndexMismatch):
            await index.start()
        await index.close()


async def test_pgvector_hnsw_path_and_its_exact_fallback(fresh_database_url: str) -> None:
    """With exact search off for every namespace size: a big namespace is served by HNSW,
    a small one (whose HNSW answer comes back short) by the exact fallback."""
    index = PgvectorIndex(fresh_database_url, MODEL, DIM, ef_search=40, exact_below=0)
    await index.start()
    try:
        rng = np.random.default_rng(6)
        big = [point("big", unit(rng)) for _ in range(1900)]
        small = [point("small", unit(rng)) for _ in range(100)]
        await index.upsert(big + small)
        for namespace, members in (("big", big), ("small", small)):
            found = total = 0
            for _ in range(10):
                vector = unit(rng)
                exact = sorted(members, key=lambda p: -float(np.dot(vector, p.vector)))[:10]
                hits = await index.search(NamespacedQuery.inside(namespace, vector, 10))
                assert len(hits) == 10
                found += len({p.memory_id for p in exact} & {h.memory_id for h in hits})
                total += 10
            assert found / total >= 0.9, namespace
    finally:
        await index.close()


async def test_an_older_revision_never_replaces_a_newer_one(make_index: Factory) -> None:
    """The revision guard, in the engine's own write: a batch mixing newer and older
    points applies only the newer ones, also after the index built its graph."""
    index = await make_index(DIM)
    rng = np.random.default_rng(7)
    old, new, other = unit(rng), unit(rng), unit(rng)
    a, b = uuid.uuid4(), uuid.uuid4()
    await index.upsert([IndexPoint("ns", a, 3, new, {"v": "3"}), IndexPoint("ns", b, 1, old, {})])
    await index.optimize()
    # a: 2 and 3 are refused (older, same); b: 2 lands.
    await index.upsert([IndexPoint("ns", a, 2, old, {"v": "2"}), IndexPoint("ns", b, 2, other, {})])
    await index.upsert([IndexPoint("ns", a, 3, old, {"v": "3"})])
    hits = await index.search(NamespacedQuery.inside("ns", new, 5, {"v": "3"}))
    assert [(h.memory_id, h.revision) for h in hits] == [(a, 3)]
    assert hits[0].score == pytest.approx(1.0, abs=1e-4)  # still the vector of revision 3
    assert await index.search(NamespacedQuery.inside("ns", old, 5, {"v": "2"})) == []
    hits = await index.search(NamespacedQuery.inside("ns", other, 1))
    assert [(h.memory_id, h.revision) for h in hits] == [(b, 2)]
    await index.upsert([IndexPoint("ns", a, 4, old, {"v": "4"})])
    hits = await index.search(NamespacedQuery.inside("ns", old, 1))
    assert [(h.memory_id, h.revision) for h in hits] == [(a, 4)]


async def test_a_tombstone_blocks_older_writes_and_is_never_found(make_index: Factory) -> None:
    index = await make_index(DIM)
    rng = np.random.default_rng(8)
    vector, again = unit(rng), unit(rng)
    gone, early, kept = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await index.upsert(
        [IndexPoint("ns", gone, 1, vector, {}), IndexPoint("ns", kept, 5, again, {})]
    )
    await index.optimize()
    # Deleted at revision 2; a tombstone also for a memory the index never held; a
    # deletion older than what the index holds (kept is at 5) changes nothing.
    await index.delete(
        [Tombstone("ns", gone, 2), Tombstone("ns", early, 3), Tombstone("ns", kept, 4)]
    )
    # The late, older writes of the deleted memories: refused.
    await index.upsert(
        [IndexPoint("ns", gone, 1, vector, {}), IndexPoint("ns", early, 2, vector, {})]
    )
    assert await index.keys() == {("ns", kept)}
    hits = await index.search(NamespacedQuery.inside("ns", vector, 10))
    assert {h.memory_id for h in hits} == {kept}
    # Nothing of a tombstone can be found from any namespace, with any filter.
    for namespace in ("ns", "ns-2"):
        for metadata in ({}, {"v": "1"}):
            found = await index.search(NamespacedQuery.inside(namespace, vector, 10, metadata))
            assert gone not in {h.memory_id for h in found}
            assert early not in {h.memory_id for h in found}
    # A re-created memory (its revisions keep counting) passes the tombstone.
    await index.upsert([IndexPoint("ns", gone, 3, again, {})])
    hits = await index.search(NamespacedQuery.inside("ns", again, 10))
    assert {(h.memory_id, h.revision) for h in hits} == {(gone, 3), (kept, 5)}


async def test_tombstones_are_pruned_after_their_retention(make_index: Factory) -> None:
    index = await make_index(DIM)
    rng = np.random.default_rng(9)
    vector = unit(rng)
    gone, live = uuid.uuid4(), uuid.uuid4()
    await index.upsert([IndexPoint("ns", live, 1, unit(rng), {})])
    await index.delete([Tombstone("ns", gone, 2)])
    await index.prune_tombstones(3600)  # younger than the retention: kept
    await index.upsert([IndexPoint("ns", gone, 1, vector, {})])
    assert await index.keys() == {("ns", live)}
    await index.prune_tombstones(0)
    # Pruned: the tombstone no longer holds an older write back; points are untouched.
    await index.upsert([IndexPoint("ns", gone, 1, vector, {})])
    assert await index.keys() == {("ns", live), ("ns", gone)}


async def test_a_pgvector_table_made_before_tombstones_takes_them(
    fresh_database_url: str,
) -> None:
    """A table of the earlier layout (embedding NOT NULL, no deleted_at) is changed in
    place at start: its points stay, and a deletion leaves a tombstone."""
    name = collection_name(MODEL, DIM)
    rng = np.random.default_rng(10)
    kept, gone = uuid.uuid4(), uuid.uuid4()
    async with await psycopg.AsyncConnection.connect(fresh_database_url, autocommit=True) as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        await conn.execute(
            f"CREATE TABLE memory.{name} (point_id uuid PRIMARY KEY, namespace text NOT NULL,"
            f" memory_id uuid NOT NULL, revision bigint NOT NULL,"
            f" tags text[] NOT NULL DEFAULT '{{}}', embedding vector({DIM}) NOT NULL)"
        )
        await conn.execute(
            f"CREATE INDEX {name}_hnsw ON memory.{name} USING hnsw (embedding vector_cosine_ops)"
        )
        vector = "[" + ",".join(str(x) for x in unit(rng)) + "]"
        for memory_id in (kept, gone):
            await conn.execute(
                f"INSERT INTO memory.{name} (point_id, namespace, memory_id, revision, embedding)"
                " VALUES (%s, 'ns', %s, 1, %s)",
                (point_id("ns", memory_id), memory_id, vector),
            )
    index = PgvectorIndex(fresh_database_url, MODEL, DIM)
    await index.start()
    try:
        assert await index.keys() == {("ns", kept), ("ns", gone)}
        await index.close()
        await index.start()  # the second start finds the table already changed
        await index.delete([Tombstone("ns", gone, 2)])
        await index.upsert([IndexPoint("ns", gone, 1, unit(rng), {})])
        assert await index.keys() == {("ns", kept)}
    finally:
        await index.close()


async def test_valid_time_filters_inside_the_engine(make_index: Factory) -> None:
    """`ValidAt(t)` matches `valid_from <= t < valid_until` (open: always after its
    start), so facts no longer valid crowding a namespace never take the places of the
    valid ones: with 40 closed points nearer the query than the one open fact, a top-1
    asked as of now is that fact."""
    index = await make_index(DIM)
    rng = np.random.default_rng(11)
    query = unit(rng)
    near = [list(np.asarray(query) + rng.normal(scale=0.01, size=DIM)) for _ in range(40)]
    closed = [
        IndexPoint("ns", uuid.uuid4(), 2, v, {}, valid_from=100.0, valid_until=200.0) for v in near
    ]
    current = IndexPoint("ns", uuid.uuid4(), 1, unit(rng), {}, valid_from=200.0)
    future = IndexPoint("ns", uuid.uuid4(), 1, query, {}, valid_from=900.0)
    await index.upsert([*closed, current, future])

    async def found(at: float, limit: int = 50) -> set[uuid.UUID]:
        hits = await index.search(NamespacedQuery.inside("ns", query, limit, valid_at=at))
        return {h.memory_id for h in hits}

    assert await found(500.0, 1) == {current.memory_id}
    assert await found(150.0) == {p.memory_id for p in closed}
    assert await found(200.0) == {current.memory_id}  # a closed fact ends where the next starts
    assert await found(99.0) == set()
    assert await found(1000.0) == {current.memory_id, future.memory_id}
    # Without the term, every point of the namespace is a candidate.
    everything = await index.search(NamespacedQuery.inside("ns", query, 50))
    assert len(everything) == 42
    # A supersession reaches the index as a newer revision with its validity closed.
    await index.upsert(
        [IndexPoint("ns", current.memory_id, 2, current.vector, {}, 200.0, valid_until=600.0)]
    )
    assert await found(700.0) == set()
    assert await found(950.0) == {future.memory_id}
    assert await found(500.0) == {current.memory_id}


async def test_an_index_made_before_valid_time_keeps_its_points_searchable(
    make_index: Factory,
) -> None:
    """Points written before valid time was indexed (no valid_from / valid_until) are
    valid always as far as the index knows (the store's re-read decides), so a query with
    a valid-time term still finds them after the upgrade."""
    kind = make_index.kind  # type: ignore[attr-defined]
    name = collection_name(MODEL, DIM)
    rng = np.random.default_rng(12)
    vector = unit(rng)
    old = uuid.uuid4()
    payload = {"namespace": "ns", "memory_id": str(old), "revision": 1, "tags": []}
    index: VectorIndex
    if kind == "edge":
        path = make_index.path / "edge-legacy"  # type: ignore[attr-defined]
        shard = qe.EdgeShard.create(
            str(path / name),
            qe.EdgeConfig(vectors=qe.EdgeVectorParams(DIM, qe.Distance.Cosine)),
        )
        shard.update(
            qe.UpdateOperation.upsert_points([qe.Point(str(point_id("ns", old)), vector, payload)])
        )
        shard.update(
            qe.UpdateOperation.create_field_index(
                "namespace", qe.KeywordIndexParams(is_tenant=True)
            )
        )
        shard.close()
        index = EdgeIndex(path, MODEL, DIM)
    elif kind == "qdrant":
        path = make_index.path / "qdrant-legacy"  # type: ignore[attr-defined]
        client = AsyncQdrantClient(path=str(path))
        await client.create_collection(
            name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE)
        )
        await client.upsert(
            name,
            points=[
                models.PointStruct(id=str(point_id("ns", old)), vector=vector, payload=payload)
            ],
        )
        await client.close()
        index = QdrantIndex(MODEL, DIM, path=str(path))
    else:
        url = make_index.url  # type: ignore[attr-defined]
        first = PgvectorIndex(url, MODEL, DIM)
        await first.start()
        await first.close()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(
                f"ALTER TABLE memory.{name} DROP COLUMN valid_from, DROP COLUMN valid_until"
            )
            await conn.execute(
                f"INSERT INTO memory.{name} (point_id, namespace, memory_id, revision, embedding)"
                " VALUES (%s, 'ns', %s, 1, %s)",
                (point_id("ns", old), old, "[" + ",".join(str(x) for x in vector) + "]"),
            )
        index = PgvectorIndex(url, MODEL, DIM)
    new = IndexPoint("ns", uuid.uuid4(), 1, vector, {}, valid_from=10.0, valid_until=20.0)
    for _ in range(2):  # the second start finds the index already upgraded
        await index.start()
        try:
            now = NamespacedQuery.inside("ns", vector, 5, valid_at=time.time())
            assert [h.memory_id for h in await index.search(now)] == [old]
            # A point written now carries its validity.
            await index.upsert([new])
            then = NamespacedQuery.inside("ns", vector, 5, valid_at=15.0)
            assert {h.memory_id for h in await index.search(then)} == {old, new.memory_id}
        finally:
            await index.close()


async def test_the_edge_shard_keeps_full_vectors_on_disk_and_an_int8_copy_in_memory(
    tmp_path: Path,
) -> None:
    """Bounded memory (docs/memory.md): the full vectors are cold (memory-mapped), an
    int8 copy stays in RAM, the HNSW graph is cached; a shard made with the vectors held
    in memory takes this placement when it is opened, and its points stay searchable."""
    name = collection_name(MODEL, DIM)
    shard = qe.EdgeShard.create(
        str(tmp_path / name), qe.EdgeConfig(vectors=qe.EdgeVectorParams(DIM, qe.Distance.Cosine))
    )
    shard.close()
    index = EdgeIndex(tmp_path, MODEL, DIM)
    await index.start()
    try:
        vector = unit(np.random.default_rng(3))
        await index.upsert([IndexPoint("ns", uuid.uuid4(), 1, vector, {})])
        hits = await index.search(NamespacedQuery.inside("ns", vector, 1, valid_at=time.time()))
        assert len(hits) == 1
    finally:
        await index.close()
    made = tmp_path / hybrid_collection_name(MODEL, DIM)  # the legacy shard, copied
    placement = json.loads((made / "edge_config.json").read_text())["vectors"][""]
    assert placement["memory"] == "cold"
    assert placement["quantization_config"]["scalar"] == {
        "type": "int8",
        "quantile": 0.99,
        "memory": "pinned",
    }
    assert placement["hnsw_config"]["memory"] == "cached"


# -- lexical and hybrid search (issue 21) ---------------------------------------------

FACTS = [
    "Zephyrine Okonkwo-Lindqvist keeps her bike in locker 4471",
    "The team lunch moved to Thursday at the Italian place",
    "Invoice INV-20931 was paid by bank transfer",
    "My sister prefers tea over coffee in the morning",
    "The quarterly review is scheduled for the first week of March",
    "Our flight to Lisbon departs at 7:45 from terminal 2",
    "The dentist appointment was rescheduled twice this month",
    "She adopted a grey cat from the shelter last spring",
]


def lexical_point(namespace: str, text: str, vector: list[float], **kwargs: object) -> IndexPoint:
    return IndexPoint(
        namespace,
        uuid.uuid4(),
        1,
        vector,
        {},
        lexical=lexical.document(text),
        **kwargs,  # type: ignore[arg-type]
    )


def query_in(
    namespace: str, vector: list[float], text: str, mode: SearchMode, limit: int = 3, **kw: object
) -> NamespacedQuery:
    return NamespacedQuery.inside(
        namespace,
        vector,
        limit,
        mode=mode,
        lexical=lexical.query_terms(text),
        **kw,  # type: ignore[arg-type]
    )


async def test_a_name_or_number_the_vectors_miss_is_found_by_lexical_and_hybrid(
    make_index: Factory,
) -> None:
    """The query's vector lies near other facts (as a dense model's may for a rare
    name), its words only in one: dense misses it, lexical and hybrid rank it first, with
    the BM25 every back-end computes alike (the reference in tests/memory/support.py)."""
    index = await make_index(DIM)
    rng = np.random.default_rng(21)
    decoy = unit(rng)

    def near() -> list[float]:
        v = np.asarray(decoy) + rng.normal(scale=0.1, size=DIM)
        return list(v / np.linalg.norm(v))

    points = [lexical_point("ns", text, near() if i else unit(rng)) for i, text in enumerate(FACTS)]
    target = points[0]
    # Another namespace holds the same words: it changes neither the hits nor the IDF.
    await index.upsert(points + [lexical_point("ns-other", FACTS[0], decoy) for _ in range(5)])
    for text in ("Where does Zephyrine keep her bike?", "locker 4471"):
        dense = await index.search(query_in("ns", decoy, text, SearchMode.DENSE))
        assert target.memory_id not in {h.memory_id for h in dense}
        assert all(h.dense == h.score and h.lexical is None for h in dense)
        found = await index.search(query_in("ns", decoy, text, SearchMode.LEXICAL))
        assert [h.memory_id for h in found] == [target.memory_id]
        reference = reference_search(points, query_in("ns", decoy, text, SearchMode.LEXICAL))
        assert found[0].score == pytest.approx(reference[0].score, rel=1e-4)
        assert found[0].lexical == found[0].score and found[0].dense is None
        fused = await index.search(
            query_in("ns", decoy, text, SearchMode.HYBRID, fusion=Fusion(weight=0.6))
        )
        assert fused[0].memory_id == target.memory_id
        expected = reference_search(
            points, query_in("ns", decoy, text, SearchMode.HYBRID, fusion=Fusion(weight=0.6))
        )
        assert [h.memory_id for h in fused] == [h.memory_id for h in expected]
        for got, want in zip(fused, expected, strict=True):
            assert got.score == pytest.approx(want.score, rel=1e-4, abs=1e-5)
            assert got.dense == pytest.approx(want.dense, abs=1e-4)
            assert got.lexical == pytest.approx(want.lexical, rel=1e-4, abs=1e-5)


async def test_rank_fusion_matches_the_reference(make_index: Factory) -> None:
    index = await make_index(DIM)
    rng = np.random.default_rng(22)
    points = [lexical_point("ns", text, unit(rng)) for text in FACTS]
    await index.upsert(points)
    fusion = Fusion(FusionMethod.RRF, weight=0.5, rrf_k=60)
    query = query_in("ns", unit(rng), "the morning flight in March", SearchMode.HYBRID, 5)
    query = NamespacedQuery.inside(
        "ns", query.vector, 5, mode=SearchMode.HYBRID, lexical=query.lexical, fusion=fusion
    )
    got = await index.search(query)
    want = reference_search(points, query)
    assert [h.memory_id for h in got] == [h.memory_id for h in want]
    assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-6)


@pytest.mark.parametrize("mode", list(SearchMode))
async def test_every_mode_keeps_the_namespace_tombstone_and_validity_rules(
    make_index: Factory, mode: SearchMode
) -> None:
    index = await make_index(DIM)
    rng = np.random.default_rng(23)
    vector = unit(rng)
    text = "Invoice INV-20931 was paid by bank transfer"
    live = lexical_point("ns-a", text, vector, valid_from=0.0)
    deleted = lexical_point("ns-a", text, vector)
    ended = lexical_point("ns-a", text, vector, valid_from=0.0, valid_until=50.0)
    tagged = IndexPoint(
        "ns-a", uuid.uuid4(), 1, vector, {"kind": "x"}, lexical=lexical.document(text)
    )
    elsewhere = [lexical_point("ns-b", text, vector) for _ in range(3)]
    await index.upsert([live, deleted, ended, tagged, *elsewhere])
    await index.delete([Tombstone("ns-a", deleted.memory_id, 2)])
    # A late write of the deleted memory's indexed revision does not bring it back.
    await index.upsert(
        [IndexPoint("ns-a", deleted.memory_id, 1, vector, {}, lexical=deleted.lexical)]
    )
    hits = await index.search(
        query_in("ns-a", vector, "INV-20931 invoice", mode, 10, valid_at=100.0)
    )
    assert {h.memory_id for h in hits} == {live.memory_id, tagged.memory_id}
    at_10 = await index.search(
        query_in("ns-a", vector, "INV-20931 invoice", mode, 10, valid_at=10.0)
    )
    assert {h.memory_id for h in at_10} == {live.memory_id, ended.memory_id, tagged.memory_id}
    only_tagged = await index.search(
        NamespacedQuery.inside(
            "ns-a", vector, 10, {"kind": "x"}, mode=mode, lexical=lexical.query_terms(text)
        )
    )
    assert [h.memory_id for h in only_tagged] == [tagged.memory_id]
    assert await index.search(query_in("ns-c", vector, text, mode, 10)) == []


async def test_a_point_without_a_lexical_vector_gets_one_at_its_own_revision(
    make_index: Factory,
) -> None:
    """Points indexed before lexical vectors (none) are found by lexical search once a
    write at their revision brings one (the outbox replay, reindex); a point that has one
    is not rewritten at the same revision, and a tombstone at that revision holds."""
    index = await make_index(DIM)
    rng = np.random.default_rng(24)
    vector = unit(rng)
    old = IndexPoint("ns", uuid.uuid4(), 3, vector, {})
    gone = IndexPoint("ns", uuid.uuid4(), 3, vector, {})
    await index.upsert([old, gone])
    await index.delete([Tombstone("ns", gone.memory_id, 3)])  # expired at its revision
    query = query_in("ns", vector, "locker 4471", SearchMode.LEXICAL, 5)
    assert await index.search(query) == []
    filled = [
        IndexPoint("ns", p.memory_id, 3, vector, {}, lexical=lexical.document(FACTS[0]))
        for p in (old, gone)
    ]
    await index.upsert(filled)
    assert [h.memory_id for h in await index.search(query)] == [old.memory_id]
    # Once it has one, the same revision changes nothing.
    other = IndexPoint("ns", old.memory_id, 3, vector, {}, lexical=lexical.document(FACTS[2]))
    await index.upsert([other])
    assert [h.memory_id for h in await index.search(query)] == [old.memory_id]
    assert await index.keys() == {("ns", old.memory_id)}


async def test_a_query_of_stop_words_only(make_index: Factory) -> None:
    index = await make_index(DIM)
    rng = np.random.default_rng(25)
    points = [lexical_point("ns", text, unit(rng)) for text in FACTS]
    await index.upsert(points)
    vector = unit(rng)
    assert lexical.query_terms("who is it?") == ()
    assert await index.search(query_in("ns", vector, "who is it?", SearchMode.LEXICAL)) == []
    hybrid = await index.search(query_in("ns", vector, "who is it?", SearchMode.HYBRID))
    dense = await index.search(query_in("ns", vector, "who is it?", SearchMode.DENSE))
    assert [h.memory_id for h in hybrid] == [h.memory_id for h in dense]
    assert all(h.lexical == 0.0 for h in hybrid)
