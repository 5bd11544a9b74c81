"""MemoryService domain logic: curated memories with provenance, searched by meaning.

Takes a `MemoryStore` (the revisioned record), a `VectorIndex` (the
searchable copy), an `Embedder` and a `SourceChecker`; knows nothing of
gRPC or SQL. Writes go to the store only (its outbox feeds the index), so
an index outage never fails a write. Search asks the index for candidates
inside one namespace, then re-reads them from the store: what it returns is
always the current, live revision, whatever the index still holds.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import uuid_utils

from services.common import metrics, validation
from services.common.domain import SEQUENCE_MAX
from services.common.errors import invalid_argument
from services.common.pagination import PageTokens, page_size
from services.common.validation import conversation_id
from services.memory.config import MemoryConfig
from services.memory.embeddings import Embedder, EmbeddingUnavailable
from services.memory.index import IndexHit, IndexUnavailable, NamespacedQuery, VectorIndex
from services.memory.inputs import (
    SourceInput,
    check_expected_revision,
    expiry,
    memory_id,
    parse_sources,
    request_digest,
)
from services.memory.model import (
    Memory,
    MemorySource,
    MemoryWrite,
    ScoredMemory,
    SearchResult,
    memory_not_found,
    source_not_found,
)
from services.memory.ports import SourceChecker
from services.memory.store import MemoryStore

log = logging.getLogger(__name__)

# The most candidates one search asks the index for.
MAX_CANDIDATES = 2048
# SearchMemories' `limit` when the request leaves it 0 (AIP-158: 0 means the default).
DEFAULT_SEARCH_LIMIT = 8


@dataclass(frozen=True, slots=True)
class MemoryPage:
    """A page of memories."""

    memories: Sequence[Memory]
    next_page_token: str


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


class MemoryService:
    """Semantic memories of many namespaces."""

    def __init__(
        self,
        store: MemoryStore,
        index: VectorIndex,
        embedder: Embedder,
        sources: SourceChecker,
        config: MemoryConfig,
        page_tokens: PageTokens,
        *,
        on_write: Callable[[], None] | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.index = index
        self.embedder = embedder
        self.sources = sources
        self.config = config
        self.page_tokens = page_tokens
        self.on_write = on_write or (lambda: None)
        self.now = now

    # -- writes -------------------------------------------------------------

    async def _check_sources_exist(
        self, namespace: str, sources: Sequence[MemorySource]
    ) -> dict[uuid.UUID, int]:
        """Each conversation exists in this namespace and each range lies inside it.
        Returns the incarnation of each source conversation (the write carries them, so
        that an erasure between this check and the write still fences it)."""
        conversations = list(dict.fromkeys(s.conversation_id for s in sources))
        found = await asyncio.gather(
            *(self.sources.conversation(namespace, cid) for cid in conversations)
        )
        state_of = dict(zip(conversations, found, strict=True))
        for i, source in enumerate(sources):
            state = state_of[source.conversation_id]
            if state is None:
                raise source_not_found(i)
            if source.through_sequence > state.last_sequence:
                raise invalid_argument(
                    "SOURCE_OUT_OF_RANGE",
                    f"sources[{i}].through_sequence {source.through_sequence} is beyond the "
                    f"end of its transcript: the last sequence is {state.last_sequence}",
                    field=f"sources[{i}].through_sequence",
                    last_sequence=state.last_sequence,
                )
        return {cid: state.incarnation for cid, state in state_of.items() if state is not None}

    async def upsert(
        self,
        namespace: str,
        memory_id_text: str,
        content: str,
        sources: Sequence[SourceInput],
        metadata: Mapping[str, str],
        expected_revision: int | None,
        expire_time: datetime | None = None,
        ttl: timedelta | None = None,
        request_id_text: str = "",
    ) -> tuple[Memory, bool]:
        """Create (no expected_revision) or compare-and-swap a memory.

        Create refuses a live id (ALREADY_EXISTS / MEMORY_ALREADY_EXISTS); a
        replace at a revision that is not current is ABORTED / REVISION_CONFLICT
        with `current_revision`. Sources are checked against TranscriptService;
        a source conversation erased meanwhile refuses the write
        (SOURCE_NOT_FOUND), however late. With a request id, a repeat of the
        same request returns the first result and writes nothing (another
        request under that id is REQUEST_ID_REUSED). Returns the memory as
        stored and whether it was created.
        """
        validation.namespace(namespace)
        request_id = validation.request_id(request_id_text)
        digest = (
            request_digest(
                memory_id_text, content, sources, metadata, expected_revision, expire_time, ttl
            )
            if request_id is not None
            else b""
        )
        limits = self.config.limits
        if memory_id_text:
            mid = memory_id(memory_id_text)
        elif expected_revision is not None:
            raise invalid_argument(
                "INVALID_MEMORY_ID", "a replace must name the memory", field="memory_id"
            )
        else:
            mid = uuid.UUID(str(uuid_utils.uuid7()))
        check_expected_revision(expected_revision)
        validation.text(
            content,
            "content",
            max_bytes=limits.max_content_bytes,
            reason="INVALID_CONTENT",
            required=True,
        )
        parsed_sources = parse_sources(sources, self.config.limits.max_sources)
        clean_metadata = validation.metadata(metadata)
        expires = expiry(self.now(), expire_time, ttl, self.config.ttl_for(namespace))
        incarnations = await self._check_sources_exist(namespace, parsed_sources)
        write = MemoryWrite(
            namespace=namespace,
            memory_id=mid,
            content=content,
            sources=parsed_sources,
            metadata=clean_metadata,
            expected_revision=expected_revision,
            expire_time=expires,
            embedding_model=self.embedder.model,
            embedding_dimension=self.embedder.dimension,
            source_incarnations=incarnations,
            request_id=request_id,
            payload_hash=digest,
        )
        if expected_revision is None:
            memory, created = await self.store.create(write)
        else:
            memory, created = await self.store.update(write)
        self.on_write()
        return memory, created

    async def delete(
        self, namespace: str, memory_id_text: str, expected_revision: int | None
    ) -> bool:
        """Delete a memory (its history keeps a tombstone, without content).

        False when it did not exist; REVISION_CONFLICT when `expected_revision`
        is not current.
        """
        validation.namespace(namespace)
        mid = memory_id(memory_id_text)
        check_expected_revision(expected_revision)
        deleted = await self.store.delete(namespace, mid, expected_revision)
        self.on_write()
        return deleted

    async def forget_source(
        self,
        namespace: str,
        conversation_id_text: str,
        from_sequence: int,
        through_sequence: int,
        incarnation: int = 0,
    ) -> int:
        """Delete every memory with a source overlapping a range of a conversation.

        from_sequence = through_sequence = 0 means the whole conversation. The
        conversation need not exist any more. With an `incarnation` (the erasure of
        the whole conversation) the erasure is also fenced: a memory whose sources
        were checked against that incarnation is refused from now on, even one
        whose source check already ran.
        """
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        if incarnation < 0 or (incarnation and (from_sequence or through_sequence)):
            raise invalid_argument(
                "INVALID_INCARNATION",
                "incarnation is not negative, and erases the whole conversation "
                "(from_sequence = through_sequence = 0)",
                field="incarnation",
            )
        if from_sequence == 0 and through_sequence == 0:
            low, high = 1, SEQUENCE_MAX
        elif 1 <= from_sequence <= through_sequence:
            low, high = from_sequence, through_sequence
        else:
            raise invalid_argument(
                "INVALID_SOURCE_RANGE",
                "give 1 <= from_sequence <= through_sequence, or 0 and 0 for the whole "
                "conversation",
                field="from_sequence",
            )
        count = await self.store.forget_source(namespace, cid, low, high, incarnation)
        if count:
            self.on_write()
        return count

    # -- reads --------------------------------------------------------------

    async def get(self, namespace: str, memory_id_text: str) -> Memory:
        """The live memory; NOT_FOUND if absent, expired or in another namespace."""
        validation.namespace(namespace)
        found = await self.store.get(namespace, memory_id(memory_id_text))
        if found is None:
            raise memory_not_found()
        return found

    async def list_memories(
        self, namespace: str, size: int, token: str, conversation_id_text: str = ""
    ) -> MemoryPage:
        """A page of the namespace's live memories in id order (AIP-158)."""
        validation.namespace(namespace)
        limit = page_size(size)
        cid = conversation_id(conversation_id_text) if conversation_id_text else None
        request = {"conversation_id": str(cid) if cid else ""}
        after = None
        if token:
            cursor = self.page_tokens.decode(token, "memories", namespace, request)
            after = uuid.UUID(cursor["after"])
        rows = await self.store.list_memories(namespace, cid, after, limit + 1)
        page, more = rows[:limit], len(rows) > limit
        next_token = (
            self.page_tokens.encode(
                "memories", namespace, request, {"after": str(page[-1].memory_id)}
            )
            if more
            else ""
        )
        return MemoryPage(page, next_token)

    async def search(
        self,
        namespace: str,
        query: str,
        limit: int,
        metadata_filter: Mapping[str, str] | None = None,
        min_score: float = 0.0,
    ) -> SearchResult:
        """Memories of one namespace closest in meaning to `query`, best first.

        Every hit is the current, live revision re-read from the store, so a
        deleted, expired or superseded memory is never returned even while the
        index lags. A hit whose indexed revision is older than the current one
        is re-scored against its current content. When the index or the
        embedding model is unreachable, the answer comes from full-text search
        (`degraded`; scores are text ranks and `min_score` does not apply).
        `min_score` 0 (the proto default) applies no minimum; `limit` 0 means
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
        try:
            vector = (await self.embedder.embed([query]))[0]
            hits = await self._semantic(namespace, vector, limit, wanted, min_score)
        except (IndexUnavailable, EmbeddingUnavailable) as exc:
            metrics.MEMORY_DEGRADED_SEARCHES.inc()
            metrics.STORE_ERRORS.labels(exc.store).inc()
            log.warning(
                "memory search degraded to full-text",
                extra={"store": exc.store, "detail": getattr(exc, "detail", "")},
            )
            found = await self.store.text_search(namespace, query, wanted, limit)
            return SearchResult(found, degraded=True)
        return SearchResult(hits, degraded=False)

    async def _semantic(
        self,
        namespace: str,
        vector: Sequence[float],
        limit: int,
        wanted: Mapping[str, str],
        min_score: float,
    ) -> list[ScoredMemory]:
        candidates = min(limit * self.config.overfetch + 8, MAX_CANDIDATES)
        # Every candidate met so far, by the revision the index holds: its live
        # memory as re-read and scored, or None (deleted or expired since it was
        # indexed). A wider pass re-reads and re-embeds only what is new to it.
        known: dict[tuple[uuid.UUID, int], ScoredMemory | None] = {}
        while True:
            query = NamespacedQuery.inside(namespace, vector, candidates, wanted)
            hits = await self.index.search(query)
            new = [h for h in hits if (h.memory_id, h.revision) not in known]
            current = {
                m.memory_id: m
                for m in await self.store.get_many(namespace, [h.memory_id for h in new], wanted)
            }
            stale: list[tuple[IndexHit, Memory]] = []
            for hit in new:
                memory = current.pop(hit.memory_id, None)
                if memory is None:
                    known[(hit.memory_id, hit.revision)] = None
                elif memory.revision != hit.revision:
                    stale.append((hit, memory))
                else:
                    known[(hit.memory_id, hit.revision)] = ScoredMemory(memory, hit.score)
            if stale:
                # Corrected since indexed: the index's score was for the old text.
                fresh = await self.embedder.embed([m.content for _, m in stale])
                for (hit, memory), v in zip(stale, fresh, strict=True):
                    known[(hit.memory_id, hit.revision)] = ScoredMemory(memory, _dot(vector, v))
            scored = [s for s in (known[(h.memory_id, h.revision)] for h in hits) if s is not None]
            if min_score:  # 0, proto3's unset, applies no minimum
                scored = [s for s in scored if s.score >= min_score]
            scored.sort(key=lambda s: (-s.score, s.memory.memory_id))
            exhausted = len(hits) < candidates or candidates >= MAX_CANDIDATES
            if len(scored) >= limit or exhausted:
                return scored[:limit]
            # The re-read dropped too many: ask the index for more.
            candidates = min(candidates * 4, MAX_CANDIDATES)
