"""Qdrant server adapter, through qdrant-client's AsyncQdrantClient (production).

Layout: one collection per embedding model and dimension holds every
namespace; `namespace` is a keyword payload index marked `is_tenant`, so
Qdrant co-locates each tenant's points and plans filtered searches per
tenant. The same client API runs in qdrant-client's local mode (`path=`,
or in memory when neither `url` nor `path` is given), which the tests use.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from qdrant_client import AsyncQdrantClient, models

from services.memory.index import (
    HIT_FIELDS,
    KEY_FIELDS,
    NAMESPACE_FIELD,
    SCROLL_PAGE,
    TAGS_FIELD,
    IndexHit,
    IndexMismatch,
    IndexPoint,
    IndexUnavailable,
    Key,
    NamespacedQuery,
    check_vector,
    checked_points,
    collection_name,
    hit_from_payload,
    key_from_payload,
    point_ids,
)

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
        self.collection = collection_name(model, dimension)
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
                info = await client.get_collection(self.collection)
                params = info.config.params.vectors
                if not isinstance(params, models.VectorParams) or (
                    params.size != self.dimension or params.distance != models.Distance.COSINE
                ):
                    raise IndexMismatch(
                        f"Qdrant collection {self.collection} was made for another vector "
                        f"size or distance (want {self.dimension}, cosine)"
                    )
            else:
                await client.create_collection(
                    self.collection,
                    vectors_config=models.VectorParams(
                        size=self.dimension, distance=models.Distance.COSINE
                    ),
                )
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
        except IndexMismatch:
            raise
        except Exception as exc:
            raise IndexUnavailable(f"cannot open the Qdrant collection: {exc}") from exc
        self._ready = True
        log.info("memory index opened", extra={"index": "qdrant", "collection": self.collection})

    async def upsert(self, points: Sequence[IndexPoint]) -> None:
        if not points:
            return
        structs = [
            models.PointStruct(id=str(pid), vector=list(p.vector), payload=p.payload())
            for pid, p in checked_points(points, self.dimension)
        ]
        client = self._require()
        try:
            await client.upsert(self.collection, points=structs, wait=True)
        except Exception as exc:
            self._ready = False
            raise IndexUnavailable(f"Qdrant upsert failed: {exc}") from exc

    async def delete(self, keys: Sequence[Key]) -> None:
        if not keys:
            return
        client = self._require()
        ids: list[Any] = [str(pid) for pid in point_ids(keys)]
        try:
            await client.delete(
                self.collection, points_selector=models.PointIdsList(points=ids), wait=True
            )
        except Exception as exc:
            self._ready = False
            raise IndexUnavailable(f"Qdrant delete failed: {exc}") from exc

    async def search(self, query: NamespacedQuery) -> list[IndexHit]:
        check_vector(query.vector, self.dimension)
        client = self._require()
        query_filter = models.Filter(
            must=[
                models.FieldCondition(key=t.field, match=models.MatchValue(value=t.value))
                for t in query.terms
            ]
        )
        try:
            response = await client.query_points(
                self.collection,
                query=list(query.vector),
                query_filter=query_filter,
                limit=query.limit,
                with_payload=list(HIT_FIELDS),
            )
        except Exception as exc:
            self._ready = False
            raise IndexUnavailable(f"Qdrant search failed: {exc}") from exc
        return [hit_from_payload(p.payload or {}, p.score) for p in response.points]

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
                found.update(key_from_payload(r.payload or {}) for r in records)
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
