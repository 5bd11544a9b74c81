"""The records of the vector index and their rules: points, tombstones, queries (built
only inside a namespace), hits, payload fields, ids and collection names. No I/O: the
interface is in protocol.py, the design in this package's docstring."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.common import validation
from services.memory.model import Key
from services.memory.search.lexical import Fusion, LexicalVector, Scored, SearchMode, fuse

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
