"""TranscriptService as a server component: its pool, migrations, servicer, the change
feed of WatchConversation, and the sweep of lapsed turn leases, kept turn outcomes and
erasure receipts past their retention."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc

from runifold.transcript.v1 import transcript_service_pb2, transcript_service_pb2_grpc
from services.common import migrations
from services.common.background import Background
from services.common.messages import append_request_bytes
from services.common.pagination import PageTokens
from services.common.postgres.pool import Database
from services.common.server import StartContext
from services.common.settings import SettingsError
from services.transcript.config import TranscriptLimits
from services.transcript.service import TranscriptService
from services.transcript.servicer import TranscriptServicer
from services.transcript.store import PostgresTranscriptStore
from services.transcript.watch.bus import PostgresChangeBus
from services.transcript.watch.service import Feed
from services.transcript.watch.store import PostgresFeedStore

MIGRATIONS = Path(__file__).parent / "migrations"
log = logging.getLogger(__name__)

# Lapsed leases and kept outcomes are swept this often, at most this many rows a statement.
SWEEP_INTERVAL_S = 30.0
SWEEP_BATCH = 1000


class TurnSweeper(Background):
    """Deletes the turn rows that are done: outcomes past their retention, committed
    turns, leases whose holder vanished, and empty conversations such a turn made; and
    erasure receipts past theirs (RUNIFOLD_ERASURE_RECEIPT_RETENTION_S)."""

    task_name = "transcript-turn-sweeper"

    def __init__(
        self,
        store: PostgresTranscriptStore,
        retention_s: float,
        receipt_retention_s: float = 365 * 24 * 3600.0,
    ) -> None:
        self.store = store
        self.retention_s = retention_s
        self.receipt_retention_s = receipt_retention_s

    async def run(self) -> None:
        while True:
            try:
                while await self.store.sweep_turns(SWEEP_BATCH, self.retention_s) >= SWEEP_BATCH:
                    pass
            except Exception as error:
                log.warning("turn sweep failed", extra={"error_type": type(error).__name__})
            try:
                while (
                    await self.store.sweep_receipts(self.receipt_retention_s, SWEEP_BATCH)
                    >= SWEEP_BATCH
                ):
                    pass
            except Exception as error:
                log.warning(
                    "erasure receipt sweep failed", extra={"error_type": type(error).__name__}
                )
            await asyncio.sleep(SWEEP_INTERVAL_S)


SERVICE_NAME = transcript_service_pb2.DESCRIPTOR.services_by_name["TranscriptService"].full_name


class TranscriptComponent:
    """Hosts TranscriptService in a server process."""

    name = "transcript"
    service_names = (SERVICE_NAME,)

    def __init__(self, limits: TranscriptLimits | None = None) -> None:
        self.limits = limits or TranscriptLimits.from_env()
        self.db: Database | None = None
        self.service: TranscriptService | None = None
        self.sweeper: TurnSweeper | None = None
        self.feed: Feed | None = None

    def register(self, server: grpc.aio.Server) -> None:
        assert self.service is not None and self.feed is not None, "register after start"
        transcript_service_pb2_grpc.add_TranscriptServiceServicer_to_server(
            TranscriptServicer(self.service, self.feed), server
        )

    async def start(self, ctx: StartContext) -> None:
        rpcs = ctx.settings.transport.max_concurrent_rpcs
        if rpcs and self.limits.watch.max_watchers >= rpcs:
            # Every open stream is an RPC in flight: at the limit nothing else is served.
            raise SettingsError(
                f"RUNIFOLD_WATCH_MAX_WATCHERS ({self.limits.watch.max_watchers}) must be below "
                f"RUNIFOLD_MAX_CONCURRENT_RPCS ({rpcs}): each WatchConversation stream is a "
                "call in flight"
            )
        self.db = await migrations.open_database(
            ctx.database_url, ctx.settings, self.name, MIGRATIONS
        )
        store = PostgresTranscriptStore(self.db)
        self.feed = Feed(
            PostgresFeedStore(self.db),
            PostgresChangeBus(self.db.url, ctx.settings, check_s=self.limits.watch.poll_s),
            self.limits.watch,
        )
        store.changes = self.feed
        await self.feed.start(wait_s=ctx.settings.db_timeout_s)
        self.service = TranscriptService(
            store, self.limits, PageTokens(ctx.settings.page_token_secret)
        )
        # Lease waiters wake on the changes the feed hears of, from any replica.
        self.feed.on_change = self.service.leases.changed
        self.sweeper = TurnSweeper(
            store, self.limits.turn_outcome_retention_s, self.limits.erasure_receipt_retention_s
        )
        self.sweeper.start()

    async def drain(self, timeout_s: float) -> None:
        """End the WatchConversation streams (shutdown): their clients resume elsewhere."""
        if self.feed is not None:
            await self.feed.drain(timeout_s)

    async def stop(self) -> None:
        if self.feed is not None:
            await self.feed.stop()
        if self.sweeper is not None:
            await self.sweeper.stop()
        if self.db is not None:
            await self.db.close()

    async def healthy(self) -> bool:
        return await migrations.serving_schema(self.db, self.name, MIGRATIONS)

    @property
    def max_request_bytes(self) -> int:
        """The largest request the limits allow (an AppendEntries): the transport cap."""
        return append_request_bytes(self.limits.messages) + self.limits.write_extras_bytes
