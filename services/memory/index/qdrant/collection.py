"""The Qdrant server adapter's collection (adapter.py): made at the first start, checked
and brought up to date at every other; and how its writes are spelled and ordered.

One collection per embedding model and dimension holds every namespace:
`namespace` is a keyword payload index marked `is_tenant`, so Qdrant co-locates
each tenant's points and plans filtered searches per tenant. Qdrant cannot add a
vector to an existing collection: a collection made before lexical vectors
(`<collection>`) is copied into `<collection>_lex` at the first start (points,
payloads, tombstones), and the outbox replay of migration 0005 adds the lexical
vectors while the service runs. The old collection is left for the operator to
drop. A collection made before valid time or tombstones gets their payload
indexes (and its points an open validity) at the next start.
"""

from __future__ import annotations

import logging
from typing import Any

from qdrant_client import AsyncQdrantClient, models

from services.memory.index.model import (
    DELETED_AT_FIELD,
    LEXICAL_VECTOR,
    NAMESPACE_FIELD,
    OPEN_END,
    REVISION_FIELD,
    SCROLL_PAGE,
    TAGS_FIELD,
    VALID_FROM_FIELD,
    VALID_UNTIL_FIELD,
)
from services.memory.index.protocol import IndexMismatch
from services.memory.index.qdrant.filters import Spelling, before_validity, held_older

log = logging.getLogger(__name__)

# A conditional write goes through the shard's permanent leader: every replica
# then sees the same order of writes, so a revision guard decides the same way.
ORDERING = models.WriteOrdering.STRONG

# qdrant-client's spelling of the filters both Qdrant engines share.
QDRANT = Spelling(
    filter=models.Filter,
    has_id=lambda pid: models.HasIdCondition(has_id=[pid]),
    field_range=lambda key, **bounds: models.FieldCondition(key=key, range=models.Range(**bounds)),
    match=lambda key, value: models.FieldCondition(key=key, match=models.MatchValue(value=value)),
    has_vector=lambda name: models.HasVectorCondition(has_vector=name),
    is_empty=lambda key: models.IsEmptyCondition(is_empty=models.PayloadField(key=key)),
    sparse=lambda indices, values: models.SparseVector(indices=indices, values=values),
)


async def open_collection(
    client: AsyncQdrantClient, collection: str, legacy: str, dimension: int
) -> None:
    """Check `collection` (IndexMismatch unless its dense vector has `dimension` and
    cosine), or make it (copying `legacy`, the collection made before lexical
    vectors, when there is one); then give it what a collection made before valid
    time or tombstones lacks."""
    if await client.collection_exists(collection):
        await _check(client, collection, dimension)
    else:
        copy = await client.collection_exists(legacy)
        if copy:
            await _check(client, legacy, dimension)
        await client.create_collection(
            collection,
            vectors_config=models.VectorParams(size=dimension, distance=models.Distance.COSINE),
            sparse_vectors_config={
                LEXICAL_VECTOR: models.SparseVectorParams(modifier=models.Modifier.IDF)
            },
        )
        if copy:
            await _copy_legacy(client, legacy, collection)
        await client.create_payload_index(
            collection,
            NAMESPACE_FIELD,
            field_schema=models.KeywordIndexParams(
                type=models.KeywordIndexType.KEYWORD, is_tenant=True
            ),
        )
        await client.create_payload_index(
            collection, TAGS_FIELD, field_schema=models.PayloadSchemaType.KEYWORD
        )
    info = await client.get_collection(collection)
    schema = info.payload_schema or {}
    if VALID_UNTIL_FIELD not in schema:
        # A collection made before valid time: give its points an open validity
        # first (the field index, made after, says this was done).
        await client.set_payload(
            collection,
            {VALID_FROM_FIELD: 0.0, VALID_UNTIL_FIELD: OPEN_END},
            points=before_validity(QDRANT),
            wait=True,
            ordering=ORDERING,
        )
    # The tombstone pruning filters on one, every search on the others (a
    # collection made before them gets them now).
    for field in (DELETED_AT_FIELD, VALID_FROM_FIELD, VALID_UNTIL_FIELD):
        if field not in schema:
            await client.create_payload_index(
                collection, field, field_schema=models.PayloadSchemaType.FLOAT
            )


async def _check(client: AsyncQdrantClient, collection: str, dimension: int) -> None:
    """IndexMismatch unless the collection's dense vector has our size and cosine."""
    info = await client.get_collection(collection)
    params = info.config.params.vectors
    if isinstance(params, dict):
        params = params.get("")
    if not isinstance(params, models.VectorParams) or (
        params.size != dimension or params.distance != models.Distance.COSINE
    ):
        raise IndexMismatch(
            f"Qdrant collection {collection} was made for another vector "
            f"size or distance (want {dimension}, cosine)"
        )


async def _copy_legacy(client: AsyncQdrantClient, legacy: str, collection: str) -> None:
    """Copy every point and tombstone of the collection made before lexical vectors
    (guarded: a replica starting at the same time writes nothing older)."""
    offset: Any = None
    copied = 0
    while True:
        records, offset = await client.scroll(
            legacy, limit=SCROLL_PAGE, offset=offset, with_payload=True, with_vectors=True
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
            guard = held_older(
                QDRANT,
                [(str(r.id), int((r.payload or {})[REVISION_FIELD])) for r in records],
                inclusive=False,
            )
            await client.upsert(
                collection, points=structs, update_filter=guard, wait=True, ordering=ORDERING
            )
        copied += len(structs)
        if offset is None:
            break
    log.info(
        "memory index: collection made before lexical vectors copied",
        extra={"from": legacy, "to": collection, "points": copied},
    )
