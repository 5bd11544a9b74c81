"""SearchMemories: the query's rules, the choice of mode, and the answer re-read from the store.

Mixed into MemoryService (as PostgresOutbox is into PostgresMemoryStore): the
service's store, index, embedder and configuration are the ones searched, read
at every call. Search asks the index for candidates inside one namespace, then
re-reads them from the store: what it returns is always the current, live
revision, whatever the index still holds. When the index or the embedding model
is unreachable, the answer comes from the store's full-text search (degraded).
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from services.common import metrics as common_metrics
from services.common import validation
from services.common.errors import invalid_argument
from services.memory import metrics
from services.memory.config import MemoryConfig
from services.memory.embeddings.protocol import Embedder, EmbeddingUnavailable
from services.memory.index.model import IndexHit, NamespacedQuery
from services.memory.index.protocol import IndexUnavailable, VectorIndex
from services.memory.model import Memory
from services.memory.search import lexical
from services.memory.search.lexical import Fusion, SearchMode
from services.memory.search.model import ScoredMemory, SearchResult
from services.memory.store import MemoryStore

log = logging.getLogger(__name__)

# The most candidates one search asks the index for.
MAX_CANDIDATES = 2048
# SearchMemories' `limit` when the request leaves it 0 (AIP-158: 0 means the default).
DEFAULT_SEARCH_LIMIT = 8
# The hits re-read beyond `limit` before the rest of the candidates (a deleted or
# expired memory or two among the best hits is settled without the second read).
HEAD_MARGIN = 2


def _at_least(scored: list[ScoredMemory], min_score: float) -> list[ScoredMemory]:
    """The memories whose cosine reaches `min_score`; 0, proto3's unset, applies no
    minimum (never set for a lexical search: it has no cosine)."""
    if not min_score:
        return scored
    return [s for s in scored if s.dense is not None and s.dense >= min_score]


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


class MemorySearch:
    """The search methods of MemoryService (which sets these attributes)."""

    store: MemoryStore
    index: VectorIndex
    embedder: Embedder
    config: MemoryConfig
    now: Callable[[], datetime]
    default_mode: SearchMode
    fusion: Fusion

    async def search(
        self,
        namespace: str,
        query: str,
        limit: int,
        metadata_filter: Mapping[str, str] | None = None,
        min_score: float = 0.0,
        as_of: datetime | None = None,
        *,
        mode: str = "",
    ) -> SearchResult:
        """Memories of one namespace closest to `query`, best first, among those valid at
        `as_of` (absent: now), ranked as `mode` says ("dense": the cosine, "lexical":
        BM25, "hybrid": both fused; "": the configured default).

        Every hit is the current, live revision re-read from the store, so a
        deleted, expired, superseded (or otherwise not valid at the time asked)
        memory is never returned even while the index lags. A hit whose indexed
        revision is older than the current one is re-scored against its current
        content. When the index or the embedding model is unreachable, the answer
        comes from full-text search (`degraded`; scores are text ranks and
        `min_score` does not apply). `min_score` bounds the cosine (0, the proto
        default, applies no minimum; refused in lexical mode); `limit` 0 means
        DEFAULT_SEARCH_LIMIT.
        """
        validation.namespace(namespace)
        validation.text(
            query,
            "query",
            max_bytes=self.config.limits.max_query_bytes,
            reason="INVALID_QUERY",
            required=True,
        )
        # 0 (the proto default) means the default, as page_size 0 does (AIP-158).
        limit = limit or DEFAULT_SEARCH_LIMIT
        validation.in_range(limit, validation.MEMORY_LIMIT_RANGE, "limit", "INVALID_LIMIT")
        wanted = validation.metadata(metadata_filter or {}, "metadata_filter")
        if not -1.0 <= min_score <= 1.0:  # also rejects NaN
            raise invalid_argument(
                "INVALID_MIN_SCORE", "min_score must be in -1..1", field="min_score"
            )
        chosen = self._mode(mode)
        if chosen is SearchMode.LEXICAL and min_score:
            raise invalid_argument(
                "INVALID_MIN_SCORE",
                "min_score bounds the cosine similarity, which a lexical search has none of",
                field="min_score",
            )
        at = as_of or self.now()
        terms = lexical.query_terms(query) if chosen is not SearchMode.DENSE else ()
        try:
            vector = (await self.embedder.embed([query]))[0]
            hits = await self._semantic(
                namespace, vector, limit, wanted, min_score, at, mode=chosen, terms=terms
            )
        except (IndexUnavailable, EmbeddingUnavailable) as exc:
            self._degraded(exc)
            found = await self.store.text_search(namespace, query, wanted, limit, valid_at=at)
            return SearchResult(found, degraded=True)
        return SearchResult(hits, degraded=False, mode=chosen.value)

    def _mode(self, mode: str) -> SearchMode:
        if not mode:
            return self.default_mode
        try:
            return SearchMode(mode)
        except ValueError:
            raise invalid_argument(
                "INVALID_SEARCH_MODE",
                "mode must be SEARCH_MODE_DENSE, SEARCH_MODE_LEXICAL, SEARCH_MODE_HYBRID or "
                "unspecified",
                field="mode",
            ) from None

    @staticmethod
    def _degraded(exc: IndexUnavailable | EmbeddingUnavailable) -> None:
        metrics.MEMORY_DEGRADED_SEARCHES.inc()
        common_metrics.STORE_ERRORS.labels(exc.store).inc()
        log.warning(
            "memory search degraded to full-text",
            extra={"store": exc.store, "detail": getattr(exc, "detail", "")},
        )

    async def _semantic(
        self,
        namespace: str,
        vector: Sequence[float],
        limit: int,
        wanted: Mapping[str, str],
        min_score: float,
        at: datetime,
        *,
        mode: SearchMode = SearchMode.DENSE,
        terms: Sequence[int] = (),
    ) -> list[ScoredMemory]:
        candidates = min(limit * self.config.overfetch + 8, MAX_CANDIDATES)
        # Every candidate met so far, by the revision the index holds: its live
        # memory as re-read and scored, or None (deleted or expired since it was
        # indexed, or not valid at the time asked). A wider pass re-reads and re-embeds
        # only what is new to it.
        known: dict[tuple[uuid.UUID, int], ScoredMemory | None] = {}
        # Valid time filters inside the engine too: superseded facts crowding the
        # namespace do not push the valid ones out of the candidates.
        valid_at = at.timestamp() if self.config.index_validity_filter else None
        while True:
            query = NamespacedQuery.inside(
                namespace,
                vector,
                candidates,
                wanted,
                valid_at=valid_at,
                mode=mode,
                lexical=terms,
                fusion=self.fusion,
            )
            hits = await self.index.search(query)
            # The head first: the answer usually stands in the best `limit` hits, and
            # re-reading all the candidates was a fifth of a search. The tail is read
            # when the head cannot settle the answer on its own.
            head = min(len(hits), limit + HEAD_MARGIN)
            read = await self._reread(namespace, vector, hits[:head], wanted, at, known)
            scored = _at_least(read, min_score)
            if not self._settled(scored, hits[head:], limit):
                read = await self._reread(namespace, vector, hits, wanted, at, known)
                scored = _at_least(read, min_score)
            exhausted = len(hits) < candidates or candidates >= MAX_CANDIDATES
            if len(scored) >= limit or exhausted:
                return scored[:limit]
            # The re-read dropped too many: ask the index for more.
            candidates = min(candidates * 4, MAX_CANDIDATES)

    @staticmethod
    def _settled(kept: Sequence[ScoredMemory], tail: Sequence[IndexHit], limit: int) -> bool:
        """Whether the head's re-read decides the answer: `limit` live memories kept (at
        or above the minimum score, on their current text), and every hit of the tail
        scored below the last of them by the index. A tail hit's score stands unless
        it was corrected since indexed: the indexer's lag, as for the hits beyond the
        candidates."""
        if len(kept) < limit:
            return not tail
        return all(hit.score < kept[limit - 1].score for hit in tail)

    async def _reread(
        self,
        namespace: str,
        vector: Sequence[float],
        hits: Sequence[IndexHit],
        wanted: Mapping[str, str],
        at: datetime,
        known: dict[tuple[uuid.UUID, int], ScoredMemory | None],
    ) -> list[ScoredMemory]:
        """`hits` re-read from the store (those not in `known` yet), best first."""
        new = [h for h in hits if (h.memory_id, h.revision) not in known]
        current = {
            m.memory_id: m
            for m in await self.store.get_many(
                namespace, [h.memory_id for h in new], wanted, valid_at=at
            )
        }
        stale: list[tuple[IndexHit, Memory]] = []
        for hit in new:
            memory = current.pop(hit.memory_id, None)
            if memory is None:
                known[(hit.memory_id, hit.revision)] = None
            elif memory.revision != hit.revision:
                stale.append((hit, memory))
            else:
                known[(hit.memory_id, hit.revision)] = ScoredMemory(
                    memory, hit.score, hit.dense, hit.lexical
                )
        if stale:
            # Corrected since indexed: the index's cosine was for the old text (its
            # BM25 too; that part stays until the indexer catches up).
            fresh = await self.embedder.embed([m.content for _, m in stale])
            for (hit, memory), v in zip(stale, fresh, strict=True):
                known[(hit.memory_id, hit.revision)] = self._rescored(hit, memory, vector, v)
        scored = [s for s in (known[(h.memory_id, h.revision)] for h in hits) if s is not None]
        scored.sort(key=lambda s: (-s.score, s.memory.memory_id))
        return scored

    def _rescored(
        self, hit: IndexHit, memory: Memory, query: Sequence[float], content: Sequence[float]
    ) -> ScoredMemory:
        """A hit indexed at an older revision, scored against its current content."""
        cosine = _dot(query, content)
        if hit.dense is None:  # lexical: the index's BM25 stands
            return ScoredMemory(memory, hit.score, None, hit.lexical)
        if hit.lexical is None:  # dense
            return ScoredMemory(memory, cosine, cosine, None)
        score = lexical.rescored(hit.score, hit.dense, cosine, self.fusion)
        return ScoredMemory(memory, score, cosine, hit.lexical)
