"""The erasure saga: a conversation and everything derived from it, across services, and
its receipt.

Order matters. The derived data goes first, each part erased for the
conversation's incarnation (TranscriptService's Conversation.incarnation), which
leaves a tombstone: SummaryService erases summaries, history and jobs and refuses
any later commit or job for that incarnation; MemoryService deletes the memories
derived from the conversation and refuses any later write whose sources were
checked against it. Only then is the transcript deleted, so the id cannot be made
again (a new incarnation) while derived data of the old one could still land:
a summarizer inside its model call, or an UpsertMemory between its source
check and its write, is refused by the tombstone whenever it finishes.

The receipt. Each tombstone adds up what every erasure of its incarnation erased, so
each service reports totals, and a retry reports what the first call did too. The
transcript's deletion records the receipt in its own transaction (with the entries and
appends it erased): the conversation is never gone without its receipt. A call that
could not finish records what it did (RecordErasureReceipt), and a retry merges into
the same receipt: one per incarnation, counts that only grow, parts that only leave
`remaining`. The vector index follows MemoryService's outbox: the receipt lists
"memory_index" until the index has caught up with the erasure, and is completed then,
by GetErasureReceipt (or a retry of the erasure). A receipt holds counts, never content.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from services.agent.model import (
    Erasure,
    MemoryErasure,
    Receipt,
    SummaryErasure,
    TranscriptDeletion,
)
from services.agent.ports import Memories, Summaries, Transcripts
from services.common import validation
from services.common.errors import Code, DomainError

T = TypeVar("T")

# The counts of a receipt, by name (ErasureReceipt's fields). TranscriptService adds its own.
ENTRIES = "entries"
APPENDS = "appends"
SUMMARIES = "summaries"
SUMMARY_JOBS = "summary_jobs"
CURATION_JOBS = "curation_jobs"
MEMORIES = "memories"
MEMORY_REVISIONS = "memory_revisions"
INDEX_POINTS = "index_points"
FORKS = "forks"
CHECKPOINTS = "checkpoints"
# TranscriptService's refusal of a deletion that would erase a fork not listed.
FORKS_CHANGED = "FORKS_CHANGED"

# The parts of an erasure (a receipt's `remaining`; the response's lists those a retry
# must still do).
SUMMARY = "summary"
MEMORY = "memory"
MEMORY_INDEX = "memory_index"
TRANSCRIPT = "transcript"

_RETRY_LATER = (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED)
# How many times one call lists the forks again after the transcript's deletion found a
# fork made since the last listing (FORKS_CHANGED): each round erases the new forks'
# derived data. Forks made faster than that leave the transcript to the erasure's retry.
FORK_ROUNDS = 4


async def _unless_unavailable(action: Awaitable[T]) -> T | None:
    """The result, or None when the service could not be reached in time."""
    try:
        return await action
    except DomainError as error:
        if error.code in _RETRY_LATER:
            return None
        raise


def _counts(summary: SummaryErasure | None, memory: MemoryErasure | None) -> dict[str, int]:
    """The counts the derived parts reported (totals of the incarnation's erasure)."""
    counts: dict[str, int] = {}
    if summary is not None:
        counts[SUMMARIES] = summary.summaries
        counts[SUMMARY_JOBS] = summary.jobs
    if memory is not None:
        counts[MEMORIES] = memory.memories
        counts[MEMORY_REVISIONS] = memory.revisions
        counts[INDEX_POINTS] = memory.index_points
    return counts


def _pending(summary: SummaryErasure | None, memory: MemoryErasure | None) -> list[str]:
    """The derived parts not yet erased: a part whose service was unreachable, and the
    index until it has caught up with the memories' erasure."""
    pending = []
    if summary is None:
        pending.append(SUMMARY)
    if memory is None:
        pending += [MEMORY, MEMORY_INDEX]
    elif not memory.index_complete:
        pending.append(MEMORY_INDEX)
    return pending


@dataclass(frozen=True, slots=True)
class _ForkParts:
    """What the erasure of a conversation's forks' derived parts did, added up."""

    counts: dict[str, int] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    summary_rows: int = 0
    memories_deleted: int = 0
    # Every fork listed (id, incarnation), those erased before included; None when the
    # listing failed.
    listed: list[tuple[str, int]] | None = None


async def _erase_forks(
    transcripts: Transcripts,
    summaries: Summaries,
    memories: Memories,
    namespace: str,
    conversation_id: str,
    part: Callable[[str, Awaitable[Any]], Awaitable[Any]],
    erased: Sequence[tuple[str, int]] = (),
) -> _ForkParts:
    """Erase the summaries and memories of the conversation's forks (and theirs), each for
    its own incarnation; their counts are added to the receipt's (each service reports the
    totals of an incarnation, so a retry adds the same again, and the receipt's counts
    only grow). A part whose service is unreachable is left in `remaining` (by `part`)
    and the transcript kept, so that the retry finds the forks again.

    Forks in `erased` (done in an earlier round of this call) are skipped. A fork made
    after the forks were listed is found by the transcript's deletion, which then refuses
    (FORKS_CHANGED) and the caller lists them again."""
    forks = await part(TRANSCRIPT, transcripts.forks(namespace, conversation_id))
    done = _ForkParts(listed=list(forks) if forks is not None else None)
    skipped = set(erased)
    for fork_id, fork_incarnation in forks or ():
        if (fork_id, fork_incarnation) in skipped:
            continue
        summary = await part(SUMMARY, summaries.erase(namespace, fork_id, fork_incarnation))
        memory = await part(
            MEMORY, memories.forget_conversation(namespace, fork_id, fork_incarnation)
        )
        for name, count in _counts(summary, memory).items():
            done.counts[name] = done.counts.get(name, 0) + count
        done.pending.extend(name for name in _pending(summary, memory) if name not in done.pending)
        done = replace(
            done,
            summary_rows=done.summary_rows + (summary.rows if summary else 0),
            memories_deleted=done.memories_deleted + (memory.deleted if memory else 0),
        )
    return done


async def erase(
    transcripts: Transcripts,
    summaries: Summaries,
    memories: Memories,
    namespace: str,
    conversation_id: str,
) -> Erasure:
    """Erase a conversation everywhere: summaries and jobs, derived memories, then the
    transcript; and record its receipt.

    Idempotent and resumable: a part whose service is unavailable is reported in
    `remaining` and a retry completes it (and the same receipt); the transcript is kept
    (and listed in `remaining`) until every derived part is erased. A conversation that
    no longer exists still has its derived parts erased (left over by an erasure from
    before tombstones, or by a plain DeleteConversation); if its last erasure's receipt
    is not complete, that erasure is finished and its receipt completed.

    Curation jobs are counted 0: none exists to erase yet (memory migration 0007 brings
    them; their count will come from MemoryService's erasure, beside the memories').
    Forks are counted by TranscriptService when it deletes the transcript (its forks, and
    theirs, go with it); 0 here. What was derived from the forks' own entries (their
    summaries and memories) is erased before that, for each fork's incarnation, and
    counted with the conversation's own; a fork made meanwhile makes the deletion refuse
    (FORKS_CHANGED) and is erased in the next round (at most FORK_ROUNDS).
    """
    validation.namespace(namespace)
    validation.conversation_id(conversation_id)
    remaining: list[str] = []

    async def part(name: str, action: Awaitable[T]) -> T | None:
        done = await _unless_unavailable(action)
        if done is None:
            remaining.append(name)
        return done

    incarnation = await transcripts.incarnation(namespace, conversation_id)
    kept: Receipt | None = None
    if incarnation is None:
        # Gone: an erasure whose transcript is deleted may have parts left (its reply lost
        # after the deletion; the index catching up). Finish that erasure.
        kept = await transcripts.get_receipt(namespace, "", conversation_id)
    unfinished = kept is not None and kept.complete_time is None
    # 0: the conversation is gone and nothing is left to finish; its derived parts are
    # erased without a tombstone (and without a receipt).
    erased_incarnation = incarnation or (kept.incarnation if kept and unfinished else 0)
    summary = await part(SUMMARY, summaries.erase(namespace, conversation_id, erased_incarnation))
    memory = await part(
        MEMORY, memories.forget_conversation(namespace, conversation_id, erased_incarnation)
    )
    counts = {**_counts(summary, memory), CURATION_JOBS: 0, FORKS: 0}
    pending = _pending(summary, memory)
    summary_rows = summary.rows if summary else 0
    memories_deleted = memory.deleted if memory else 0
    deletion = TranscriptDeletion(0, 0, kept)
    if incarnation is not None:
        # Its forks go with its transcript, and what was derived from their own entries
        # (summaries of a fork, memories sourced from it) must go too: erased here, each
        # for the fork's incarnation (a tombstone each), BEFORE the transcript, which is
        # the only place the forks can be found. A call that dies midway leaves the
        # transcript, so its retry finds the forks again and erases what is left. The
        # deletion names the forks erased: one made since they were listed makes it
        # refuse (FORKS_CHANGED, checked in its transaction, which the fork's own
        # transaction cannot straddle), and the forks are listed again.
        erased_forks: list[tuple[str, int]] = []
        deleting = False
        for _ in range(FORK_ROUNDS):
            fork_parts = await _erase_forks(
                transcripts, summaries, memories, namespace, conversation_id, part, erased_forks
            )
            for name, count in fork_parts.counts.items():
                counts[name] = counts.get(name, 0) + count
            pending += [name for name in fork_parts.pending if name not in pending]
            summary_rows += fork_parts.summary_rows
            memories_deleted += fork_parts.memories_deleted
            if remaining:
                break  # a derived part (or the listing) is left: the transcript stays
            erased_forks = fork_parts.listed or []
            try:
                deleted = await part(
                    TRANSCRIPT,
                    transcripts.delete_conversation(
                        namespace, conversation_id, incarnation, counts, pending, erased_forks
                    ),
                )
            except DomainError as error:
                if error.reason != FORKS_CHANGED:
                    raise
                continue  # a fork made since the listing: list again, erase its part
            deleting = True
            deletion = deleted or TranscriptDeletion(0, 0)
            break
        if not deleting:
            if TRANSCRIPT not in remaining:
                remaining.append(TRANSCRIPT)  # after its derived parts, on the retry
            # What was erased so far, so that the receipt exists meanwhile (best effort:
            # the retry records it anyway).
            recorded = await _unless_unavailable(
                transcripts.record_receipt(
                    namespace, conversation_id, incarnation, counts, [*pending, TRANSCRIPT]
                )
            )
            deletion = TranscriptDeletion(0, 0, recorded)
    elif erased_incarnation:
        recorded = await part(
            "receipt",
            transcripts.record_receipt(
                namespace, conversation_id, erased_incarnation, counts, pending
            ),
        )
        deletion = TranscriptDeletion(0, 0, recorded or kept)
    return Erasure(
        deletion.entries,
        summary_rows,
        memories_deleted,
        sorted(set(remaining), key=remaining.index),
        deletion.receipt,
    )


async def receipt(
    transcripts: Transcripts,
    memories: Memories,
    namespace: str,
    receipt_id: str,
    conversation_id: str = "",
) -> Receipt:
    """An erasure receipt, by id or the latest of a conversation id; completed first when
    only the index was left and it has caught up since (ERASURE_RECEIPT_NOT_FOUND when
    there is none in this namespace). A service that cannot be reached leaves the receipt
    as kept."""
    validation.namespace(namespace)
    found = await transcripts.get_receipt(namespace, receipt_id, conversation_id)
    if found is None:
        raise DomainError(Code.NOT_FOUND, "ERASURE_RECEIPT_NOT_FOUND", "erasure receipt not found")
    if found.complete_time is not None or list(found.remaining) != [MEMORY_INDEX]:
        return found
    try:
        memory = await memories.erasure(namespace, found.conversation_id, found.incarnation)
    except DomainError as error:
        if error.code in _RETRY_LATER:
            return found
        raise
    if memory is not None and not memory.index_complete:
        return found
    # Caught up. None: MemoryService no longer keeps the tombstone, which it keeps past
    # its retention until every index write of the erasure is applied.
    completed = await _unless_unavailable(
        transcripts.record_receipt(
            namespace,
            found.conversation_id,
            found.incarnation,
            _counts(None, memory) if memory is not None else {},
            [],
        )
    )
    return completed or found
