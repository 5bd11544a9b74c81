"""UpsertMemory, DeleteMemory and ForgetSource: the rules of the writes.

Mixed into MemoryService (as PostgresWrites is into PostgresMemoryStore). Writes
go to the store only (its outbox feeds the index), so an index outage never fails
a write. Every transcript source is checked against TranscriptService, and the
write carries the incarnation of each source conversation, so that an erasure
between the check and the write still refuses it; an external source (a URI) is
checked for its form only. A write may supersede older memories, closing their
validity in its transaction.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

import uuid_utils

from services.common import validation
from services.common.domain import SEQUENCE_MAX
from services.common.errors import invalid_argument
from services.common.validation import conversation_id
from services.memory.config import MemoryConfig
from services.memory.embeddings.protocol import Embedder
from services.memory.model import (
    Forgotten,
    MemoryErasure,
    MemorySource,
    Source,
    erasure_not_found,
    invalid_validity,
    memory_id,
)
from services.memory.ports import SourceChecker
from services.memory.store import MemoryStore
from services.memory.writes.inputs import (
    SourceInput,
    ValidityInput,
    check_expected_revision,
    check_validity,
    expiry,
    external_uri,
    parse_sources,
    parse_supersedes,
    request_digest,
)
from services.memory.writes.model import MemoryWrite, WriteResult, source_erased, source_not_found


class MemoryWrites:
    """The write methods of MemoryService (which sets these attributes)."""

    store: MemoryStore
    embedder: Embedder
    sources: SourceChecker
    config: MemoryConfig
    on_write: Callable[[], None]
    now: Callable[[], datetime]

    async def _check_sources_exist(
        self, namespace: str, sources: Sequence[Source]
    ) -> dict[uuid.UUID, int]:
        """Each conversation exists in this namespace, is the incarnation its sources
        name (when they name one) and each range lies inside it. Returns the incarnation
        of each source conversation (the write carries them, so that an erasure between
        this check and the write still fences it). External sources have nothing to check
        there: a memory with only those asks TranscriptService nothing."""
        conversations = list(
            dict.fromkeys(s.conversation_id for s in sources if isinstance(s, MemorySource))
        )
        found = await asyncio.gather(
            *(self.sources.conversation(namespace, cid) for cid in conversations)
        )
        state_of = dict(zip(conversations, found, strict=True))
        for i, source in enumerate(sources):
            if not isinstance(source, MemorySource):
                continue
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
        self, namespace: str, sources: Sequence[Source]
    ) -> datetime | None:
        """When the earliest entry of the transcript sources was written (a memory's
        default valid time); None if none is found (erased meanwhile: the write's tombstone
        check decides; or only external sources, which have no time here)."""
        first: dict[uuid.UUID, int] = {}
        for source in sources:
            if not isinstance(source, MemorySource):
                continue
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
        parsed_sources = parse_sources(sources, limits.max_sources, limits.max_external_uri_bytes)
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
            # The stated incarnations did their part in the check (and the tombstone check, through
            # `incarnations`); a memory's sources are stored as ranges (and URIs).
            sources=[
                replace(s, incarnation=0) if isinstance(s, MemorySource) else s
                for s in parsed_sources
            ],
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
        external_uri_text: str = "",
    ) -> Forgotten:
        """Delete every memory with a source overlapping a range of a conversation, or
        (`external_uri_text`, instead of a conversation) every memory one of whose sources
        is that external URI, exactly. A memory with several sources goes when any one of
        them is forgotten: what it says came partly from what is forgotten.

        from_sequence = through_sequence = 0 means the whole conversation. The
        conversation need not exist any more. With an `incarnation` (the erasure of
        the whole conversation) the erasure is also fenced: a memory whose sources
        were checked against that incarnation is refused from now on, even one
        whose source check already ran; and the result carries what every erasure of
        that incarnation erased (an erasure receipt's counts). Forgetting a URI fences
        nothing: a later write may name it again.
        """
        validation.namespace(namespace)
        if external_uri_text:
            if conversation_id_text or from_sequence or through_sequence or incarnation:
                raise invalid_argument(
                    "INVALID_EXTERNAL_URI",
                    "forget an external URI or a conversation, not both: external_uri "
                    "takes no conversation_id, range or incarnation",
                    field="external_uri",
                )
            uri = external_uri(
                external_uri_text, "external_uri", self.config.limits.max_external_uri_bytes
            )
            deleted = await self.store.forget_external(namespace, uri)
            if deleted:
                self.on_write()
            return Forgotten(deleted)
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
        forgotten = await self.store.forget_source(namespace, cid, low, high, incarnation)
        if forgotten.deleted:
            self.on_write()
        return forgotten

    async def erasure(
        self, namespace: str, conversation_id_text: str, incarnation: int
    ) -> MemoryErasure:
        """What the erasure of one incarnation of a conversation erased here (ForgetSource
        with that incarnation, over all its calls), and when the index caught up with it;
        ERASURE_NOT_FOUND when no tombstone of it is kept (never made, in another
        namespace, or past its retention)."""
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        if incarnation < 1:
            raise invalid_argument(
                "INVALID_INCARNATION", "incarnation must be at least 1", field="incarnation"
            )
        found = await self.store.erasure(namespace, cid, incarnation)
        if found is None:
            raise erasure_not_found()
        return found
