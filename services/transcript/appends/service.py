"""AppendEntries (TranscriptService): validates a write, keeps tool calls paired with
their results across appends, and hands the store one atomic append. Knows nothing of
gRPC or SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from services.common import messages as message_rules
from services.common import validation
from services.common.domain import (
    SEQUENCE_MAX,
    Message,
    Role,
    Usage,
    canonical_json,
    check_tool_pairing,
    open_tool_calls,
)
from services.common.errors import VersionConflict, invalid_argument
from services.common.validation import conversation_id
from services.transcript.appends.model import (
    AppendResult,
    NewAppend,
    retractions,
    write_digest,
)
from services.transcript.appends.store import AppendStore
from services.transcript.config import TranscriptLimits
from services.transcript.conversations.model import (
    NO_STATE_CHANGE,
    StateChange,
    conversation_not_found,
)
from services.transcript.digests.model import body
from services.transcript.views.store import ViewStore

# An unconditional append that depends on the transcript's tail (it starts with
# tool results) is retried this often when another writer moves the tail.
_TAIL_RETRIES = 5
NO_USAGE = Usage()


class AppendingStore(AppendStore, ViewStore, Protocol):
    """What appending needs of the store: the append, and the view read that checks the
    tail an append of tool results continues."""


class Appends:
    """The append methods of TranscriptService (services/transcript/service.py)."""

    store: AppendingStore
    limits: TranscriptLimits
    # Whether appends extend the digest chain (always, but in the benchmark's baseline).
    digests: bool = True

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
        digest_body = body(retracted, messages) if self.digests else None

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
                digest_body,
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
