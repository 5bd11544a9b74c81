"""The reads of entries (TranscriptService): ListEntries, and LoadView, the bounded
context of a turn. Validates requests and cuts the view (model.py); knows nothing of
gRPC or SQL (the store is a `ViewStore`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.common import validation
from services.common.domain import SEQUENCE_MAX, Entry, Role
from services.common.errors import invalid_argument
from services.common.pagination import PageTokens, page_size
from services.common.validation import conversation_id
from services.transcript.config import TranscriptLimits
from services.transcript.conversations.model import conversation_not_found
from services.transcript.views.model import View, merge_ranges, split_view, view_ranges
from services.transcript.views.store import ViewStore


@dataclass(frozen=True, slots=True)
class EntryPage:
    """A page of entries."""

    entries: Sequence[Entry]
    next_page_token: str


class Views:
    """The reads of entries of TranscriptService (services/transcript/service.py)."""

    store: ViewStore
    limits: TranscriptLimits
    page_tokens: PageTokens

    async def list_entries(
        self,
        namespace: str,
        conversation_id_text: str,
        after_sequence: int,
        through_sequence: int,
        size: int,
        token: str,
        retracted_after_version: int = 0,
    ) -> EntryPage:
        """A page of entries in sequence order (AIP-158); with `retracted_after_version`,
        only the entries a write after that version retracted."""
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        if after_sequence < 0 or through_sequence < 0:
            raise invalid_argument(
                "INVALID_SEQUENCE",
                "sequences must not be negative",
                field="after_sequence" if after_sequence < 0 else "through_sequence",
            )
        if retracted_after_version < 0:
            raise invalid_argument(
                "INVALID_VERSION",
                "retracted_after_version must not be negative",
                field="retracted_after_version",
            )
        limit = page_size(size)
        request: dict[str, object] = {
            "conversation_id": str(cid),
            "after": after_sequence,
            "through": through_sequence,
        }
        # Only when given: a token of a plain listing stays valid across an upgrade.
        if retracted_after_version:
            request["retracted_after_version"] = retracted_after_version
        after = after_sequence
        if token:
            after = int(self.page_tokens.decode(token, "entries", namespace, request)["after"])
        entries = await self.store.list_entries(
            namespace, cid, after, through_sequence or None, limit + 1, retracted_after_version
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
