"""Qdrant Edge adapter: the Qdrant engine in-process (qdrant-edge-py), the embedded default.

The shard lives under `<directory>/<collection>`; one process opens it at a
time. Its calls are synchronous and CPU-bound, so they run in worker threads
off the event loop.

Revision guard: qdrant-edge's conditional upsert (`upsert_points(points,
condition=Filter)`) updates an existing point only when it matches the
condition, and inserts absent points regardless; the engine evaluates it
inside the update, under the shard's write lock. The condition names each
point with its own revision bound (`has_id` AND `revision` below it), so one
batch carries every point's guard. A tombstone is a vectorless point written
the same way. A point with no lexical vector (copied from a shard made before
them) is also replaced at its own revision, by a write that brings one. The
guards are the filters both Qdrant engines share (qdrant/filters.py).

Lexical: a sparse vector `lexical` with the IDF modifier beside the dense one;
searches compute the IDF over the namespace's points (`IdfParams(corpus=...)`).
A hybrid search is one `query_batch` of two requests over the same prefetched
candidates (the dense top N and the lexical top N): one rescores them by cosine,
the other by BM25; the adapter fuses the two scores (services/memory/search/lexical.py).
A shard made before lexical vectors (`<collection>`) cannot gain one: at the
first start it is copied into `<collection>_lex` (vectors, payloads and
tombstones; about 10 s per 100,000 points here), and the outbox replay of
migration 0005 adds the lexical vectors while the service runs. The old shard
is left for the operator to remove.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import qdrant_edge as qe

from services.memory.index.model import (
    DELETED_AT_FIELD,
    HIT_FIELDS,
    KEY_FIELDS,
    LEXICAL_VECTOR,
    NAMESPACE_FIELD,
    OPEN_END,
    SCROLL_PAGE,
    TAGS_FIELD,
    VALID_FROM_FIELD,
    VALID_UNTIL_FIELD,
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
from services.memory.index.qdrant.filters import (
    Spelling,
    before_validity,
    conditions,
    point_vectors,
    query_terms,
    tombstone_guard,
    upsert_guard,
)
from services.memory.model import Key
from services.memory.search.lexical import SearchMode

log = logging.getLogger(__name__)

T = TypeVar("T")


# qdrant-edge-py's spelling of the filters both Qdrant engines share.
_EDGE = Spelling(
    filter=qe.Filter,
    has_id=lambda pid: qe.HasIdCondition({pid}),
    field_range=lambda key, **bounds: qe.FieldCondition(key=key, range=qe.RangeFloat(**bounds)),
    match=lambda key, value: qe.FieldCondition(key=key, match=qe.MatchValue(value)),
    has_vector=qe.HasVectorCondition,
    is_empty=qe.IsEmptyCondition,
    sparse=qe.SparseVector,
)

# Candidates found on the int8 copy, twice as many as asked, rescored on the full vectors.
_RESCORED = qe.SearchParams(
    quantization=qe.QuantizationSearchParams(rescore=True, oversampling=2.0)
)


class EdgeIndex:
    """VectorIndex on a Qdrant Edge shard."""

    name = "edge"

    def __init__(self, directory: Path, model: str, dimension: int) -> None:
        self.dimension = dimension
        self.path = directory / hybrid_collection_name(model, dimension)
        # A shard made before lexical vectors: copied into `path` at the first start.
        self.legacy_path = directory / collection_name(model, dimension)
        self._shard: Any = None

    def _config(self, *, lexical: bool = True) -> Any:
        # Bounded memory: the full vectors stay cold on disk (memory-mapped, read
        # only to rescore a query's candidates), an int8 copy (384 bytes a point)
        # is what stays in RAM, the HNSW graph is cached. Measured at 100,000
        # points: 105 MiB anonymous + 449 MiB file-backed (reclaimable) resident,
        # against 68 + 721 MiB with the vectors cached, filtered top-10 0.76 ms
        # against 0.39 ms, recall@10 1.000 both (with rescoring; 0.963 without).
        # Payloads are small (ids, revision, tags) and read on every hit: keep
        # them cached rather than cold (at 100,000 optimized points, a filtered
        # top-28 measured 1.9 ms with cold payloads, 0.2 ms without payloads).
        # A shard made with another placement takes this one when it is loaded.
        return qe.EdgeConfig(
            vectors=qe.EdgeVectorParams(
                self.dimension,
                qe.Distance.Cosine,
                memory=qe.Memory.Cold,
                quantization_config=qe.ScalarQuantizationConfig(
                    qe.ScalarType.Int8, quantile=0.99, memory=qe.Memory.Pinned
                ),
                hnsw_config=qe.HnswIndexConfig(16, 100, 10_000, memory=qe.Memory.Cached),
            ),
            sparse_vectors={LEXICAL_VECTOR: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)}
            if lexical
            else None,
            payload_memory=qe.Memory.Cached,
        )

    def _load(self, path: Path, *, lexical: bool = True) -> Any:
        try:
            # With a config, load() checks it against the stored segments.
            return qe.EdgeShard.load(str(path), self._config(lexical=lexical))
        except Exception as exc:
            if "incompatible" in str(exc).lower():
                raise IndexMismatch(
                    f"the Qdrant Edge shard at {path} was made for another vector "
                    f"size or distance (want {self.dimension}, cosine): {exc}"
                ) from None
            raise

    def _copy_legacy(self, shard: Any) -> None:
        """Copy every point and tombstone of the shard made before lexical vectors."""
        legacy = self._load(self.legacy_path, lexical=False)
        try:
            offset = None
            copied = 0
            while True:
                records, offset = legacy.scroll(
                    qe.ScrollRequest(
                        offset=offset, limit=SCROLL_PAGE, with_payload=True, with_vector=True
                    )
                )
                points = [qe.Point(r.id, r.vector or {}, r.payload) for r in records]
                if points:
                    shard.update(qe.UpdateOperation.upsert_points(points))
                copied += len(points)
                if offset is None:
                    break
        finally:
            legacy.close()
        log.info(
            "memory index: shard made before lexical vectors copied",
            extra={"from": str(self.legacy_path), "to": str(self.path), "points": copied},
        )

    def _open(self) -> Any:
        if (self.path / "edge_config.json").exists():
            shard = self._load(self.path)
        else:
            legacy = (self.legacy_path / "edge_config.json").exists()
            if legacy:
                # Refuse a legacy shard of another size before making anything.
                self._load(self.legacy_path, lexical=False).close()
            # Made under a temporary name and renamed when complete: a crash during
            # the copy leaves no half-copied shard that a restart would take as done.
            building = self.path.with_name(self.path.name + ".building")
            if building.exists():
                shutil.rmtree(building)
            building.mkdir(parents=True)
            shard = qe.EdgeShard.create(str(building), self._config())
            if legacy:
                self._copy_legacy(shard)
            shard.close()
            building.rename(self.path)
            shard = self._load(self.path)
        indexes: dict[str, qe.KeywordIndexParams | qe.FloatIndexParams] = {
            NAMESPACE_FIELD: qe.KeywordIndexParams(is_tenant=True),
            TAGS_FIELD: qe.KeywordIndexParams(),
            # The tombstone pruning's range filter (a shard made before tombstones gets it now).
            DELETED_AT_FIELD: qe.FloatIndexParams(),
            # The valid-time ranges of every search.
            VALID_FROM_FIELD: qe.FloatIndexParams(),
            VALID_UNTIL_FIELD: qe.FloatIndexParams(),
        }
        held = shard.info().payload_schema
        if VALID_UNTIL_FIELD not in held:
            # A shard made before valid time: give its points an open validity first
            # (the field index, made after, says this was done).
            shard.update(
                qe.UpdateOperation.set_payload_by_filter(
                    before_validity(_EDGE), {VALID_FROM_FIELD: 0.0, VALID_UNTIL_FIELD: OPEN_END}
                )
            )
        for field, params in indexes.items():
            if field not in held:
                shard.update(qe.UpdateOperation.create_field_index(field, params))
        return shard

    async def start(self) -> None:
        if self._shard is not None:
            return
        try:
            self._shard = await asyncio.to_thread(self._open)
        except IndexMismatch:
            raise
        except Exception as exc:
            raise IndexUnavailable(f"cannot open the Edge shard: {exc}") from exc
        log.info("memory index opened", extra={"index": "edge", "path": str(self.path)})

    async def _call(self, work: Callable[[Any], T]) -> T:
        shard = self._shard
        if shard is None:
            raise IndexUnavailable("the Edge shard is closed")
        try:
            return await asyncio.to_thread(work, shard)
        except Exception as exc:
            raise IndexUnavailable(f"Edge shard call failed: {exc}") from exc

    async def upsert(self, points: Sequence[IndexPoint]) -> None:
        if not points:
            return
        checked = checked_points(points, self.dimension)
        built = [
            qe.Point(str(pid), point_vectors(_EDGE, p.vector, p.lexical), p.payload())
            for pid, p in checked
        ]
        operation = qe.UpdateOperation.upsert_points(built, condition=upsert_guard(_EDGE, checked))
        await self._call(lambda shard: shard.update(operation))

    async def delete(self, tombstones: Sequence[Tombstone]) -> None:
        if not tombstones:
            return
        now = time.time()
        entries = tombstone_points(tombstones)
        built = [qe.Point(str(pid), {}, t.payload(now)) for pid, t in entries]
        operation = qe.UpdateOperation.upsert_points(
            built, condition=tombstone_guard(_EDGE, entries)
        )
        await self._call(lambda shard: shard.update(operation))

    async def purge(self, keys: Sequence[Key]) -> None:
        if not keys:
            return
        ids: list[qe.PointId] = [str(pid) for pid in point_ids(keys)]
        await self._call(lambda shard: shard.update(qe.UpdateOperation.delete_points(ids)))

    async def prune_tombstones(self, older_than_s: float) -> None:
        expired = qe.Filter(
            must=[
                qe.FieldCondition(
                    key=DELETED_AT_FIELD, range=qe.RangeFloat(lte=time.time() - older_than_s)
                )
            ]
        )
        operation = qe.UpdateOperation.delete_points_by_filter(expired)
        await self._call(lambda shard: shard.update(operation))

    async def search(self, query: NamespacedQuery) -> list[IndexHit]:
        check_vector(query.vector, self.dimension)
        where = conditions(_EDGE, query.terms)
        dense = qe.Query.Nearest(list(query.vector))
        if query.mode is SearchMode.DENSE or (
            query.mode is SearchMode.HYBRID and not query.lexical
        ):
            request = qe.QueryRequest(
                limit=query.limit,
                query=dense,
                filter=where,
                with_payload=list(HIT_FIELDS),
                params=_RESCORED,
            )
            points = await self._call(lambda shard: shard.query(request))
            if query.mode is SearchMode.HYBRID:  # no term to match: the cosine alone
                return fused_hits([(p.payload, p.score) for p in points], [], query)
            return [hit_from_payload(p.payload, p.score) for p in points]
        if not query.lexical:
            return []
        terms = query_terms(_EDGE, query.lexical)
        # The IDF statistics of the namespace's points (tombstones have no namespace).
        params = qe.SearchParams(idf=qe.IdfParams(corpus=conditions(_EDGE, query.namespace_only())))
        bm25 = qe.Query.Nearest(terms, using=LEXICAL_VECTOR)
        if query.mode is SearchMode.LEXICAL:
            request = qe.QueryRequest(
                limit=query.limit,
                query=bm25,
                filter=where,
                params=params,
                with_payload=list(HIT_FIELDS),
            )
            points = await self._call(lambda shard: shard.query(request))
            return [hit_from_payload(p.payload, p.score, lexical=True) for p in points]
        candidates = [
            qe.Prefetch(limit=query.limit, query=dense, filter=where, params=_RESCORED),
            qe.Prefetch(limit=query.limit, query=bm25, filter=where, params=params),
        ]
        both = 2 * query.limit
        batch = qe.QueryBatchRequest(
            [
                qe.QueryRequest(
                    limit=both,
                    prefetches=candidates,
                    query=dense,
                    filter=where,
                    with_payload=list(HIT_FIELDS),
                    params=_RESCORED,
                ),
                qe.QueryRequest(
                    limit=both,
                    prefetches=candidates,
                    query=bm25,
                    filter=where,
                    params=params,
                    with_payload=list(HIT_FIELDS),
                ),
            ]
        )
        by_cosine, by_bm25 = await self._call(lambda shard: shard.query_batch(batch))
        return fused_hits(
            [(p.payload, p.score) for p in by_cosine],
            [(p.payload, p.score) for p in by_bm25],
            query,
        )

    async def keys(self) -> set[Key]:
        def scan(shard: Any) -> set[Key]:
            found: set[Key] = set()
            offset = None
            while True:
                records, offset = shard.scroll(
                    qe.ScrollRequest(
                        offset=offset,
                        limit=SCROLL_PAGE,
                        with_payload=list(KEY_FIELDS),
                    )
                )
                found.update(k for r in records if (k := key_from_payload(r.payload)))
                if offset is None:
                    return found

        return await self._call(scan)

    async def optimize(self) -> None:
        # Builds the HNSW graph of full segments (slow on big shards: tens of seconds).
        await self._call(lambda shard: shard.optimize())

    async def close(self) -> None:
        shard, self._shard = self._shard, None
        if shard is not None:
            await asyncio.to_thread(shard.close)
