"""ListAppends (TranscriptService): a page of a conversation's digest chain. Validates
the request; knows nothing of gRPC or SQL (the store is a `ChainStore`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.common import validation
from services.common.errors import invalid_argument
from services.common.pagination import PageTokens, page_size
from services.common.validation import conversation_id
from services.transcript.conversations.model import conversation_not_found
from services.transcript.digests.model import ChainLink
from services.transcript.digests.store import ChainStore


@dataclass(frozen=True, slots=True)
class AppendPage:
    """A page of appends."""

    appends: Sequence[ChainLink]
    next_page_token: str


class Chain:
    """The digest chain method of TranscriptService (services/transcript/service.py)."""

    store: ChainStore
    page_tokens: PageTokens

    async def list_appends(
        self, namespace: str, conversation_id_text: str, after_version: int, size: int, token: str
    ) -> AppendPage:
        """A page of the conversation's appends in version order (AIP-158), each with its
        digest and the digest it follows."""
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        if after_version < 0:
            raise invalid_argument(
                "INVALID_VERSION", "after_version must not be negative", field="after_version"
            )
        limit = page_size(size)
        request = {"conversation_id": str(cid), "after": after_version}
        after = after_version
        if token:
            after = int(self.page_tokens.decode(token, "appends", namespace, request)["after"])
        found = await self.store.list_appends(namespace, cid, after, limit + 1)
        if found is None:
            raise conversation_not_found()
        page, more = found[:limit], len(found) > limit
        next_token = (
            self.page_tokens.encode("appends", namespace, request, {"after": page[-1].version})
            if more
            else ""
        )
        return AppendPage(page, next_token)
