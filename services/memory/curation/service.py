"""Automatic curation: RequestCuration, GetCurationBacklog, and what one job does.

Mixed into MemoryService, on top of ProposeMemories (proposals/service.py): a job reads
the entries after the conversation's cursor through TranscriptService in batches, shows
each batch with the related memories to the proposer (one call, charged to the
namespace's hourly budget), checks what it answers with the same checks as
ProposeMemories, and applies it in ONE transaction per batch (curation/store.py): ADD
stores a memory with the exact source ranges, SUPERSEDE stores one that closes the
validity of the memory it replaces (compare-and-swap on the revision the proposer saw),
DUPLICATE is skipped, and the cursor moves. Retracted entries are never curated; a
curated memory whose entry is retracted later is forgotten by the next batch.

Fenced by incarnation end to end: the job names the incarnation it was asked for, the
conversation is looked at again after the model call, and the batch's transaction
refuses an incarnation an erasure fenced (the erasure also deletes the job). The worker
loop (claims, leases, retries) is in worker.py.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import uuid_utils

from services.common import validation
from services.common.deadlines import remaining
from services.common.domain import Entry, Usage
from services.common.errors import DomainError
from services.common.validation import conversation_id
from services.memory import metrics
from services.memory.curation.model import (
    CONFLICT_REASONS,
    Batch,
    BatchResult,
    CurationBacklog,
    CurationJob,
    Cursor,
    Fact,
    batch_range,
    budget_retry_after,
    curated_metadata,
    curation_budget_exhausted,
    curation_queue_full,
    facts_of,
    related_filter,
)
from services.memory.curation.store import CurationStore
from services.memory.model import SourceConversation
from services.memory.proposals.model import (
    ProposalLimits,
    RelatedMemory,
    check_proposals,
    conversation_erased,
    conversation_not_found,
)
from services.memory.proposals.prompt import lean_entry
from services.memory.proposals.service import MAX_RELATED, MemoryCuration
from services.memory.writes.inputs import expiry
from services.memory.writes.model import MemoryWrite

log = logging.getLogger(__name__)

# The retry hint of a full queue: about one job's run.
_QUEUE_FULL_RETRY_S = 5.0
# A conversation's latest open memories shown beside what the search finds (the index
# may not have them yet).
_RECENT_RELATED = 8


@dataclass(frozen=True, slots=True)
class CurationRun:
    """What one attempt of a job did, and whether entries remain (the job runs again)."""

    batches: int = 0
    model_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    added: int = 0
    superseded: int = 0
    duplicates: int = 0
    dropped: int = 0
    forgotten: int = 0
    remaining: bool = False


class AutoCuration(MemoryCuration):
    """The automatic-curation methods of MemoryService (which sets these attributes)."""

    curation_store: CurationStore | None
    on_write: Callable[[], None]
    # Wakes this process's idle curation workers (set by the component).
    on_curation_request: Callable[[], None] | None

    def _queue(self) -> CurationStore:
        assert self.curation_store is not None, "this MemoryService has no curation queue"
        return self.curation_store

    # -- the RPCs ----------------------------------------------------------------------

    async def request_curation(
        self, namespace: str, conversation_id_text: str
    ) -> tuple[CurationJob, bool]:
        """Queue the curation of a conversation (of its current incarnation): one waiting
        or running job per conversation, returned with False when it exists (a running
        one runs again when it finishes, so the request is not lost).

        NOT_FOUND / CONVERSATION_NOT_FOUND when the conversation is not in the namespace;
        RESOURCE_EXHAUSTED / CURATION_QUEUE_FULL when the namespace has
        RUNIFOLD_CURATION_MAX_PENDING_PER_NAMESPACE jobs waiting or running. A request
        is never refused for the hourly budget: its job waits for the next hour."""
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        state = await self.sources.conversation(namespace, cid)
        if state is None:
            raise conversation_not_found()
        limit = self.config.curation_max_pending
        queued = await self._queue().enqueue(
            uuid.UUID(str(uuid_utils.uuid7())), namespace, cid, state.incarnation, limit
        )
        if queued is None:
            metrics.CURATION_REFUSED.labels("CURATION_QUEUE_FULL").inc()
            raise curation_queue_full(limit, _QUEUE_FULL_RETRY_S)
        if self.on_curation_request is not None:
            self.on_curation_request()
        return queued

    async def curation_backlog(self, namespace: str) -> CurationBacklog:
        """The curation queue of a namespace and what its curation spent this hour."""
        validation.namespace(namespace)
        return await self._queue().backlog(namespace, self.now())

    # -- one attempt of a job -----------------------------------------------------------

    async def curate(self, job: CurationJob, lease_token: uuid.UUID) -> CurationRun:
        """Curate the conversation of `job` from its cursor, at most
        RUNIFOLD_CURATION_BATCHES_PER_RUN batches (`remaining` when entries are left).

        NOT_FOUND / CONVERSATION_ERASED when the conversation is no longer the job's
        incarnation (erased, perhaps made again) or its erasure began: the job ends and
        nothing more is stored (a batch in flight is refused by its transaction).
        RESOURCE_EXHAUSTED / CURATION_BUDGET_EXHAUSTED (with a retry delay) when the
        namespace's hourly budget is spent: the job and the namespace's other waiting
        jobs wait for the next hour. CURATION_LEASE_LOST when another worker took the
        job over: this attempt stops, having stored nothing more."""
        run = CurationRun()
        for _ in range(self.config.curation_batches_per_run):
            state = await self._standing(job)
            cursor = await self._queue().cursor(job.namespace, job.conversation_id, job.incarnation)
            start = max(cursor.curated_through, state.curated_through)
            retracted: list[int] = []
            if cursor.curated_through and state.version > cursor.curated_version:
                retracted = await self.sources.retracted(
                    job.namespace, job.conversation_id, cursor.curated_version, start
                )
            span = batch_range(start, state.last_sequence, self.config.curation_batch_entries)
            if span is None and not retracted:
                await self._publish(job, state, start)
                return run
            try:
                run = await self._batch(
                    job, lease_token, state, cursor, start, span, retracted, run
                )
            except DomainError as error:
                if error.reason != "CURATION_CURSOR_MOVED":
                    raise
                continue  # another batch got there first (a lease taken over): read again
            await self._publish(job, state, max(span[1] if span else start, start))
        return replace(run, remaining=True)

    async def _standing(self, job: CurationJob) -> SourceConversation:
        """The conversation as it is now, if it is still the job's incarnation and no
        erasure of it has begun; else CONVERSATION_ERASED."""
        state = await self.sources.conversation(job.namespace, job.conversation_id)
        if (
            state is None
            or state.incarnation != job.incarnation
            or await self.store.erased(job.namespace, job.conversation_id, job.incarnation)
        ):
            raise conversation_erased()
        return state

    async def _batch(
        self,
        job: CurationJob,
        lease_token: uuid.UUID,
        state: SourceConversation,
        cursor: Cursor,
        start: int,
        span: tuple[int, int] | None,
        retracted: list[int],
        run: CurationRun,
    ) -> CurationRun:
        """Read, propose and apply one batch (proposed again, up to
        RUNIFOLD_CURATION_CONFLICT_RETRIES times, when a memory it supersedes changed)."""
        low, high = span if span is not None else (start + 1, start)
        entries: list[Entry] = []
        if span is not None:
            read = await self.sources.entries(job.namespace, job.conversation_id, low, high)
            if len(read) != high - low + 1:
                raise conversation_erased()  # erased since it was looked at
            chars = self.config.propose_max_entry_chars
            # Retracted entries are never curated: what a writer took back is no fact.
            entries = [lean_entry(e, chars) for e in read if not e.retracted_version]
            del read
        wanted = related_filter(state.user_id)
        metadata = curated_metadata(state.user_id)
        for attempt in range(self.config.curation_conflict_retries + 1):
            facts: list[Fact] = []
            duplicates, dropped, usage, calls = 0, 0, Usage(), 0
            related: list[RelatedMemory] = []
            if entries:
                related = await self._curation_related(job, entries, wanted)
                output, usage = await self._propose(job, entries, related)
                calls = 1
                # The entries were read between two looks at the conversation: if the
                # second finds the job's incarnation, unfenced, they were that
                # incarnation's. An erasure after this is the batch transaction's to refuse.
                await self._standing(job)
                proposals, dropped = check_proposals(
                    output,
                    ProposalLimits(
                        job.conversation_id,
                        low,
                        high,
                        self.config.limits.max_content_bytes,
                        self.config.limits.max_sources,
                        self.config.curation_max_proposals,
                        job.incarnation,
                    ),
                    entries,
                    related,
                )
                facts, duplicates = facts_of(proposals, related)
            run = replace(
                run,
                model_calls=run.model_calls + calls,
                usage=run.usage + usage,
                duplicates=run.duplicates + duplicates,
                dropped=run.dropped + dropped,
            )
            batch = Batch(
                job.job_id,
                lease_token,
                job.namespace,
                job.conversation_id,
                job.incarnation,
                cursor.curated_through,
                max(high, start),
                state.version,
                facts,
                metadata,
                retracted,
            )
            try:
                result = await self._queue().apply_batch(
                    batch, [self._write(job.namespace, f, metadata) for f in facts], self.now()
                )
            except DomainError as error:
                retries = self.config.curation_conflict_retries
                if error.reason in CONFLICT_REASONS and attempt < retries:
                    log.info(
                        "curation batch proposed again: a memory it supersedes changed",
                        extra={"job_id": str(job.job_id), "reason": error.reason},
                    )
                    continue
                raise
            self.on_write()
            return self._counted(run, result, duplicates, dropped)
        raise AssertionError("unreachable")  # pragma: no cover

    def _counted(
        self, run: CurationRun, result: BatchResult, duplicates: int, dropped: int
    ) -> CurationRun:
        metrics.CURATION_FACTS.labels("added").inc(result.added - result.superseded)
        metrics.CURATION_FACTS.labels("superseding").inc(result.superseded)
        metrics.CURATION_FACTS.labels("duplicate").inc(duplicates)
        metrics.CURATION_FACTS.labels("dropped").inc(dropped)
        metrics.CURATION_FACTS.labels("forgotten").inc(result.forgotten)
        return replace(
            run,
            batches=run.batches + 1,
            added=run.added + result.added,
            superseded=run.superseded + result.superseded,
            forgotten=run.forgotten + result.forgotten,
        )

    async def _curation_related(
        self, job: CurationJob, entries: list[Entry], wanted: dict[str, str]
    ) -> list[RelatedMemory]:
        """What the namespace's search finds for the entries (ProposeMemories' related
        memories), and the conversation's latest open memories, which the index may not
        hold yet (a fact stated one turn ago and changed now), aliased m1, m2, ..."""
        found = [r.memory for r in await self._related(job.namespace, entries, wanted)]
        recent = await self._queue().recent_curated(
            job.namespace, job.conversation_id, wanted, _RECENT_RELATED
        )
        seen = {m.memory_id for m in found}
        merged = found + [m for m in recent if m.memory_id not in seen]
        return [RelatedMemory(f"m{i}", m, 0.0) for i, m in enumerate(merged[:MAX_RELATED], 1)]

    async def _propose(
        self, job: CurationJob, entries: list[Entry], related: list[RelatedMemory]
    ) -> tuple[list[Any], Usage]:
        """One proposer call, reserved against the namespace's hourly budget first."""
        prompt = self.proposer.prepare(
            entries,
            related,
            max_proposals=self.config.curation_max_proposals,
            max_output_tokens=self.config.propose_max_output_tokens,
        )
        reserved = prompt.input_tokens + prompt.max_output_tokens
        now = self.now()
        await self._reserve(job.namespace, now, reserved)
        try:
            output = await self.proposer.propose(
                prompt, timeout=remaining(self.config.chat_model.timeout_s)
            )
        except BaseException:
            # The call failed: what it did not use is given back (the call stays counted).
            await self._queue().settle(job.namespace, now, -reserved)
            raise
        usage = output.usage
        await self._queue().settle(
            job.namespace, now, usage.input_tokens + usage.output_tokens - reserved
        )
        metrics.CURATION_MODEL_CALLS.inc()
        metrics.CURATION_TOKENS.labels("input").inc(usage.input_tokens)
        metrics.CURATION_TOKENS.labels("output").inc(usage.output_tokens)
        return list(output.items), usage

    async def _reserve(self, namespace: str, now: datetime, tokens: int) -> None:
        """Charge a call to the namespace's hour, or CURATION_BUDGET_EXHAUSTED: the
        namespace's waiting jobs then wait for the next hour (one statement)."""
        calls = self.config.curation_max_model_calls_per_hour
        most = self.config.curation_max_tokens_per_hour
        queue = self._queue()
        if await queue.reserve(namespace, now, tokens, calls, most):
            return
        retry = budget_retry_after(now)
        spent = await queue.backlog(namespace, now)
        kind, limit = (
            ("model_calls", calls)
            if calls and spent.model_calls_this_hour + 1 > calls
            else ("tokens", most)
        )
        await queue.defer_namespace(namespace, "CURATION_BUDGET_EXHAUSTED", retry)
        metrics.CURATION_REFUSED.labels("CURATION_BUDGET_EXHAUSTED").inc()
        raise curation_budget_exhausted(kind, limit, retry)

    def _write(self, namespace: str, fact: Fact, metadata: dict[str, str]) -> MemoryWrite:
        """A curated memory as the store writes it (its sources are stored as ranges)."""
        return MemoryWrite(
            namespace=namespace,
            memory_id=uuid.UUID(str(uuid_utils.uuid7())),
            content=fact.content,
            sources=[replace(s, incarnation=0) for s in fact.sources],
            metadata=metadata,
            expected_revision=None,
            expire_time=expiry(self.now(), None, None, self.config.ttl_for(namespace)),
            embedding_model=self.embedder.model,
            embedding_dimension=self.embedder.dimension,
            valid_from_time=fact.valid_from_time,
            supersedes=fact.supersedes,
        )

    async def _publish(self, job: CurationJob, state: SourceConversation, through: int) -> None:
        """Conversation.curated_through follows the cursor (MarkCurated, monotonic)."""
        if through > state.curated_through:
            try:
                await self.sources.mark_curated(
                    job.namespace, job.conversation_id, job.incarnation, through
                )
            except DomainError as error:
                if error.reason in ("CONVERSATION_NOT_FOUND", "CONVERSATION_ERASED"):
                    raise conversation_erased() from None
                raise
