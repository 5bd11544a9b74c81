"""Qdrant server adapter, through qdrant-client's AsyncQdrantClient (production).

Layout: one collection per embedding model and dimension holds every
namespace, the tenant a payload index (made, checked and upgraded in
collection.py). The same client API runs in qdrant-client's local mode
(`path=`, or in memory when neither `url` nor `path` is given), which the tests
use.

Revision guard: an upsert carries `update_filter` (conditional updates,
Qdrant server and qdrant-client 1.16 and newer, local mode included): an
existing point is replaced only when it matches the filter, an absent one is
inserted. The filter names each point with its own revision bound (`has_id`
AND `revision` below it), so one request guards a whole batch; the server
checks it on the request's own point ids only (no scan, no payload index
needed). Writes go with `ordering=strong` (through the shard's permanent
leader), so every replica evaluates the guards in the same order. A
tombstone is a point with no vector (`vector={}`), written the same way. A
write that brings a lexical vector also replaces a point at its own revision
that has none (a point copied from a collection made before them). The guards
are the filters both Qdrant engines share (filters.py).

Lexical: a sparse vector `lexical` with the IDF modifier beside the dense one;
searches compute the IDF over the namespace's points (`IdfCorpusParams`). A
hybrid search is one `query_batch_points` call of two requests over the same
prefetched candidates (the dense top N and the lexical top N), one rescoring
them by cosine, the other by BM25; the adapter fuses the two scores
(services/memory/search/lexical.py): Qdrant's formula queries cannot normalise a score
by the best of the query, and its RRF returns neither part. A collection made
before lexical vectors is copied into `<collection>_lex` at the first start
(collection.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from qdrant_client import AsyncQdrantClient, models

from services.memory.index.model import (
    DELETED_AT_FIELD,
    HIT_FIELDS,
    KEY_FIELDS,
    LEXICAL_VECTOR,
    SCROLL_PAGE,
    IndexHit,
    IndexPoint,
    NamespacedQuery,
    Tombstone,
    check_vector,
    checked_points,
    collection_name,
    fused_hits,
    hit_from_payload,
    hybrid_collection_name,
    key_from_payload,
    point_ids,
    tombstone_points,
)
from services.memory.index.protocol import IndexMismatch, IndexUnavailable
from services.memory.index.qdrant.collection import ORDERING, QDRANT, open_collection
from services.memory.index.qdrant.filters import (
    conditions,
    point_vectors,
    query_terms,
    tombstone_guard,
    upsert_guard,
)
from services.memory.model import Key
from services.memory.search.lexical import SearchMode

log = logging.getLogger(__name__)


class QdrantIndex:
    """VectorIndex on a Qdrant server (or qdrant-client local mode)."""

    name = "qdrant"

    def __init__(
        self,
        model: str,
        dimension: int,
        *,
        url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 5.0,
        path: str | None = None,
    ) -> None:
        self.dimension = dimension
        self.collection = hybrid_collection_name(model, dimension)
        # A collection made before lexical vectors: copied at the first start.
        self.legacy = collection_name(model, dimension)
        self._options: dict[str, Any] = {"timeout": max(1, int(timeout_s))}
        if url:
            self._options.update(url=url, api_key=api_key or None, check_compatibility=False)
        elif path:
            self._options.update(path=path)
        else:
            self._options.update(location=":memory:")
        self._client: AsyncQdrantClient | None = None
        # The collection was checked or made; cleared by a failure so that the
        # next start() (the indexer calls it before each batch) checks again.
        self._ready = False

    def _require(self) -> AsyncQdrantClient:
        if self._client is None:
            raise IndexUnavailable("the Qdrant client is closed")
        return self._client

    async def start(self) -> None:
        if self._ready and self._client is not None:
            return
        if self._client is None:
            self._client = AsyncQdrantClient(**self._options)
        client = self._client
        try:
            await open_collection(client, self.collection, self.legacy, self.dimension)
        except IndexMismatch:
            raise
        except Exception as exc:
            raise IndexUnavailable(f"cannot open the Qdrant collection: {exc}") from exc
        self._ready = True
        log.info("memory index opened", extra={"index": "qdrant", "collection": self.collection})

    async def _guarded_upsert(
        self, structs: list[models.PointStruct], guard: models.Filter, what: str
    ) -> None:
        client = self._require()
        try:
            await client.upsert(
                self.collection, points=structs, update_filter=guard, wait=True, ordering=ORDERING
            )
        except Exception as exc:
            self._ready = False
            raise IndexUnavailable(f"Qdrant {what} failed: {exc}") from exc

    async def upsert(self, points: Sequence[IndexPoint]) -> None:
        if not points:
            return
        checked = checked_points(points, self.dimension)
        structs = [
            models.PointStruct(
                id=str(pid), vector=point_vectors(QDRANT, p.vector, p.lexical), payload=p.payload()
            )
            for pid, p in checked
        ]
        await self._guarded_upsert(structs, upsert_guard(QDRANT, checked), "upsert")

    async def delete(self, tombstones: Sequence[Tombstone]) -> None:
        if not tombstones:
            return
        now = time.time()
        entries = tombstone_points(tombstones)
        structs = [
            models.PointStruct(id=str(pid), vector={}, payload=t.payload(now)) for pid, t in entries
        ]
        await self._guarded_upsert(structs, tombstone_guard(QDRANT, entries), "delete")

    async def _delete(self, selector: models.PointIdsList | models.FilterSelector) -> None:
        client = self._require()
        try:
            await client.delete(
                self.collection, points_selector=selector, wait=True, ordering=ORDERING
            )
        except Exception as exc:
            self._ready = False
            raise IndexUnavailable(f"Qdrant delete failed: {exc}") from exc

    async def purge(self, keys: Sequence[Key]) -> None:
        if not keys:
            return
        ids: list[Any] = [str(pid) for pid in point_ids(keys)]
        await self._delete(models.PointIdsList(points=ids))

    async def prune_tombstones(self, older_than_s: float) -> None:
        cutoff = models.Range(lte=time.time() - older_than_s)
        await self._delete(
            models.FilterSelector(
                filter=models.Filter(
                    must=[models.FieldCondition(key=DELETED_AT_FIELD, range=cutoff)]
                )
            )
        )

    async def search(self, query: NamespacedQuery) -> list[IndexHit]:
        check_vector(query.vector, self.dimension)
        client = self._require()
        where = conditions(QDRANT, query.terms)
        dense = list(query.vector)
        try:
            if query.mode is SearchMode.DENSE or (
                query.mode is SearchMode.HYBRID and not query.lexical
            ):
                response = await client.query_points(
                    self.collection,
                    query=dense,
                    query_filter=where,
                    limit=query.limit,
                    with_payload=list(HIT_FIELDS),
                )
                if query.mode is SearchMode.HYBRID:  # no term to match: the cosine alone
                    return fused_hits(
                        [(p.payload or {}, p.score) for p in response.points], [], query
                    )
                return [hit_from_payload(p.payload or {}, p.score) for p in response.points]
            if not query.lexical:
                return []
            terms = query_terms(QDRANT, query.lexical)
            # The IDF statistics of the namespace's points (tombstones have no namespace).
            params = models.SearchParams(
                idf=models.IdfCorpusParams(corpus=conditions(QDRANT, query.namespace_only()))
            )
            if query.mode is SearchMode.LEXICAL:
                response = await client.query_points(
                    self.collection,
                    query=terms,
                    using=LEXICAL_VECTOR,
                    query_filter=where,
                    search_params=params,
                    limit=query.limit,
                    with_payload=list(HIT_FIELDS),
                )
                return [
                    hit_from_payload(p.payload or {}, p.score, lexical=True)
                    for p in response.points
                ]
            candidates = [
                models.Prefetch(query=dense, filter=where, limit=query.limit),
                models.Prefetch(
                    query=terms,
                    using=LEXICAL_VECTOR,
                    filter=where,
                    params=params,
                    limit=query.limit,
                ),
            ]
            both = 2 * query.limit
            by_cosine, by_bm25 = await client.query_batch_points(
                self.collection,
                [
                    models.QueryRequest(
                        prefetch=candidates,
                        query=dense,
                        filter=where,
                        limit=both,
                        with_payload=list(HIT_FIELDS),
                    ),
                    models.QueryRequest(
                        prefetch=candidates,
                        query=terms,
                        using=LEXICAL_VECTOR,
                        filter=where,
                        params=params,
                        limit=both,
                        with_payload=list(HIT_FIELDS),
                    ),
                ],
            )
        except Exception as exc:
            self._ready = False
            raise IndexUnavailable(f"Qdrant search failed: {exc}") from exc
        return fused_hits(
            [(p.payload or {}, p.score) for p in by_cosine.points],
            [(p.payload or {}, p.score) for p in by_bm25.points],
            query,
        )

    async def keys(self) -> set[Key]:
        client = self._require()
        found: set[Key] = set()
        offset: Any = None
        try:
            while True:
                records, offset = await client.scroll(
                    self.collection,
                    limit=SCROLL_PAGE,
                    offset=offset,
                    with_payload=list(KEY_FIELDS),
                )
                found.update(k for r in records if (k := key_from_payload(r.payload or {})))
                if offset is None:
                    return found
        except Exception as exc:
            self._ready = False
            raise IndexUnavailable(f"Qdrant scroll failed: {exc}") from exc

    async def optimize(self) -> None:
        """The server builds its indexes in the background."""

    async def close(self) -> None:
        self._ready = False
        client, self._client = self._client, None
        if client is not None:
            await client.close()
