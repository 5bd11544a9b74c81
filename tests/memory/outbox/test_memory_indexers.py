"""Two memory indexers on one PostgreSQL and one index, the first one's connection killed
mid-batch while its index write is held.

Each indexer has its own Database pool (as two replicas would); the embedding
model is the real one. The first indexer's embedder is held on an event after
it took its batch; its PostgreSQL connections are then killed
(pg_terminate_backend), a newer write of one memory and the deletion of another
land and are indexed by the second indexer, and only then is the first one's
late write let go. The index must end at the newest revision and hold no point
of the deleted memory. With one cluster-wide advisory lock in a transaction
kept open across the batch, killing the connection let the second indexer in
while the first one's write was still to come, and that write left a stale
vector and brought the deleted memory back.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from services.common.errors import StoreUnavailable
from services.common.postgres.pool import Database
from services.memory.config import LOCAL_MODEL_DIMENSION, LOCAL_MODEL_NAME
from services.memory.embeddings.local import LocalEmbedder
from services.memory.embeddings.protocol import Embedder, Vector
from services.memory.index.edge import EdgeIndex
from services.memory.index.model import NamespacedQuery
from services.memory.index.pgvector.adapter import PgvectorIndex
from services.memory.index.protocol import VectorIndex
from services.memory.model import MemorySource
from services.memory.outbox.indexer import Indexer
from services.memory.store import PostgresMemoryStore
from services.memory.writes.model import MemoryWrite
from tests.memory.support import memory_config
from tests.support.settings import server_settings

FIRST = "runifold-indexer-1"


class HeldEmbedder:
    """The real model, held: the first call waits for `release` once it began."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.model = inner.model
        self.dimension = inner.dimension

    async def start(self) -> None:
        await self.inner.start()

    async def embed(self, texts: Sequence[str]) -> list[Vector]:
        if not self.entered.is_set():
            self.entered.set()
            await self.release.wait()
        return await self.inner.embed(texts)

    async def close(self) -> None:
        return None


@pytest.fixture(scope="module")
async def model() -> AsyncIterator[LocalEmbedder]:
    embedder = LocalEmbedder()
    await embedder.start()
    yield embedder
    await embedder.close()


def _named(url: str, application_name: str) -> str:
    params = conninfo_to_dict(url)
    params["application_name"] = application_name
    return make_conninfo("", **params)


def _memory(
    namespace: str, memory_id: uuid.UUID, content: str, expected: int | None
) -> MemoryWrite:
    return MemoryWrite(
        namespace,
        memory_id,
        content,
        [MemorySource(uuid.uuid4(), 1, 1)],
        {},
        expected,
        None,
        LOCAL_MODEL_NAME,
        LOCAL_MODEL_DIMENSION,
    )


@pytest.mark.parametrize("kind", ["pgvector", "edge"])
async def test_a_late_write_of_a_killed_indexer_never_lands(
    kind: str, fresh_database_url: str, tmp_path: Path, model: LocalEmbedder, namespace: str
) -> None:
    url = fresh_database_url
    databases = [
        Database(_named(url, FIRST), server_settings()),
        Database(_named(url, "runifold-indexer-2"), server_settings()),
        Database(url, server_settings()),
    ]
    indexes: list[VectorIndex] = []
    for _ in range(2):
        if kind == "pgvector":
            indexes.append(PgvectorIndex(url, LOCAL_MODEL_NAME, LOCAL_MODEL_DIMENSION))
        elif not indexes:
            indexes.append(EdgeIndex(tmp_path, LOCAL_MODEL_NAME, LOCAL_MODEL_DIMENSION))
        else:
            indexes.append(indexes[0])  # one process opens an Edge shard: both share it
    for db in databases:
        await db.open()
    for index in indexes:
        await index.start()
    try:
        first_store, second_store, writer = (PostgresMemoryStore(db) for db in databases)
        held = HeldEmbedder(model)
        config = memory_config()
        first = Indexer(first_store, indexes[0], held, config)
        second = Indexer(second_store, indexes[1], model, config)

        moved, erased = uuid.uuid4(), uuid.uuid4()
        await writer.create(_memory(namespace, moved, "The user lives in Lisbon.", None))
        await writer.create(_memory(namespace, erased, "The user's locker code is 4417.", None))

        # The first indexer takes both rows and is held inside its batch.
        late = asyncio.create_task(first.run_once())
        await asyncio.wait_for(held.entered.wait(), timeout=30)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            cursor = await admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (FIRST,),
            )
            killed = await cursor.fetchone()
        assert killed is not None and killed[0] >= 1

        # A correction and a deletion land, and the second indexer applies them.
        await writer.update(_memory(namespace, moved, "The user moved to Porto in May.", 1))
        assert await writer.delete(namespace, erased, None)
        while await second.run_once():
            pass

        async def state() -> tuple[set[tuple[uuid.UUID, int]], set[uuid.UUID]]:
            """(memory, revision) of the hits nearest each memory's texts; the ids held."""
            hits: set[tuple[uuid.UUID, int]] = set()
            for text in (
                "The user lives in Lisbon.",
                "The user moved to Porto in May.",
                "The user's locker code is 4417.",
            ):
                (vector,) = await model.embed([text])
                found = await indexes[0].search(NamespacedQuery.inside(namespace, vector, 10))
                hits |= {(h.memory_id, h.revision) for h in found}
            return hits, {k[1] for k in await indexes[0].keys() if k[0] == namespace}

        assert await state() == ({(moved, 2)}, {moved})

        # The first indexer's late write of revision 1 of both memories goes out now.
        held.release.set()
        with pytest.raises(StoreUnavailable):
            await late  # its connection is gone: it cannot finish the batch
        assert await state() == ({(moved, 2)}, {moved})
        (porto,) = await model.embed(["The user moved to Porto in May."])
        best = await indexes[0].search(NamespacedQuery.inside(namespace, porto, 1))
        assert best[0].memory_id == moved and best[0].score == pytest.approx(1.0, abs=1e-3)

        # What the first indexer left is applied again (by whichever claims it): same end.
        while await second.run_once() or await first.run_once():
            pass
        assert (await writer.backlog()).depth == 0
        assert await state() == ({(moved, 2)}, {moved})
    finally:
        for index in dict.fromkeys(indexes):
            await index.close()
        for db in databases:
            await db.close()
