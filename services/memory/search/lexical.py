"""Lexical scoring beside the vectors: one tokenisation for every index back-end, and the
fusion of the two scores (issue 21).

Tokenisation is Qdrant's own BM25 model, run in-process by qdrant-edge
(`qdrant_edge.Bm25`; the same tokeniser Qdrant's server-side BM25 uses): Unicode
word tokenizer, lowercased, English stop words dropped, Snowball English stemmer,
each token hashed to a 31-bit integer. A memory's **document vector** is sparse:
one entry per distinct term, its value BM25's saturated term frequency
`tf * (k + 1) / (tf + k * (1 - b + b * length / AVG_LENGTH))` (so the client sends
term frequencies and the engine keeps the statistics). A **query** is the set of its
distinct terms, each weighing 1. Every back-end scores the same vectors with the same
formula: `sum over query terms of idf(term) * weight(term)`, where
`idf = ln(1 + (N - df + 0.5) / (df + 0.5))`, N and df counted over the points of the
query's namespace (Qdrant's IDF modifier with the namespace as its corpus; pgvector
counts them in SQL). The scores are the engine's; the adapters only combine at most
2 x limit of them.

Fusion, for a hybrid query: dense candidates (the cosine's top N) and lexical ones
(BM25's top N) are rescored by both, then

- `score` (the default): `(1 - w) * cosine + w * bm25 / max_bm25`, the BM25 normalised
  by the best one among the candidates (0 when no candidate shares a term);
- `rrf`: `2 (1 - w) / (k + rank_cosine) + 2 w / (k + rank_bm25)` (reciprocal rank
  fusion, weighted; w = 0.5 is the classic one; a candidate sharing no term has no
  lexical rank).

The weight was chosen on the labelled set of tests/memory/search/retrieval_set.py (see
docs/memory.md, "Search modes").
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import qdrant_edge as qe

# BM25's term-frequency saturation and length normalisation (Qdrant's defaults), and the
# expected length of a memory in terms (memories are one or two sentences: the labelled
# set's facts average 9 terms after stop words).
BM25_K = 1.2
BM25_B = 0.75
AVG_LENGTH = 10.0

_MODEL = qe.Bm25(qe.Bm25Config(k=BM25_K, b=BM25_B, avg_len=AVG_LENGTH, language="english"))


class SearchMode(enum.Enum):
    """What a search ranks by."""

    DENSE = "dense"
    LEXICAL = "lexical"
    HYBRID = "hybrid"


class FusionMethod(enum.Enum):
    """How a hybrid search combines the two scores."""

    SCORE = "score"
    RRF = "rrf"


@dataclass(frozen=True, slots=True)
class Fusion:
    """A hybrid search's fusion: method, weight of the lexical side (0..1), RRF's k."""

    method: FusionMethod = FusionMethod.SCORE
    weight: float = 0.2
    rrf_k: int = 60


@dataclass(frozen=True, slots=True)
class LexicalVector:
    """A memory's sparse BM25 document vector: term ids and their saturated frequencies."""

    indices: tuple[int, ...]
    values: tuple[float, ...]

    def weights(self) -> dict[str, float]:
        """Term id (as text, the pgvector lexeme) -> weight."""
        return {str(i): v for i, v in zip(self.indices, self.values, strict=True)}


def document(text: str) -> LexicalVector:
    """The document vector of a memory's content."""
    vector = _MODEL.embed_document(text)
    return LexicalVector(tuple(vector.indices), tuple(vector.values))


def query_terms(text: str) -> tuple[int, ...]:
    """The distinct term ids of a query, sorted (empty: only stop words or punctuation)."""
    return tuple(sorted(set(_MODEL.embed_query(text).indices)))


@dataclass(frozen=True, slots=True)
class Scored:
    """One candidate of a hybrid query: its cosine and BM25 (0: no shared term)."""

    key: uuid.UUID
    dense: float
    lexical: float


def fuse(candidates: Sequence[Scored], fusion: Fusion) -> list[tuple[Scored, float]]:
    """Each candidate with its fused score, best first (ties by key)."""
    w = fusion.weight
    if fusion.method is FusionMethod.SCORE:
        best = max((c.lexical for c in candidates), default=0.0)
        fused = [
            (c, (1 - w) * c.dense + (w * c.lexical / best if best > 0 else 0.0)) for c in candidates
        ]
    else:
        k = fusion.rrf_k
        by_dense = sorted(candidates, key=lambda c: (-c.dense, c.key))
        dense_rank = {c.key: r for r, c in enumerate(by_dense, 1)}
        by_lexical = sorted((c for c in candidates if c.lexical > 0), key=lambda c: -c.lexical)
        lexical_rank = {c.key: r for r, c in enumerate(by_lexical, 1)}
        fused = [
            (
                c,
                2 * (1 - w) / (k + dense_rank[c.key])
                + (2 * w / (k + lexical_rank[c.key]) if c.key in lexical_rank else 0.0),
            )
            for c in candidates
        ]
    fused.sort(key=lambda pair: (-pair[1], pair[0].key))
    return fused


def rescored(score: float, old_dense: float, new_dense: float, fusion: Fusion) -> float:
    """A hybrid score after its cosine changed (a hit indexed at an older revision,
    re-embedded): exact for score fusion; rank fusion keeps the index's ranks."""
    if fusion.method is FusionMethod.SCORE:
        return score + (1 - fusion.weight) * (new_dense - old_dense)
    return score
