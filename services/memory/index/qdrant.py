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
tombstone is a point with no vector (`vector={}`), written the same way.
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
    hit_from_payload,
    key_from_payload,
    point_ids,
    tombstone_points,
)

log = logging.getLogger(__name__)

# A conditional write goes through the shard's permanent leader: every replica
# then sees the same order of writes, so a revision guard decides the same way.
_ORDERING = models.WriteOrdering.STRONG


def _held_older(bounds: Sequence[tuple[str, int]], *, inclusive: bool) -> models.Filter:
    """Matches an existing point of `bounds` whose revision is below its bound (at or
    below with `inclusive`): the points a conditional write may replace."""
    return models.Filter(
        should=[
            models.Filter(
                must=[
                    models.HasIdCondition(has_id=[pid]),
                    models.FieldCondition(
                        key=REVISION_FIELD,
                        range=models.Range(lte=revision)
                        if inclusive
                        else models.Range(lt=revision),
                    ),
                ]
            )
            for pid, revision in bounds
        ]
    )


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
            models.PointStruct(id=str(pid), vector=list(p.vector), payload=p.payload())
            for pid, p in checked
        ]
        guard = _held_older([(str(pid), p.revision) for pid, p in checked], inclusive=False)
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
        query_filter = models.Filter(must=[c for t in query.terms for c in _condition(t)])
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
