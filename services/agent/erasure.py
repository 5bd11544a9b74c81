"""The erasure saga: a conversation and everything derived from it, across services.

Order matters. The derived data goes first, each part erased for the
conversation's incarnation (TranscriptService's Conversation.incarnation), which
leaves a tombstone: SummaryService erases summaries, history and jobs and refuses
any later commit or job for that incarnation; MemoryService deletes the memories
derived from the conversation and refuses any later write whose sources were
checked against it. Only then is the transcript deleted, so the id cannot be made
again (a new incarnation) while derived data of the old one could still land:
a summarizer inside its model call, or an UpsertMemory between its source
check and its write, is refused by the tombstone whenever it finishes.
"""

from __future__ import annotations

from collections.abc import Awaitable

from services.agent.model import Erasure
from services.agent.ports import Memories, Summaries, Transcripts
from services.common import validation
from services.common.errors import Code, DomainError


async def erase(
    transcripts: Transcripts,
    summaries: Summaries,
    memories: Memories,
    namespace: str,
    conversation_id: str,
) -> Erasure:
    """Erase a conversation everywhere: summaries and jobs, derived memories, then the
    transcript.

    Idempotent and resumable: a part whose service is unavailable is reported in
    `remaining` and a retry completes it; the transcript is kept (and listed in
    `remaining`) until every derived part is erased. A conversation that no longer
    exists still has its derived parts erased (left over by an erasure from before
    tombstones, or by a plain DeleteConversation).
    """
    validation.namespace(namespace)
    validation.conversation_id(conversation_id)
    remaining: list[str] = []

    async def part(name: str, action: Awaitable[int]) -> int:
        try:
            return await action
        except DomainError as error:
            if error.code in (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED):
                remaining.append(name)
                return 0
            raise

    incarnation = await transcripts.incarnation(namespace, conversation_id)
    # 0: the conversation is gone; its derived parts are erased without a tombstone.
    erased_incarnation = incarnation or 0
    summaries_deleted = await part(
        "summary", summaries.erase(namespace, conversation_id, erased_incarnation)
    )
    memories_deleted = await part(
        "memory", memories.forget_conversation(namespace, conversation_id, erased_incarnation)
    )
    entries = 0
    if incarnation is not None:
        if remaining:
            remaining.append("transcript")  # after its derived parts, on the retry
        else:
            entries = await part(
                "transcript",
                transcripts.delete_conversation(namespace, conversation_id, erased_incarnation),
            )
    return Erasure(entries, summaries_deleted, memories_deleted, remaining)
