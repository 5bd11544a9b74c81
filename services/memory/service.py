"""MemoryService domain logic: curated memories with provenance, searched by meaning.

Takes a `MemoryStore` (the revisioned record), a `VectorIndex` (the
searchable copy), an `Embedder`, a `SourceChecker` and a `Proposer`; knows
nothing of gRPC or SQL. Writes go to the store only (its outbox feeds the
index), so an index outage never fails a write.

Memories evolve: each has a valid time (when the fact holds) beside its
revision time (when the store learned it). A write may supersede older
memories, closing their validity; reads answer for now or for a past time,
and a memory's history lists every revision.

This module holds the rules of the writes and the reads by id; SearchMemories
is in search.py and ProposeMemories in curation.py, both mixed into
MemoryService.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import uuid_utils

from services.common import validation
from services.common.domain import SEQUENCE_MAX
from services.common.errors import invalid_argument
from services.common.pagination import PageTokens, page_size
from services.common.validation import conversation_id
from services.memory.config import MemoryConfig
from services.memory.curation import MemoryCuration
from services.memory.embeddings import Embedder
from services.memory.index import VectorIndex
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
    WriteResult,
    memory_not_found,
    source_erased,
    source_not_found,
)
from services.memory.offline_proposer import OfflineProposer
from services.memory.ports import SourceChecker
from services.memory.proposals import Proposer
from services.memory.store import MemoryStore


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


class MemoryService(MemoryCuration):
    """Semantic memories of many namespaces (search and curation mixed in)."""

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
        """Each conversation exists in this namespace, is the incarnation its sources
        name (when they name one) and each range lies inside it. Returns the incarnation
        of each source conversation (the write carries them, so that an erasure between
        this check and the write still fences it)."""
        conversations = list(dict.fromkeys(s.conversation_id for s in sources))
        found = await asyncio.gather(
            *(self.sources.conversation(namespace, cid) for cid in conversations)
        )
        state_of = dict(zip(conversations, found, strict=True))
        for i, source in enumerate(sources):
            state = state_of[source.conversation_id]
            if state is None:
                raise source_not_found(i)
            if source.incarnation and source.incarnation != state.incarnation:
                # Read from an incarnation erased since (the id may have been made again):
                # what it says is not the current conversation's.
                raise source_erased(i)
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
        time); None if none is found (erased meanwhile: the write's tombstone check decides)."""
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
        (SOURCE_NOT_FOUND), however late, and so does a source whose stated
        incarnation (a proposal's) is not the conversation's current one. With
        a request id, a repeat of the same request returns the first result and
        writes nothing (another request under that id is REQUEST_ID_REUSED).

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
            # The stated incarnations did their part in the check (and in the tombstone
            # check, through `incarnations`); a memory's sources are stored as ranges.
            sources=[replace(s, incarnation=0) for s in parsed_sources],
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
