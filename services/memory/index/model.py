"""The vector index: one interface, three adapters (Qdrant Edge, Qdrant server, pgvector).

The index holds a rebuildable copy of the live memories (a vector and a
small payload: namespace, memory id, revision, metadata tags, valid time;
never the content). PostgreSQL stays the source of truth: search re-reads
every hit from it.

Every write is guarded by the memory's revision, inside the engine's own
write: a point replaces what the index holds for its memory only when its
revision is newer, and a deletion leaves a tombstone at the deletion's
revision (revisions keep counting across a delete, see 0001_memory.sql)
that no older point can pass. So indexers may apply a memory's writes in
any order, or late, and the index still ends at the newest revision. A
tombstone carries no namespace and no vector: no query can reach it. It is
pruned after a retention period (`prune_tombstones`).

Tenancy is enforced here, in one place. The only way to search is
`VectorIndex.search(NamespacedQuery)`, and the only way to make a
`NamespacedQuery` is `NamespacedQuery.inside(namespace, ...)`, which
validates the namespace and puts it first in `terms`. Adapters turn every
term into a condition of their engine (a `Term` an exact match, a `ValidAt`
two ranges on the valid time) and never add or drop one: a search without
the namespace condition cannot be expressed.

Valid time filters inside the engine, so that superseded facts crowding a
namespace do not push the valid ones out of the candidates: a point stores
`valid_from` and `valid_until` (Unix seconds; OPEN_END while the fact holds),
and `ValidAt(t)` matches `valid_from <= t < valid_until`. The store's re-read
stays the authority (the index may lag a supersession).

Lexical scoring (issue 21): a point also holds its BM25 document vector
(services/memory/lexical.py: one tokenisation for every adapter), and a query
has a mode: dense (the cosine), lexical (BM25 inside the engine, its IDF over
the namespace) or hybrid (both engines' candidates, rescored by both and
fused). Each hit reports the scores it was ranked by. A point written before
lexical vectors existed has none; the revision guard lets a write at the same
revision give it one (the outbox replay of migration 0005, or reindex).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from services.common import validation
from services.common.errors import StoreUnavailable
from services.memory.config import MemoryConfig
from services.memory.lexical import Fusion, LexicalVector, Scored, SearchMode, fuse

# Point ids are derived from (namespace, memory id): the same memory id may
# live in two namespaces as two unrelated memories.
_POINT_NAMESPACE = uuid.UUID("6f6c0b2e-7a59-4d0b-9a49-3a1f0c4a2d61")

# Payload fields. The index reads back only the memory id and revision of a
# hit, and the namespace and memory id of a key.
NAMESPACE_FIELD = "namespace"
MEMORY_ID_FIELD = "memory_id"
REVISION_FIELD = "revision"
TAGS_FIELD = "tags"
# On tombstones only: when the deletion was indexed (Unix seconds), for pruning.
DELETED_AT_FIELD = "deleted_at"
# Valid time (Unix seconds): from, and until (OPEN_END while the fact holds).
VALID_FROM_FIELD = "valid_from"
VALID_UNTIL_FIELD = "valid_until"
# The end of an open validity: the year 10000 (a payload holds finite numbers only).
OPEN_END = 253_402_300_800.0
# What a search reads back of each hit, and keys() of each point.
HIT_FIELDS = (MEMORY_ID_FIELD, REVISION_FIELD)
KEY_FIELDS = (NAMESPACE_FIELD, MEMORY_ID_FIELD)

# The name of the sparse BM25 vector in Qdrant collections.
LEXICAL_VECTOR = "lexical"

# Points per page when an adapter scrolls through everything it holds (keys()).
SCROLL_PAGE = 1000


def point_id(namespace: str, memory_id: uuid.UUID) -> uuid.UUID:
    """The index id of a memory: stable, and distinct across namespaces."""
    return uuid.uuid5(_POINT_NAMESPACE, f"{namespace}\x00{memory_id}")


def metadata_tag(key: str, value: str) -> str:
    """One metadata pair as one exact-match keyword (JSON: unambiguous for any key)."""
    return json.dumps([key, value], ensure_ascii=False, separators=(",", ":"))


def collection_name(model: str, dimension: int) -> str:
    """One collection per embedding model and dimension: `runifold_memory_<model>_<dim>`."""
    slug = re.sub(r"[^a-z0-9]+", "_", model.lower()).strip("_")
    return f"runifold_memory_{slug}_{dimension}"


def hybrid_collection_name(model: str, dimension: int) -> str:
    """The Qdrant collection (and Edge shard) with a sparse lexical vector beside the
    dense one: `collection_name` + `_lex`. Qdrant cannot add a vector to an existing
    collection, so the adapters copy a collection made before into this one once."""
    return f"{collection_name(model, dimension)}_lex"


class IndexUnavailable(StoreUnavailable):
    """The index cannot be reached or failed; search degrades, the indexer retries."""

    def __init__(self, detail: str = "") -> None:
        super().__init__("memory_index")
        # Logged by the caller; never sent to clients (the message stays generic).
        self.detail = detail


class IndexMismatch(RuntimeError):
    """An existing collection was made for another vector size or distance: refused."""


@dataclass(frozen=True, slots=True)
class Term:
    """An exact-match condition on one payload field."""

    field: str
    value: str


@dataclass(frozen=True, slots=True)
class ValidAt:
    """Valid at `at` (Unix seconds): `valid_from <= at < valid_until`."""

    at: float

    def matches(self, valid_from: float, valid_until: float) -> bool:
        """The condition, as every engine evaluates it."""
        return valid_from <= self.at < valid_until


_DEFAULT_FUSION = Fusion()


@dataclass(frozen=True, slots=True)
class NamespacedQuery:
    """A nearest-neighbour query confined to one namespace. Build it with `inside`."""

    namespace: str
    vector: Sequence[float]
    limit: int
    terms: tuple[Term | ValidAt, ...]
    _token: object
    mode: SearchMode = SearchMode.DENSE
    # The query's lexical term ids (services/memory/lexical.query_terms), for the
    # lexical and hybrid modes; empty: no term to match (only stop words).
    lexical: tuple[int, ...] = ()
    fusion: Fusion = _DEFAULT_FUSION

    def __post_init__(self) -> None:
        if self._token is not _BUILDER:
            raise TypeError("use NamespacedQuery.inside(namespace, ...)")

    @classmethod
    def inside(
        cls,
        namespace: str,
        vector: Sequence[float],
        limit: int,
        metadata: Mapping[str, str] | None = None,
        *,
        valid_at: float | None = None,
        mode: SearchMode = SearchMode.DENSE,
        lexical: Sequence[int] = (),
        fusion: Fusion | None = None,
    ) -> NamespacedQuery:
        """The query; its first term is always the namespace. With `valid_at` (Unix
        seconds), only points valid at that time match. `mode` says what ranks the
        hits; `lexical` are the query's term ids, `fusion` how hybrid combines."""
        validation.namespace(namespace)
        if limit < 1:
            raise ValueError("limit must be positive")
        terms: list[Term | ValidAt] = [Term(NAMESPACE_FIELD, namespace)]
        terms += [Term(TAGS_FIELD, metadata_tag(k, v)) for k, v in sorted((metadata or {}).items())]
        if valid_at is not None:
            terms.append(ValidAt(valid_at))
        return cls(
            namespace,
            vector,
            limit,
            tuple(terms),
            _BUILDER,
            mode,
            tuple(lexical),
            fusion or Fusion(),
        )

    def namespace_only(self) -> tuple[Term]:
        """The namespace term alone: the corpus of the lexical IDF statistics."""
        first = self.terms[0]
        assert isinstance(first, Term) and first.field == NAMESPACE_FIELD
        return (first,)


_BUILDER = object()


@dataclass(frozen=True, slots=True)
class IndexPoint:
    """What the index stores for one memory."""

    namespace: str
    memory_id: uuid.UUID
    revision: int
    vector: Sequence[float]
    metadata: Mapping[str, str]
    # Valid time, Unix seconds; None: open (OPEN_END).
    valid_from: float = 0.0
    valid_until: float | None = None
    # The BM25 document vector of its content (None: an adapter test's dense-only point).
    lexical: LexicalVector | None = None

    def tags(self) -> list[str]:
        """The metadata as exact-match keywords, in key order."""
        return [metadata_tag(k, v) for k, v in sorted(self.metadata.items())]

    @property
    def valid_end(self) -> float:
        """`valid_until` as stored: OPEN_END while the fact holds."""
        return OPEN_END if self.valid_until is None else self.valid_until

    def payload(self) -> dict[str, object]:
        """The payload stored next to the vector (no content)."""
        return {
            NAMESPACE_FIELD: self.namespace,
            MEMORY_ID_FIELD: str(self.memory_id),
            REVISION_FIELD: self.revision,
            TAGS_FIELD: self.tags(),
            VALID_FROM_FIELD: self.valid_from,
            VALID_UNTIL_FIELD: self.valid_end,
        }


@dataclass(frozen=True, slots=True)
class IndexHit:
    """A hit: which memory, which revision was indexed, the score it was ranked by
    (cosine, BM25 or the fusion, per the query's mode), and the parts it knows."""

    memory_id: uuid.UUID
    revision: int
    score: float
    # The cosine similarity (dense and hybrid modes).
    dense: float | None = None
    # The BM25 score (lexical and hybrid modes; 0 when no term is shared).
    lexical: float | None = None


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A deleted memory as the index keeps it: `revision` is the deletion's revision."""

    namespace: str
    memory_id: uuid.UUID
    revision: int

    def payload(self, deleted_at: float) -> dict[str, object]:
        """The payload of the tombstone point: no namespace and no tags, so that no
        query (whose first term is always the namespace) can ever match it."""
        return {
            MEMORY_ID_FIELD: str(self.memory_id),
            REVISION_FIELD: self.revision,
            DELETED_AT_FIELD: deleted_at,
        }


# (namespace, memory id): what names one memory, in the store and in the index.
Key = tuple[str, uuid.UUID]


class VectorIndex(Protocol):
    """The searchable copy. Failures to reach the engine raise IndexUnavailable."""

    @property
    def name(self) -> str:
        """Adapter name for logs ("edge", "qdrant", "pgvector")."""

    async def start(self) -> None:
        """Create the collection or open it; IndexMismatch if its vector size or distance
        differ. May be called again after close() to reopen."""

    async def upsert(self, points: Sequence[IndexPoint]) -> None:
        """Insert or replace points. A point lands only if the index holds nothing of
        its memory at the same or a newer revision (point or tombstone)."""

    async def delete(self, tombstones: Sequence[Tombstone]) -> None:
        """Replace what the index holds of each memory by a tombstone at the deletion's
        revision, unless it holds a newer revision (the memory was re-created)."""

    async def purge(self, keys: Sequence[Key]) -> None:
        """Remove the points and tombstones of these memories, whatever their revision
        (reindex: points that no live memory backs)."""

    async def prune_tombstones(self, older_than_s: float) -> None:
        """Remove the tombstones written more than `older_than_s` seconds ago."""

    async def search(self, query: NamespacedQuery) -> list[IndexHit]:
        """Nearest neighbours inside the query's namespace, best first."""

    async def keys(self) -> set[Key]:
        """Every (namespace, memory id) with a point (tombstones are not memories):
        reindex and consistency checks only."""

    async def optimize(self) -> None:
        """Build search structures after bulk loads (a no-op where the engine does it)."""

    async def close(self) -> None:
        """Release the engine (idempotent)."""


def check_vector(vector: Sequence[float], dimension: int) -> None:
    """Guard against mixing dimensions in one collection."""
    if len(vector) != dimension:
        raise ValueError(f"vector has {len(vector)} dimensions, the collection {dimension}")


def checked_points(
    points: Sequence[IndexPoint], dimension: int
) -> list[tuple[uuid.UUID, IndexPoint]]:
    """Each point with its index id, after checking its dimension."""
    for p in points:
        check_vector(p.vector, dimension)
    return [(point_id(p.namespace, p.memory_id), p) for p in points]


def point_ids(keys: Sequence[Key]) -> list[uuid.UUID]:
    """The index ids of these memories."""
    return [point_id(namespace, memory_id) for namespace, memory_id in keys]


def tombstone_points(tombstones: Sequence[Tombstone]) -> list[tuple[uuid.UUID, Tombstone]]:
    """Each tombstone with the index id of its memory."""
    return [(point_id(t.namespace, t.memory_id), t) for t in tombstones]


def hit_from_payload(
    payload: Mapping[str, Any], score: float, *, lexical: bool = False
) -> IndexHit:
    """A hit from a payload read with HIT_FIELDS: a cosine, or with `lexical` a BM25 score."""
    mid, revision, value = (
        uuid.UUID(payload[MEMORY_ID_FIELD]),
        int(payload[REVISION_FIELD]),
        float(score),
    )
    if lexical:
        return IndexHit(mid, revision, value, lexical=value)
    return IndexHit(mid, revision, value, dense=value)


def fused_hits(
    dense: Sequence[tuple[Mapping[str, Any], float]],
    lexical: Sequence[tuple[Mapping[str, Any], float]],
    query: NamespacedQuery,
) -> list[IndexHit]:
    """A hybrid query's hits from the engine's two rescorings of the same candidates
    (payload, score): every candidate's cosine, and the BM25 of those sharing a term."""
    revisions: dict[uuid.UUID, int] = {}
    cosine: dict[uuid.UUID, float] = {}
    for payload, score in dense:
        mid = uuid.UUID(payload[MEMORY_ID_FIELD])
        revisions[mid] = int(payload[REVISION_FIELD])
        cosine[mid] = float(score)
    bm25 = {uuid.UUID(p[MEMORY_ID_FIELD]): float(s) for p, s in lexical}
    candidates = [Scored(mid, c, bm25.get(mid, 0.0)) for mid, c in cosine.items()]
    return [
        IndexHit(c.key, revisions[c.key], fused, dense=c.dense, lexical=c.lexical)
        for c, fused in fuse(candidates, query.fusion)[: query.limit]
    ]


def key_from_payload(payload: Mapping[str, Any]) -> Key | None:
    """A key from a payload read with KEY_FIELDS; None for a tombstone (no namespace)."""
    if NAMESPACE_FIELD not in payload:
        return None
    return payload[NAMESPACE_FIELD], uuid.UUID(payload[MEMORY_ID_FIELD])


def make_index(
    config: MemoryConfig, *, model: str, dimension: int, edge_dir: Path, database_url: str
) -> VectorIndex:
    """The adapter named by RUNIFOLD_MEMORY_INDEX (edge, qdrant or pgvector), for one
    embedding model and dimension.

    `edge_dir` is where the Edge shard lives unless RUNIFOLD_MEMORY_INDEX_DIR says;
    pgvector uses `database_url` unless RUNIFOLD_MEMORY_PGVECTOR_URL says.
    """
    if config.index == "edge":
        from services.memory.index.edge import EdgeIndex

        return EdgeIndex(config.index_dir or edge_dir, model, dimension)
    if config.index == "qdrant":
        from services.memory.index.qdrant import QdrantIndex

        return QdrantIndex(
            model,
            dimension,
            url=config.qdrant_url,
            api_key=config.qdrant_api_key,
            timeout_s=config.qdrant_timeout_s,
        )
    if config.index == "pgvector":
        from services.memory.index.pgvector import PgvectorIndex

        return PgvectorIndex(
            config.pgvector_url or database_url,
            model,
            dimension,
            ef_search=config.pgvector_ef_search,
            exact_below=config.pgvector_exact_below,
            timeout_s=config.pgvector_timeout_s,
        )
    raise ValueError(f"unknown index kind {config.index!r}")
