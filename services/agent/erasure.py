"""The erasure saga: a conversation and everything derived from it, across services."""

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
    """Erase a conversation everywhere: transcript, summaries and jobs, derived memories.

    Idempotent and resumable: each part is erased on its own; a part whose
    service is unavailable is reported in `remaining` and a retry completes
    it. The transcript goes first, so that nothing new can be derived from
    it while the rest is erased (summaries and memories are only written for
    conversations that exist).
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

    entries = await part("transcript", transcripts.delete_conversation(namespace, conversation_id))
    summaries_erased = await part("summary", summaries.erase(namespace, conversation_id)) > 0
    memories_deleted = await part(
        "memory", memories.forget_conversation(namespace, conversation_id)
    )
    return Erasure(entries, summaries_erased, memories_deleted, remaining)
