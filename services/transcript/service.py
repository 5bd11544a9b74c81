"""TranscriptService domain logic: the rules of append-only transcripts.

Takes a `TranscriptStore`; knows nothing of gRPC or SQL. The store makes each
write atomic; this layer validates input, keeps tool calls paired with their
results, and computes the bounded view of a turn. The rules of what a write
carries besides its messages are in write_rules.py, the view's cut in views.py,
the turn leases' in leases.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import uuid_utils

from services.common import messages as message_rules
from services.common import validation
from services.common.domain import (
    SEQUENCE_MAX,
    Entry,
    Message,
    Role,
    Usage,
    canonical_json,
    check_tool_pairing,
    open_tool_calls,
)
from services.common.errors import VersionConflict, invalid_argument
from services.common.pagination import PageTokens, page_size
from services.common.validation import conversation_id
from services.transcript.config import TranscriptLimits
from services.transcript.leases import TurnLeases
from services.transcript.model import (
    NO_STATE_CHANGE,
    AppendResult,
    Conversation,
    NewAppend,
    ScopedState,
    StateChange,
    View,
    conversation_not_found,
    view_ranges,
)
from services.transcript.store import TranscriptStore
from services.transcript.views import merge_ranges, split_view
from services.transcript.write_rules import retractions, state_change, user_id, write_digest

# An unconditional append that depends on the transcript's tail (it starts with
# tool results) is retried this often when another writer moves the tail.
_TAIL_RETRIES = 5
NO_USAGE = Usage()
# Users one GetState reads; a page of conversations with their state (CONVERSATION_VIEW_FULL).
MAX_STATE_USERS = 100
MAX_FULL_PAGE = 50


@dataclass(frozen=True, slots=True)
class EntryPage:
    """A page of entries."""

    entries: Sequence[Entry]
    next_page_token: str


@dataclass(frozen=True, slots=True)
class ConversationPage:
    """A page of conversations."""

    conversations: Sequence[Conversation]
    next_page_token: str


class TranscriptService:
    """Conversations and their append-only entries."""

    def __init__(
        self, store: TranscriptStore, limits: TranscriptLimits, page_tokens: PageTokens
    ) -> None:
        self.store = store
        self.limits = limits
        self.page_tokens = page_tokens
        self.leases = TurnLeases(store, limits)

    # -- conversations ------------------------------------------------------

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
    ) -> ConversationPage:
        """A page of the namespace's conversations in id order (only a user's, when
        given; with their state when asked, at most MAX_FULL_PAGE a page)."""
        validation.namespace(namespace)
        limit = page_size(size)
        if with_state:
            limit = min(limit, MAX_FULL_PAGE)
        user = user_id(user_id_text) if user_id_text else None
        # The filter is part of what a token continues (a token of another listing is
        # refused); the unfiltered listing's request stays {} as before.
        request: dict[str, object] = {"user_id": user} if user is not None else {}
        after = None
        if token:
            cursor = self.page_tokens.decode(token, "conversations", namespace, request)
            after = uuid.UUID(cursor["after"])
        rows = await self.store.list_conversations(namespace, after, limit + 1, user, with_state)
        page, more = rows[:limit], len(rows) > limit
        next_token = (
            self.page_tokens.encode(
                "conversations", namespace, request, {"after": str(page[-1].conversation_id)}
            )
            if more
            else ""
        )
        return ConversationPage(page, next_token)

    async def delete_conversation(
        self, namespace: str, conversation_id_text: str, incarnation: int = 0
    ) -> int | None:
        """Erase a conversation (only that incarnation, when given: one erased and made
        again meanwhile is left alone); None when there was nothing to erase."""
        validation.namespace(namespace)
        if incarnation < 0:
            raise invalid_argument(
                "INVALID_INCARNATION", "incarnation must not be negative", field="incarnation"
            )
        return await self.store.delete_conversation(
            namespace, conversation_id(conversation_id_text), incarnation
        )

    # -- appends ------------------------------------------------------------

    def validate_messages(
        self, messages: Sequence[Message], field: str = "messages", allow_empty: bool = False
    ) -> None:
        """Check every message rule and the append's size limits."""
        message_rules.append_messages(messages, self.limits.messages, field, allow_empty)

    async def append(
        self,
        namespace: str,
        conversation_id_text: str,
        expected_version: int | None,
        messages: Sequence[Message],
        request_id_text: str,
        usage: Usage = NO_USAGE,
        fencing_token: int | None = None,
        state: StateChange = NO_STATE_CHANGE,
        retract: Sequence[int] = (),
    ) -> AppendResult:
        """Append messages atomically; see the proto for the full contract.

        With `fencing_token` the append commits under that turn lease (its
        request id is the lease's turn id) and ends it; without, it is refused
        while another turn holds the conversation exclusively. The same write
        may change state and retract standing entries (a retraction is decided
        on what the writer read, so it needs `expected_version`).
        """
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        request_id = validation.request_id(request_id_text)
        if fencing_token is not None and request_id is None:
            raise invalid_argument(
                "INVALID_REQUEST_ID",
                "an append under a turn lease carries the lease's turn_id as request_id",
                field="request_id",
            )
        if expected_version is not None and expected_version < 0:
            raise invalid_argument(
                "INVALID_EXPECTED_VERSION",
                "expected_version must not be negative",
                field="expected_version",
            )
        retracted = retractions(retract, expected_version)
        self.validate_messages(messages, allow_empty=bool(state or retracted))
        encoded = canonical_json(messages)
        digest = write_digest(encoded, state, retracted)

        def command(version: int | None) -> NewAppend:
            return NewAppend(
                namespace,
                cid,
                version,
                messages,
                request_id,
                digest,
                usage,
                encoded,
                fencing_token,
                state,
                retracted,
                self.limits.max_state_bytes,
            )

        if not messages or messages[0].role != Role.TOOL:
            check_tool_pairing(messages, None)
            return await self.store.append(command(expected_version))

        # The append continues a tool call group: its first results answer calls
        # at the tail, so it must commit at the version whose tail was checked.
        for _ in range(_TAIL_RETRIES):
            # One consistent read: the version, the tail that may hold the calls,
            # and a prior append of this request id.
            head = await self.store.read_view(
                namespace, cid, self.limits.tool_group_bound, 1, SEQUENCE_MAX, request_id
            )
            if head is None:
                raise conversation_not_found()
            if head.prior_append is not None:
                # A retry of a committed append; the store replays it (or
                # rejects a reused id) without writing.
                return await self.store.append(command(expected_version))
            version = head.version
            open_calls = (
                open_tool_calls([entry.message for entry in head.entries])
                if head.last_sequence
                else None
            )
            if expected_version is not None and version != expected_version:
                raise VersionConflict(version, expected_version)
            check_tool_pairing(messages, open_calls)
            try:
                return await self.store.append(command(version))
            except VersionConflict:
                if expected_version is not None:
                    raise
        raise VersionConflict(version, version)

    # -- reads --------------------------------------------------------------

    async def list_entries(
        self,
        namespace: str,
        conversation_id_text: str,
        after_sequence: int,
        through_sequence: int,
        size: int,
        token: str,
    ) -> EntryPage:
        """A page of entries in sequence order (AIP-158)."""
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        if after_sequence < 0 or through_sequence < 0:
            raise invalid_argument(
                "INVALID_SEQUENCE",
                "sequences must not be negative",
                field="after_sequence" if after_sequence < 0 else "through_sequence",
            )
        limit = page_size(size)
        request = {
            "conversation_id": str(cid),
            "after": after_sequence,
            "through": through_sequence,
        }
        after = after_sequence
        if token:
            after = int(self.page_tokens.decode(token, "entries", namespace, request)["after"])
        entries = await self.store.list_entries(
            namespace, cid, after, through_sequence or None, limit + 1
        )
        if entries is None:
            raise conversation_not_found()
        page, more = entries[:limit], len(entries) > limit
        next_token = (
            self.page_tokens.encode("entries", namespace, request, {"after": page[-1].sequence})
            if more
            else ""
        )
        return EntryPage(page, next_token)

    async def load_view(
        self,
        namespace: str,
        conversation_id_text: str,
        window: int,
        summary_batch: int,
        summarized_through: int,
        request_id_text: str = "",
    ) -> View:
        """The bounded context of a turn.

        window: the last `window` entries, never starting with a tool result
        whose call it cut off (it then starts after those results, or, if that
        would leave it empty, at the call).
        summary_buffer: the oldest unsummarized entries before the window, at
        most `summary_batch`, never ending between a tool call and its results.
        Reads O(window + summary_batch) entries whatever the transcript's length.
        """
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        validation.view_bounds(window, summary_batch)
        request_id = validation.request_id(request_id_text)
        if summarized_through < 0:
            raise invalid_argument(
                "INVALID_SEQUENCE",
                "summarized_through must not be negative",
                field="summarized_through",
            )

        # No transcript reaches this sequence; capping what the store sees keeps its
        # range arithmetic (through + batch + 1) inside bigint. Beyond the transcript
        # is SEQUENCE_OUT_OF_RANGE below, as for any value past the last entry.
        read_through = min(summarized_through, SEQUENCE_MAX)
        head = await self.store.read_view(
            namespace, cid, window, summary_batch, read_through, request_id
        )
        if head is None:
            raise conversation_not_found()
        last = head.last_sequence
        if summarized_through > last:
            raise invalid_argument(
                "SEQUENCE_OUT_OF_RANGE",
                "summarized_through is beyond the transcript",
                field="summarized_through",
                last_sequence=last,
            )
        (window_low, _), _ = view_ranges(last, window, summary_batch, summarized_through)
        entries = head.entries
        roles = {entry.sequence: entry.message.role for entry in entries}
        naive_end = min(summarized_through + summary_batch, window_low - 1)
        if (last and roles[window_low] == Role.TOOL) or (
            summarized_through < naive_end < last and roles[naive_end + 1] == Role.TOOL
        ):
            # A boundary falls inside a tool call group: read the group's
            # surroundings (a group spans at most `bound` entries).
            bound = self.limits.tool_group_bound
            ranges = merge_ranges(
                [
                    (max(1, window_low - bound), last),
                    (
                        summarized_through + 1,
                        min(last, summarized_through + summary_batch + bound + 1),
                    ),
                ]
            )
            entries = await self.store.read_entries(namespace, cid, ranges)
            if len(entries) != sum(high - low + 1 for low, high in ranges):
                raise conversation_not_found()  # erased while we read
            roles = {entry.sequence: entry.message.role for entry in entries}
        return split_view(
            head.incarnation,
            head.version,
            last,
            entries,
            roles,
            window_low,
            summary_batch,
            summarized_through,
            self.limits.tool_group_bound,
            head.prior_append,
            head.conversation,
        )
