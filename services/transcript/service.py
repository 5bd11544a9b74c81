"""TranscriptService domain logic: the rules of append-only transcripts.

The service is its features together, each in its folder with its rules (model.py),
its orchestration (service.py), its store protocol and SQL adapter (store.py) and its
SQL (statements.py):

- conversations/: create, get, list and erase conversations; the state of a
  conversation, its user and its namespace;
- appends/: AppendEntries, one atomic append with compare-and-swap and idempotency;
- forks/: ForkConversation, a conversation from a prefix of another, sharing it;
- digests/: the digest chain of appends (ListAppends);
- views/: LoadView (the bounded context of a turn) and ListEntries;
- leases/: turn leases (`TranscriptService.leases`);
- watch/: WatchConversation, served beside this class (component.py wires it);
- receipts/: erasure receipts, recorded by erasures and kept after them;
- checkpoints/: LangGraph checkpoints of a conversation (a thread), their channel
  values and pending writes.

Takes a `TranscriptStore`; knows nothing of gRPC or SQL.
"""

from __future__ import annotations

from services.common.pagination import PageTokens
from services.transcript.appends.service import Appends
from services.transcript.checkpoints.service import Checkpoints
from services.transcript.config import TranscriptLimits
from services.transcript.conversations.service import Conversations
from services.transcript.digests.service import Chain
from services.transcript.forks.service import Forks
from services.transcript.leases.service import TurnLeases
from services.transcript.receipts.service import Receipts
from services.transcript.store import TranscriptStore
from services.transcript.views.service import Views


class TranscriptService(Conversations, Appends, Views, Receipts, Forks, Chain, Checkpoints):
    """Conversations and their append-only entries."""

    store: TranscriptStore

    def __init__(
        self, store: TranscriptStore, limits: TranscriptLimits, page_tokens: PageTokens
    ) -> None:
        self.store = store
        self.limits = limits
        self.page_tokens = page_tokens
        self.leases = TurnLeases(store, limits)
