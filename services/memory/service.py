"""MemoryService domain logic: curated memories with provenance, searched by meaning.

Takes a `MemoryStore` (the revisioned record), a `VectorIndex` (the
searchable copy), an `Embedder`, a `SourceChecker` and a `Proposer`; knows
nothing of gRPC or SQL. Writes go to the store only (its outbox feeds the
index), so an index outage never fails a write.

Memories evolve: each has a valid time (when the fact holds) beside its
revision time (when the store learned it). A write may supersede older
memories, closing their validity; reads answer for now or for a past time,
and a memory's history lists every revision.

This module holds the reads by id, the listing and the history; the writes are
in writes/service.py, SearchMemories in search/service.py, ProposeMemories
in proposals/service.py and automatic curation in curation/service.py, all mixed
into MemoryService.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from services.common import validation
from services.common.pagination import PageTokens, page_size
from services.common.validation import conversation_id
from services.memory.config import MemoryConfig
from services.memory.curation.service import AutoCuration
from services.memory.curation.store import CurationStore
from services.memory.embeddings.protocol import Embedder
from services.memory.index.protocol import VectorIndex
from services.memory.model import (
    Memory,
    RevisionRecord,
    invalid_validity,
    memory_id,
    memory_not_found,
)
from services.memory.ports import SourceChecker
from services.memory.proposals.offline import OfflineProposer
from services.memory.proposals.proposer import Proposer
from services.memory.search.lexical import Fusion, FusionMethod, SearchMode
from services.memory.store import MemoryStore
from services.memory.writes.service import MemoryWrites


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


class MemoryService(MemoryWrites, AutoCuration):
    """Semantic memories of many namespaces (writes, search, ProposeMemories and automatic
    curation mixed in)."""

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
        curation_store: CurationStore | None = None,
    ) -> None:
        self.store = store
        self.curation_store = curation_store
        self.on_curation_request = None
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
        metadata_filter: Mapping[str, str] | None = None,
    ) -> MemoryPage:
        """A page of the namespace's live memories in id order (AIP-158): those valid at
        `as_of` (absent: now, the instant of the first page for every page), or all of
        them with `ignore_validity`; with `metadata_filter`, only those whose metadata
        holds every pair of it."""
        validation.namespace(namespace)
        limit = page_size(size)
        wanted = validation.metadata(metadata_filter or {}, "metadata_filter")
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
        if wanted:
            request["metadata_filter"] = wanted
        after = None
        at = None if ignore_validity else (as_of or self.now())
        if token:
            cursor = self.page_tokens.decode(token, "memories", namespace, request)
            after = uuid.UUID(cursor["after"])
            if at is not None and cursor.get("at"):
                at = datetime.fromisoformat(cursor["at"])
        rows = await self.store.list_memories(
            namespace, cid, after, limit + 1, valid_at=at, metadata=wanted
        )
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
