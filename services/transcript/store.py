"""The transcript store: every feature's store protocol together (`TranscriptStore`, which
the in-memory double of the tests implements too) and their PostgreSQL adapters
together (`PostgresTranscriptStore`). WatchConversation's reads are a store of their
own (watch/store.py).
"""

from __future__ import annotations

from typing import Protocol

from services.transcript.appends.store import AppendStore, PostgresAppends
from services.transcript.checkpoints.store import CheckpointStore, PostgresCheckpoints
from services.transcript.conversations.store import ConversationStore, PostgresConversations
from services.transcript.digests.store import ChainStore, PostgresChain
from services.transcript.forks.store import ForkStore, PostgresForks
from services.transcript.leases.store import PostgresTurnLeases, TurnLeaseStore
from services.transcript.receipts.store import PostgresReceipts, ReceiptStore
from services.transcript.views.store import PostgresViews, ViewStore


class TranscriptStore(
    ConversationStore,
    AppendStore,
    ViewStore,
    TurnLeaseStore,
    ReceiptStore,
    ForkStore,
    ChainStore,
    CheckpointStore,
    Protocol,
):
    """What the transcript service needs from a store. Every method is atomic."""


class PostgresTranscriptStore(
    PostgresConversations,
    PostgresAppends,
    PostgresViews,
    PostgresTurnLeases,
    PostgresReceipts,
    PostgresForks,
    PostgresChain,
    PostgresCheckpoints,
):
    """TranscriptStore on PostgreSQL (schema `transcript`)."""
