"""ProposeMemories: read a range of a transcript, find what is stored about it, ask the proposer.

Mixed into MemoryService, on top of its search (the related memories are what
the namespace's own search finds for the entries read). Stores nothing: the
application confirms a proposal by calling UpsertMemory with it. The proposers
themselves are in proposer.py and offline.py, the checks of what they answer in
model.py.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.common import validation
from services.common.deadlines import remaining
from services.common.domain import Budget, Entry, Usage
from services.common.errors import invalid_argument
from services.common.validation import conversation_id
from services.llm.model import require_call, with_defaults
from services.memory.embeddings.protocol import EmbeddingUnavailable
from services.memory.index.protocol import IndexUnavailable
from services.memory.ports import SourceChecker
from services.memory.proposals.model import (
    Proposal,
    ProposalLimits,
    RelatedMemory,
    check_proposals,
    conversation_erased,
    conversation_not_found,
)
from services.memory.proposals.prompt import lean_entry
from services.memory.proposals.proposer import Proposer
from services.memory.search.model import ScoredMemory
from services.memory.search.service import MemorySearch

log = logging.getLogger(__name__)

# ProposeMemories: proposals by default and at most; stored memories matched per entry,
# and shown to the proposer in all.
DEFAULT_PROPOSALS = 8
MAX_PROPOSALS = 32
RELATED_PER_ENTRY = 3
MAX_RELATED = 24


@dataclass(frozen=True, slots=True)
class ProposeResult:
    """What ProposeMemories answers: checked proposals (nothing stored), the usage of the
    proposer, how many of its proposals were dropped, and which proposer it was."""

    proposals: Sequence[Proposal]
    usage: Usage
    dropped: int
    proposer: str


class MemoryCuration(MemorySearch):
    """The assisted-curation methods of MemoryService (which sets these attributes)."""

    sources: SourceChecker
    proposer: Proposer

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

    async def _still_standing(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int
    ) -> None:
        """CONVERSATION_ERASED unless the conversation is still `incarnation`, and no
        erasure of it has begun (the memory part of an erasure runs before the transcript
        is deleted, and a stalled erasure can leave the transcript for a while)."""
        now = await self.sources.conversation(namespace, conversation_id)
        if (
            now is None
            or now.incarnation != incarnation
            or await self.store.erased(namespace, conversation_id, incarnation)
        ):
            raise conversation_erased()

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

        Every source of every proposal names the incarnation of the conversation that
        was read, so that UpsertMemory refuses it once that incarnation is erased. A
        conversation erased (or erased and created again under the same id) while the
        call runs, its model call included, is NOT_FOUND / CONVERSATION_ERASED: nothing
        read from an erased incarnation is proposed.
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
            raise conversation_erased()  # erased since it was found
        # What the proposer reads of an entry is its text, clipped: the rest (a framework's
        # native JSON, the text beyond the clip) is let go now rather than held through
        # the model call (a range of long entries is tens of MiB).
        entries = [
            lean_entry(e, self.config.propose_max_entry_chars)
            for e in read
            if not e.retracted_version
        ]
        del read
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
            prompt, timeout=remaining(self.config.chat_model.timeout_s)
        )
        # The entries were read between two looks at the conversation: if both find the
        # incarnation of the first (never reused) and no erasure fenced it, the entries are
        # that incarnation's, still standing. An erasure after this is the write's to
        # refuse: every source names the incarnation.
        await self._still_standing(namespace, cid, state.incarnation)
        proposals, dropped = check_proposals(
            output.items,
            ProposalLimits(
                cid,
                from_sequence,
                through_sequence,
                self.config.limits.max_content_bytes,
                self.config.limits.max_sources,
                max_proposals,
                state.incarnation,
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
