"""Conversations (TranscriptService): create, get, list and erase them, and read the
state of a namespace and of its users. Validates requests; knows nothing of gRPC or
SQL (the store is a `ConversationStore`).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import uuid_utils

from services.common import validation
from services.common.errors import invalid_argument
from services.common.pagination import PageTokens, page_size
from services.common.validation import conversation_id
from services.transcript.config import TranscriptLimits
from services.transcript.conversations.model import (
    NO_STATE_CHANGE,
    Conversation,
    ConversationOrder,
    Deletion,
    ScopedState,
    StateChange,
    conversation_not_found,
    state_change,
    user_id,
)
from services.transcript.conversations.store import ConversationStore
from services.transcript.receipts.model import ErasureProgress, check_progress
from services.transcript.receipts.service import incarnation_to_erase

# Users one GetState reads; a page of conversations with their state (CONVERSATION_VIEW_FULL).
MAX_STATE_USERS = 100
MAX_FULL_PAGE = 50


@dataclass(frozen=True, slots=True)
class ConversationPage:
    """A page of conversations."""

    conversations: Sequence[Conversation]
    next_page_token: str


@dataclass(frozen=True, slots=True)
class NamespacePage:
    """A page of namespace names."""

    namespaces: Sequence[str]
    next_page_token: str


class Conversations:
    """The conversation methods of TranscriptService (services/transcript/service.py)."""

    store: ConversationStore
    limits: TranscriptLimits
    page_tokens: PageTokens

    async def create_conversation(
        self,
        namespace: str,
        conversation_id_text: str,
        labels: Mapping[str, str],
        user_id_text: str = "",
        state: StateChange = NO_STATE_CHANGE,
    ) -> tuple[Conversation, bool]:
        """Create a conversation (of a user, with an initial state); a repeat in the same
        namespace returns it with False and changes nothing."""
        validation.namespace(namespace)
        if conversation_id_text:
            cid = conversation_id(conversation_id_text)
        else:
            cid = uuid.UUID(str(uuid_utils.uuid7()))
        user = user_id(user_id_text) if user_id_text else None
        if state.user is not None and user is None:
            raise invalid_argument(
                "INVALID_STATE",
                "state.user_json needs a user_id",
                field="state.user_json",
            )
        return await self.store.create_conversation(
            namespace,
            cid,
            validation.metadata(labels, "labels"),
            user,
            state,
            self.limits.max_state_bytes,
        )

    def state_change(
        self, conversation_json: str, user_json: str, namespace_json: str, field: str
    ) -> StateChange:
        """A request's state changes, validated against this service's limits."""
        return state_change(
            conversation_json,
            user_json,
            namespace_json,
            self.limits.max_state_bytes,
            field,
            self.limits.max_json_depth,
        )

    async def get_state(self, namespace: str, user_ids: Sequence[str]) -> list[ScopedState]:
        """The namespace's state, then each user's, in the order asked."""
        validation.namespace(namespace)
        if len(user_ids) > MAX_STATE_USERS:
            raise invalid_argument(
                "TOO_MANY_USERS",
                f"user_ids holds at most {MAX_STATE_USERS} users",
                field="user_ids",
                limit=MAX_STATE_USERS,
            )
        users = [user_id(u, f"user_ids[{i}]") for i, u in enumerate(user_ids)]
        found = {s.user_id: s for s in await self.store.read_states(namespace, ["", *users])}
        return [found.get(u) or ScopedState(u) for u in ["", *users]]

    async def get_conversation(self, namespace: str, conversation_id_text: str) -> Conversation:
        """The conversation; NOT_FOUND if it is not in this namespace."""
        validation.namespace(namespace)
        found = await self.store.get_conversation(namespace, conversation_id(conversation_id_text))
        if found is None:
            raise conversation_not_found()
        return found

    async def list_conversations(
        self,
        namespace: str,
        size: int,
        token: str,
        user_id_text: str = "",
        with_state: bool = False,
        order: int = 0,
    ) -> ConversationPage:
        """A page of the namespace's conversations in id order, or newest first (only a
        user's, when given; with their state when asked, at most MAX_FULL_PAGE a page),
        each with the preview of its first user message."""
        validation.namespace(namespace)
        newest_first = _order(order) is ConversationOrder.NEWEST_FIRST
        limit = page_size(size)
        if with_state:
            limit = min(limit, MAX_FULL_PAGE)
        user = user_id(user_id_text) if user_id_text else None
        # The filter and the order are part of what a token continues (a token of
        # another listing is refused); the unfiltered listing in id order keeps {}, so
        # that its tokens stay valid across this release.
        request: dict[str, object] = {"user_id": user} if user is not None else {}
        if newest_first:
            request["order"] = "newest_first"
        after: uuid.UUID | None = None
        after_time: datetime | None = None
        if token:
            cursor = self.page_tokens.decode(token, "conversations", namespace, request)
            after = uuid.UUID(cursor["after"])
            if newest_first:
                after_time = datetime.fromisoformat(cursor["after_time"])
        rows = await self.store.list_conversations(
            namespace, after, limit + 1, user, with_state, newest_first, after_time
        )
        page, more = rows[:limit], len(rows) > limit
        next_token = ""
        if more:
            last = page[-1]
            position: dict[str, str] = {"after": str(last.conversation_id)}
            if newest_first:
                position["after_time"] = last.create_time.isoformat()
            next_token = self.page_tokens.encode("conversations", namespace, request, position)
        return ConversationPage(page, next_token)

    async def mark_curated(
        self, namespace: str, conversation_id_text: str, incarnation: int, curated_through: int
    ) -> Conversation:
        """Record that automatic curation read the conversation through `curated_through`
        (of `incarnation`, when not 0): monotonic, so a lower value (a late or repeated
        call) changes nothing; past the last entry is SEQUENCE_OUT_OF_RANGE, another
        incarnation CONVERSATION_ERASED."""
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        if incarnation < 0:
            raise invalid_argument(
                "INVALID_INCARNATION", "incarnation must not be negative", field="incarnation"
            )
        if curated_through < 0:
            raise invalid_argument(
                "INVALID_SEQUENCE",
                "curated_through must not be negative",
                field="curated_through",
            )
        return await self.store.mark_curated(namespace, cid, incarnation, curated_through)

    async def list_namespaces(
        self, size: int, token: str, granted: frozenset[str] | None
    ) -> NamespacePage:
        """A page of the namespaces that hold conversations, in name order: every one
        (`granted` None: authentication off, or a grant of every namespace), or only
        those among `granted`. A page token continues only a listing of the same grants."""
        limit = page_size(size)
        among = sorted(granted) if granted is not None else None
        # Bound to the grants (by digest: a token need not carry an identity's list).
        scope = "*" if among is None else hashlib.sha256("\n".join(among).encode()).hexdigest()
        request = {"grants": scope}
        after = ""
        if token:
            after = str(self.page_tokens.decode(token, "namespaces", "", request)["after"])
        rows = await self.store.list_namespaces(after, limit + 1, among)
        page, more = rows[:limit], len(rows) > limit
        next_token = (
            self.page_tokens.encode("namespaces", "", request, {"after": page[-1]}) if more else ""
        )
        return NamespacePage(page, next_token)

    async def delete_conversation(
        self,
        namespace: str,
        conversation_id_text: str,
        incarnation: int = 0,
        receipt: ErasureProgress | None = None,
        erased_forks: Sequence[tuple[str, int]] | None = None,
    ) -> Deletion:
        """Erase a conversation (only that incarnation, when given: one erased and made
        again meanwhile is left alone); `deleted` False when there was nothing to erase.

        With a `receipt` (what an erasure erased elsewhere and what remains), record the
        erasure receipt of `incarnation` in the same transaction, with the entries and
        appends erased: the transcript is never gone without its receipt. Recorded even
        when there was nothing left to delete (a retry: it merges).

        With `erased_forks` (the forks, id and incarnation, whose derived data an erasure
        erased), FORKS_CHANGED when it would erase another fork (made since they were
        listed): nothing is deleted then."""
        validation.namespace(namespace)
        if incarnation < 0:
            raise invalid_argument(
                "INVALID_INCARNATION", "incarnation must not be negative", field="incarnation"
            )
        if receipt is not None:
            incarnation_to_erase(incarnation)
            receipt = check_progress(receipt.counts, receipt.remaining)
        forks = (
            None
            if erased_forks is None
            else {
                (conversation_id(fork_id, "erased_forks"), fork_incarnation)
                for fork_id, fork_incarnation in erased_forks
            }
        )
        return await self.store.delete_conversation(
            namespace, conversation_id(conversation_id_text), incarnation, receipt, forks
        )


def _order(value: int) -> ConversationOrder:
    """A listing's order from the request (0: in id order); another value is INVALID_ORDER."""
    if value == 0:
        return ConversationOrder.ID
    try:
        return ConversationOrder(value)
    except ValueError:
        raise invalid_argument(
            "INVALID_ORDER", "order must be a ConversationOrder value", field="order"
        ) from None
