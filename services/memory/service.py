"""MemoryService domain logic: curated memories with provenance, searched by meaning.

Takes a `MemoryStore` (the revisioned record), a `VectorIndex` (the
searchable copy), an `Embedder`, a `SourceChecker` and a `Proposer`; knows
nothing of gRPC or SQL. Writes go to the store only (its outbox feeds the
index), so an index outage never fails a write. Search asks the index for
candidates inside one namespace, then re-reads them from the store: what it
returns is always the current, live revision, whatever the index still holds.

Memories evolve: each has a valid time (when the fact holds) beside its
revision time (when the store learned it). A write may supersede older
memories, closing their validity; reads answer for now or for a past time,
and a memory's history lists every revision. ProposeMemories reads a range
of a transcript and proposes memories, storing nothing.
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

from services.common import metrics as common_metrics
from services.common import validation
from services.common.deadlines import remaining
from services.common.domain import SEQUENCE_MAX, Budget, Entry, Usage
from services.common.errors import invalid_argument
from services.common.pagination import PageTokens, page_size
from services.common.validation import conversation_id
from services.llm.model import require_call, with_defaults
from services.memory import lexical, metrics
from services.memory.config import MemoryConfig
from services.memory.embeddings import Embedder, EmbeddingUnavailable
from services.memory.index import IndexHit, IndexUnavailable, NamespacedQuery, VectorIndex
from services.memory.inputs import (
    SourceInput,
    ValidityInput,
    check_expected_revision,
    check_validity,
    expiry,
    invalid_validity,
    memory_id,
    parse_sources,
    parse_supersedes,
    request_digest,
)
from services.memory.lexical import Fusion, FusionMethod, SearchMode
from services.memory.model import (
    Memory,
    MemorySource,
    MemoryWrite,
    RevisionRecord,
    ScoredMemory,
    SearchResult,
    WriteResult,
    conversation_not_found,
    memory_not_found,
    source_not_found,
)
from services.memory.offline_proposer import OfflineProposer
from services.memory.ports import SourceChecker
from services.memory.proposals import (
    Proposal,
    ProposalLimits,
    Proposer,
    RelatedMemory,
    check_proposals,
)
from services.memory.store import MemoryStore

log = logging.getLogger(__name__)

# The most candidates one search asks the index for.
MAX_CANDIDATES = 2048
# SearchMemories' `limit` when the request leaves it 0 (AIP-158: 0 means the default).
DEFAULT_SEARCH_LIMIT = 8
# ProposeMemories: proposals by default and at most; stored memories matched per entry,
# and shown to the proposer in all.
DEFAULT_PROPOSALS = 8
MAX_PROPOSALS = 32
RELATED_PER_ENTRY = 3
MAX_RELATED = 24


@dataclass(frozen=True, slots=True)
class MemoryPage:
    """A page of memories."""

    memories: Sequence[Memory]
    next_page_token: str


@dataclass(frozen=True, slots=True)
class RevisionPage:
    """A page of a memory's history, oldest first."""

    revisions: Sequence[RevisionRecord]
    next_page_token: str


@dataclass(frozen=True, slots=True)
class ProposeResult:
    """What ProposeMemories answers: checked proposals (nothing stored), the usage of the
    proposer, how many of its proposals were dropped, and which proposer it was."""

    proposals: Sequence[Proposal]
    usage: Usage
    dropped: int
    proposer: str


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
        proposer: Proposer | None = None,
    ) -> None:
        self.store = store
        self.index = index
        self.embedder = embedder
        self.sources = sources
        self.config = config
        self.page_tokens = page_tokens
        self.on_write = on_write or (lambda: None)
        self.now = now
        self.proposer: Proposer = proposer or OfflineProposer(
            max_entry_chars=config.propose_max_entry_chars
        )
        self.default_mode = SearchMode(config.search_mode)
        self.fusion = Fusion(
            FusionMethod(config.hybrid_fusion), config.hybrid_weight, config.hybrid_rrf_k
        )

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

    async def _earliest_source_time(
        self, namespace: str, sources: Sequence[MemorySource]
    ) -> datetime | None:
        """When the earliest entry of the sources was written (a memory's default valid
        time); None if none is found (erased meanwhile: the write's fence decides)."""
        first: dict[uuid.UUID, int] = {}
        for source in sources:
            low = first.get(source.conversation_id)
            first[source.conversation_id] = min(low or source.from_sequence, source.from_sequence)
        found = await asyncio.gather(
            *(self.sources.entries(namespace, cid, seq, seq) for cid, seq in first.items())
        )
        times = [entries[0].created_at for entries in found if entries]
        return min(times) if times else None

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
        validity: ValidityInput | None = None,
    ) -> WriteResult:
        """Create (no expected_revision) or compare-and-swap a memory.

        Create refuses a live id (ALREADY_EXISTS / MEMORY_ALREADY_EXISTS); a
        replace at a revision that is not current is ABORTED / REVISION_CONFLICT
        with `current_revision`. Sources are checked against TranscriptService;
        a source conversation erased meanwhile refuses the write
        (SOURCE_NOT_FOUND), however late. With a request id, a repeat of the
        same request returns the first result and writes nothing (another
        request under that id is REQUEST_ID_REUSED).

        `validity`: when the fact became true (default on a create: the create
        time of its earliest source entry; on a replace: unchanged), when it
        ended (absent: open on a create, unchanged on a replace), and the
        memories it supersedes, closed in the same transaction (see
        MemoryStore.create for what refuses a supersession). Returns the memory
        as stored, whether it was created, and the memories it superseded.
        """
        validation.namespace(namespace)
        validity = validity or ValidityInput()
        request_id = validation.request_id(request_id_text)
        digest = (
            request_digest(
                memory_id_text,
                content,
                sources,
                metadata,
                expected_revision,
                expire_time,
                ttl,
                validity,
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
        supersedes = parse_supersedes(validity.supersedes, mid)
        valid_from, valid_until = validity.valid_from_time, validity.valid_until_time
        check_validity(valid_from, valid_until)
        incarnations = await self._check_sources_exist(namespace, parsed_sources)
        if valid_from is None and expected_revision is None:
            valid_from = await self._earliest_source_time(namespace, parsed_sources) or self.now()
            if valid_until is not None and valid_until <= valid_from:
                raise invalid_validity(
                    "valid_until_time must be after valid_from_time (by default the create "
                    "time of the earliest source entry)"
                )
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
            valid_from_time=valid_from,
            valid_until_time=valid_until,
            supersedes=supersedes,
        )
        if expected_revision is None:
            result = await self.store.create(write)
        else:
            result = await self.store.update(write)
        self.on_write()
        return result

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
        self,
        namespace: str,
        size: int,
        token: str,
        conversation_id_text: str = "",
        as_of: datetime | None = None,
        ignore_validity: bool = False,
    ) -> MemoryPage:
        """A page of the namespace's live memories in id order (AIP-158): those valid at
        `as_of` (absent: now, the instant of the first page for every page), or all of
        them with `ignore_validity`."""
        validation.namespace(namespace)
        limit = page_size(size)
        cid = conversation_id(conversation_id_text) if conversation_id_text else None
        if ignore_validity and as_of is not None:
            raise invalid_validity(
                "as_of_time and ignore_validity exclude each other", field="as_of_time"
            )
        request: dict[str, object] = {"conversation_id": str(cid) if cid else ""}
        # Only when given: a token of a listing without them stays valid across an upgrade.
        if as_of is not None:
            request["as_of"] = as_of.isoformat()
        if ignore_validity:
            request["ignore_validity"] = True
        after = None
        at = None if ignore_validity else (as_of or self.now())
        if token:
            cursor = self.page_tokens.decode(token, "memories", namespace, request)
            after = uuid.UUID(cursor["after"])
            if at is not None and cursor.get("at"):
                at = datetime.fromisoformat(cursor["at"])
        rows = await self.store.list_memories(namespace, cid, after, limit + 1, valid_at=at)
        page, more = rows[:limit], len(rows) > limit
        next_token = (
            self.page_tokens.encode(
                "memories",
                namespace,
                request,
                {"after": str(page[-1].memory_id), "at": at.isoformat() if at else ""},
            )
            if more
            else ""
        )
        return MemoryPage(page, next_token)

    async def list_revisions(
        self, namespace: str, memory_id_text: str, size: int, token: str
    ) -> RevisionPage:
        """A page of a memory's history, oldest first (AIP-158): every revision with its
        content and validity, or only its number, kind and time once the memory was
        deleted. NOT_FOUND when the memory never existed in this namespace."""
        validation.namespace(namespace)
        mid = memory_id(memory_id_text)
        limit = page_size(size)
        request = {"memory_id": str(mid)}
        after = 0
        if token:
            after = int(self.page_tokens.decode(token, "revisions", namespace, request)["after"])
        rows = await self.store.history(namespace, mid, after, limit + 1)
        if not rows and not token:
            raise memory_not_found()
        page, more = rows[:limit], len(rows) > limit
        next_token = (
            self.page_tokens.encode("revisions", namespace, request, {"after": page[-1].revision})
            if more
            else ""
        )
        return RevisionPage(page, next_token)

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
            if min_score:  # 0, proto3's unset, applies no minimum (never lexical: no cosine)
                scored = [s for s in scored if s.dense is not None and s.dense >= min_score]
            scored.sort(key=lambda s: (-s.score, s.memory.memory_id))
            exhausted = len(hits) < candidates or candidates >= MAX_CANDIDATES
            if len(scored) >= limit or exhausted:
                return scored[:limit]
            # The re-read dropped too many: ask the index for more.
            candidates = min(candidates * 4, MAX_CANDIDATES)

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

    # -- assisted curation ----------------------------------------------------------

    async def _related(
        self, namespace: str, entries: Sequence[Entry], wanted: Mapping[str, str]
    ) -> list[RelatedMemory]:
        """The stored memories valid now (with the `wanted` metadata) that the namespace's
        own search finds for the entries (each entry's text a query), best first, at most
        MAX_RELATED, aliased m1, m2, ... for the proposer."""
        limit = self.config.limits.max_query_bytes
        queries = [
            e.message.text.encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "ignore")
            for e in entries
        ]
        queries = [q for q in queries if q.strip()]
        if not queries:
            return []
        at = self.now()
        best: dict[uuid.UUID, ScoredMemory] = {}
        try:
            vectors = await self.embedder.embed(queries)
            found = [
                await self._semantic(namespace, v, RELATED_PER_ENTRY, wanted, 0.0, at)
                for v in vectors
            ]
        except (IndexUnavailable, EmbeddingUnavailable) as exc:
            self._degraded(exc)
            found = [
                await self.store.text_search(namespace, q, wanted, RELATED_PER_ENTRY, valid_at=at)
                for q in queries
            ]
        for hits in found:
            for hit in hits:
                held = best.get(hit.memory.memory_id)
                if held is None or held.score < hit.score:
                    best[hit.memory.memory_id] = hit
        ranked = sorted(best.values(), key=lambda s: (-s.score, s.memory.memory_id))[:MAX_RELATED]
        return [RelatedMemory(f"m{i}", s.memory, s.score) for i, s in enumerate(ranked, 1)]

    async def propose(
        self,
        namespace: str,
        conversation_id_text: str,
        from_sequence: int,
        through_sequence: int,
        budget: Budget,
        max_proposals: int = 0,
        metadata_filter: Mapping[str, str] | None = None,
    ) -> ProposeResult:
        """Proposals of memories from a range of a conversation; stores nothing.

        Reads the entries through TranscriptService, finds the related memories with
        the namespace's own search, and asks the proposer (one call, charged to
        `budget`, whose zero fields take the server's defaults, within the request's
        deadline). Every proposal is checked: well formed, sources inside the range
        read, a related memory among those shown; the others are dropped and
        counted, never returned. The application confirms a proposal by calling
        UpsertMemory with it. Retracted entries are not read (what a writer took back
        is no fact), and only memories with the `metadata_filter` pairs are matched.
        """
        validation.namespace(namespace)
        wanted = validation.metadata(metadata_filter or {}, "metadata_filter")
        cid = conversation_id(conversation_id_text)
        if not 1 <= from_sequence <= through_sequence:
            raise invalid_argument(
                "INVALID_SOURCE_RANGE",
                "give 1 <= from_sequence <= through_sequence",
                field="from_sequence" if from_sequence < 1 else "through_sequence",
            )
        longest = self.config.propose_max_entries
        if through_sequence - from_sequence >= longest:
            raise invalid_argument(
                "RANGE_TOO_LONG",
                f"ProposeMemories reads at most {longest} entries at a time",
                field="through_sequence",
                limit=longest,
            )
        if max_proposals == 0:
            max_proposals = DEFAULT_PROPOSALS
        validation.in_range(
            max_proposals, (1, MAX_PROPOSALS), "max_proposals", "INVALID_MAX_PROPOSALS"
        )
        limits = with_defaults(budget, self.config.propose_budget)
        left = require_call(limits, Usage())
        state = await self.sources.conversation(namespace, cid)
        if state is None:
            raise conversation_not_found()
        if through_sequence > state.last_sequence:
            raise invalid_argument(
                "SOURCE_OUT_OF_RANGE",
                "through_sequence goes beyond the end of the transcript",
                field="through_sequence",
                last_sequence=state.last_sequence,
            )
        read = await self.sources.entries(namespace, cid, from_sequence, through_sequence)
        if not read:
            raise conversation_not_found()  # erased since it was found
        entries = [e for e in read if not e.retracted_version]
        if not entries:  # everything in the range was taken back: nothing to propose
            return ProposeResult((), Usage(), 0, self.proposer.provider)
        related = await self._related(namespace, entries, wanted)
        prompt = self.proposer.prepare(
            entries,
            related,
            max_proposals=max_proposals,
            max_output_tokens=min(self.config.propose_max_output_tokens, left.max_output_tokens),
        )
        require_call(limits, Usage(), prompt.input_tokens)
        output = await self.proposer.propose(
            prompt, timeout=remaining(self.config.proposer_timeout_s)
        )
        proposals, dropped = check_proposals(
            output.items,
            ProposalLimits(
                cid,
                from_sequence,
                through_sequence,
                self.config.limits.max_content_bytes,
                self.config.limits.max_sources,
                max_proposals,
            ),
            entries,
            related,
        )
        if dropped:
            # Counted in the response; logged with the proposer, never with content.
            log.info(
                "memory proposals dropped",
                extra={"dropped": dropped, "proposer": self.proposer.provider},
            )
        return ProposeResult(proposals, output.usage, dropped, self.proposer.provider)
