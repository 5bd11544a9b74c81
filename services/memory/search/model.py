"""The records of a search's answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.memory.model import Memory


@dataclass(frozen=True, slots=True)
class ScoredMemory:
    """A search hit: the current revision, the score it was ranked by, and its parts
    (the cosine, the BM25 score) where the mode has them."""

    memory: Memory
    score: float
    dense: float | None = None
    lexical: float | None = None


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Hits, best first, and whether they came from the full-text fallback."""

    hits: Sequence[ScoredMemory]
    degraded: bool
    # "dense", "lexical" or "hybrid"; "" when degraded.
    mode: str = ""
