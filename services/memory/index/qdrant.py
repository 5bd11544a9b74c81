"""Qdrant server adapter, through qdrant-client's AsyncQdrantClient (production).

Layout: one collection per embedding model and dimension holds every
namespace; `namespace` is a keyword payload index marked `is_tenant`, so
Qdrant co-locates each tenant's points and plans filtered searches per
tenant. The same client API runs in qdrant-client's local mode (`path=`,
or in memory when neither `url` nor `path` is given), which the tests use.

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
that has none (a point copied from a collection made before them).

Lexical: a sparse vector `lexical` with the IDF modifier beside the dense one;
searches compute the IDF over the namespace's points (`IdfCorpusParams`). A
hybrid search is one `query_batch_points` call of two requests over the same
prefetched candidates (the dense top N and the lexical top N), one rescoring
them by cosine, the other by BM25; the adapter fuses the two scores
(services/memory/lexical.py): Qdrant's formula queries cannot normalise a score
by the best of the query, and its RRF returns neither part. Qdrant cannot add a
vector to an existing collection: a collection made before lexical vectors
(`<collection>`) is copied into `<collection>_lex` at the first start (points,
payloads, tombstones), and the outbox replay of migration 0005 adds the lexical
vectors while the service runs. The old collection is left for the operator to
drop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from qdrant_client import AsyncQdrantClient, models

from services.memory.index import (
    DELETED_AT_FIELD,
    HIT_FIELDS,
    KEY_FIELDS,
    LEXICAL_VECTOR,
    NAMESPACE_FIELD,
    OPEN_END,
    REVISION_FIELD,
    SCROLL_PAGE,
    TAGS_FIELD,
    VALID_FROM_FIELD,
    VALID_UNTIL_FIELD,
    IndexHit,
    IndexMismatch,
    IndexPoint,
    IndexUnavailable,
    Key,
    NamespacedQuery,
    Term,
    Tombstone,
    ValidAt,
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
from services.memory.lexical import LexicalVector, SearchMode

log = logging.getLogger(__name__)

# A conditional write goes through the shard's permanent leader: every replica
# then sees the same order of writes, so a revision guard decides the same way.
_ORDERING = models.WriteOrdering.STRONG


def _held_older(
    bounds: Sequence[tuple[str, int]], *, inclusive: bool, lexical: Sequence[str] = ()
) -> models.Filter:
    """Matches an existing point of `bounds` whose revision is below its bound (at or
    below with `inclusive`): the points a conditional write may replace. The points
    named in `lexical` (writes that bring a lexical vector) may also replace a point
    at their own revision that has none (never a tombstone: it has no namespace)."""
    clauses: list[Any] = [
        models.Filter(
            must=[
                models.HasIdCondition(has_id=[pid]),
                models.FieldCondition(
                    key=REVISION_FIELD,
                    range=models.Range(lte=revision) if inclusive else models.Range(lt=revision),
                ),
            ]
        )
        for pid, revision in bounds
    ]
    filling = set(lexical)
    clauses += [
        models.Filter(
            must=[
                models.HasIdCondition(has_id=[pid]),
                models.FieldCondition(
                    key=REVISION_FIELD, range=models.Range(gte=revision, lte=revision)
                ),
            ],
            must_not=[
                models.HasVectorCondition(has_vector=LEXICAL_VECTOR),
                models.IsEmptyCondition(is_empty=models.PayloadField(key=NAMESPACE_FIELD)),
            ],
        )
        for pid, revision in bounds
        if pid in filling
    ]
    return models.Filter(should=clauses)


def _vectors(dense: Sequence[float], lexical: LexicalVector | None) -> dict[str, Any]:
    """A point's vectors: the dense one (unnamed) and, when known, the lexical one."""
    if lexical is None:
        return {"": list(dense)}
    return {
        "": list(dense),
        LEXICAL_VECTOR: models.SparseVector(
            indices=list(lexical.indices), values=list(lexical.values)
        ),
    }


def _condition(term: Term | ValidAt) -> list[models.FieldCondition]:
    """The engine's conditions of one query term."""
    if isinstance(term, ValidAt):
        return [
            models.FieldCondition(key=VALID_FROM_FIELD, range=models.Range(lte=term.at)),
            models.FieldCondition(key=VALID_UNTIL_FIELD, range=models.Range(gt=term.at)),
        ]
    return [models.FieldCondition(key=term.field, match=models.MatchValue(value=term.value))]


# Points written before valid time was indexed (no `valid_until`; tombstones have no
# namespace): valid always, as far as the index knows (the store's re-read decides).
_BEFORE_VALIDITY = models.Filter(
    must=[models.IsEmptyCondition(is_empty=models.PayloadField(key=VALID_UNTIL_FIELD))],
    must_not=[models.IsEmptyCondition(is_empty=models.PayloadField(key=NAMESPACE_FIELD))],
)


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
            if await client.collection_exists(self.collection):
                await self._check(client, self.collection)
            else:
                legacy = await client.collection_exists(self.legacy)
                if legacy:
                    await self._check(client, self.legacy)
                await client.create_collection(
                    self.collection,
                    vectors_config=models.VectorParams(
                        size=self.dimension, distance=models.Distance.COSINE
                    ),
                    sparse_vectors_config={
                        LEXICAL_VECTOR: models.SparseVectorParams(modifier=models.Modifier.IDF)
                    },
                )
                if legacy:
                    await self._copy_legacy(client)
                await client.create_payload_index(
                    self.collection,
                    NAMESPACE_FIELD,
                    field_schema=models.KeywordIndexParams(
                        type=models.KeywordIndexType.KEYWORD, is_tenant=True
                    ),
                )
                await client.create_payload_index(
                    self.collection, TAGS_FIELD, field_schema=models.PayloadSchemaType.KEYWORD
                )
            info = await client.get_collection(self.collection)
            schema = info.payload_schema or {}
            if VALID_UNTIL_FIELD not in schema:
                # A collection made before valid time: give its points an open validity
                # first (the field index, made after, says this was done).
                await client.set_payload(
                    self.collection,
                    {VALID_FROM_FIELD: 0.0, VALID_UNTIL_FIELD: OPEN_END},
                    points=_BEFORE_VALIDITY,
                    wait=True,
                    ordering=_ORDERING,
                )
            # The tombstone pruning filters on one, every search on the others (a
            # collection made before them gets them now).
            for field in (DELETED_AT_FIELD, VALID_FROM_FIELD, VALID_UNTIL_FIELD):
                if field not in schema:
                    await client.create_payload_index(
                        self.collection, field, field_schema=models.PayloadSchemaType.FLOAT
                    )
        except IndexMismatch:
            raise
        except Exception as exc:
            raise IndexUnavailable(f"cannot open the Qdrant collection: {exc}") from exc
        self._ready = True
        log.info("memory index opened", extra={"index": "qdrant", "collection": self.collection})

    async def _check(self, client: AsyncQdrantClient, collection: str) -> None:
        """IndexMismatch unless the collection's dense vector has our size and cosine."""
        info = await client.get_collection(collection)
        params = info.config.params.vectors
        if isinstance(params, dict):
            params = params.get("")
        if not isinstance(params, models.VectorParams) or (
            params.size != self.dimension or params.distance != models.Distance.COSINE
        ):
            raise IndexMismatch(
                f"Qdrant collection {collection} was made for another vector "
                f"size or distance (want {self.dimension}, cosine)"
            )

    async def _copy_legacy(self, client: AsyncQdrantClient) -> None:
        """Copy every point and tombstone of the collection made before lexical vectors
        (guarded: a replica starting at the same time writes nothing older)."""
        offset: Any = None
        copied = 0
        while True:
            records, offset = await client.scroll(
                self.legacy, limit=SCROLL_PAGE, offset=offset, with_payload=True, with_vectors=True
            )
            structs = [
                models.PointStruct(
                    id=r.id,
                    # A dense vector, or none (a tombstone).
                    vector={"": r.vector} if isinstance(r.vector, list) else {},
                    payload=r.payload,
                )
                for r in records
            ]
            if structs:
                guard = _held_older(
                    [(str(r.id), int((r.payload or {})[REVISION_FIELD])) for r in records],
                    inclusive=False,
                )
                await client.upsert(
                    self.collection,
                    points=structs,
                    update_filter=guard,
                    wait=True,
                    ordering=_ORDERING,
                )
            copied += len(structs)
            if offset is None:
                break
        log.info(
            "memory index: collection made before lexical vectors copied",
            extra={"from": self.legacy, "to": self.collection, "points": copied},
        )

    async def _guarded_upsert(
        self, structs: list[models.PointStruct], guard: models.Filter, what: str
    ) -> None:
        client = self._require()
        try:
            await client.upsert(
                self.collection, points=structs, update_filter=guard, wait=True, ordering=_ORDERING
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
                id=str(pid), vector=_vectors(p.vector, p.lexical), payload=p.payload()
            )
            for pid, p in checked
        ]
        guard = _held_older(
            [(str(pid), p.revision) for pid, p in checked],
            inclusive=False,
            lexical=[str(pid) for pid, p in checked if p.lexical is not None],
        )
        await self._guarded_upsert(structs, guard, "upsert")

    async def delete(self, tombstones: Sequence[Tombstone]) -> None:
        if not tombstones:
            return
        now = time.time()
        entries = tombstone_points(tombstones)
        structs = [
            models.PointStruct(id=str(pid), vector={}, payload=t.payload(now)) for pid, t in entries
        ]
        guard = _held_older([(str(pid), t.revision) for pid, t in entries], inclusive=True)
        await self._guarded_upsert(structs, guard, "delete")

    async def _delete(self, selector: models.PointIdsList | models.FilterSelector) -> None:
        client = self._require()
        try:
            await client.delete(
                self.collection, points_selector=selector, wait=True, ordering=_ORDERING
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
        where = models.Filter(must=[c for t in query.terms for c in _condition(t)])
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
            terms = models.SparseVector(
                indices=list(query.lexical), values=[1.0] * len(query.lexical)
            )
            # The IDF statistics of the namespace's points (tombstones have no namespace).
            params = models.SearchParams(
                idf=models.IdfCorpusParams(
                    corpus=models.Filter(
                        must=[c for t in query.namespace_only() for c in _condition(t)]
                    )
                )
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
