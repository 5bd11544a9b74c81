"""ForkConversation (TranscriptService): validates a fork and hands the store one atomic
fork. Knows nothing of gRPC or SQL (the store is a `ForkStore`).
"""

from __future__ import annotations

import uuid

import uuid_utils

from services.common import validation
from services.common.errors import invalid_argument
from services.common.pagination import PageTokens, page_size
from services.common.validation import conversation_id
from services.transcript.conversations.model import Conversation
from services.transcript.forks.model import ForkPage, NewFork, fork_payload_hash
from services.transcript.forks.store import ForkStore


class Forks:
    """The fork methods of TranscriptService (services/transcript/service.py)."""

    store: ForkStore
    page_tokens: PageTokens

    async def fork_conversation(
        self,
        namespace: str,
        conversation_id_text: str,
        through_sequence: int,
        new_conversation_id_text: str = "",
        request_id_text: str = "",
    ) -> tuple[Conversation, bool]:
        """Make a conversation from the entries 1..through_sequence of another of the
        namespace, sharing them without copying; return it and whether this call made it
        (a repeat of `request_id` returns the first fork with False).

        The fork's sequences continue from `through_sequence`, its state is the source's
        at the fork point, its user and labels are the source's; nothing done to the
        fork changes the source, nor anything done to the source after the fork point
        the fork.
        """
        validation.namespace(namespace)
        source = conversation_id(conversation_id_text)
        if through_sequence < 0:
            raise invalid_argument(
                "INVALID_SEQUENCE",
                "through_sequence must not be negative",
                field="through_sequence",
            )
        new_id = (
            conversation_id(new_conversation_id_text, "new_conversation_id")
            if new_conversation_id_text
            else uuid.UUID(str(uuid_utils.uuid7()))
        )
        request_id = validation.request_id(request_id_text)
        return await self.store.fork_conversation(
            NewFork(
                namespace,
                source,
                through_sequence,
                new_id,
                request_id,
                fork_payload_hash(through_sequence, new_conversation_id_text),
            )
        )

    async def list_forks(
        self, namespace: str, conversation_id_text: str, size: int = 0, token: str = ""
    ) -> ForkPage:
        """A page (AIP-158) of the conversation's forks and theirs, at any depth, in the
        order they were made (a fork before its own): what erasing it erases with it
        (AgentService erases what was derived from their own entries first). Empty when
        it has none or does not exist."""
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        limit = page_size(size)
        request = {"conversation_id": str(cid)}
        after = 0
        if token:
            after = int(self.page_tokens.decode(token, "forks", namespace, request)["after"])
        found = await self.store.list_forks(namespace, cid, after, limit + 1)
        page, more = found[:limit], len(found) > limit
        next_token = (
            self.page_tokens.encode("forks", namespace, request, {"after": page[-1].key})
            if more
            else ""
        )
        return ForkPage(page, next_token)
