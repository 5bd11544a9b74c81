"""TranscriptService as a server component: its pool, migrations and servicer."""

from __future__ import annotations

from pathlib import Path

import grpc

from runifold.transcript.v1 import transcript_service_pb2, transcript_service_pb2_grpc
from services.common import migrations
from services.common.db import Database
from services.common.messages import append_request_bytes
from services.common.pagination import PageTokens
from services.common.server import StartContext
from services.transcript.config import TranscriptLimits
from services.transcript.service import TranscriptService
from services.transcript.servicer import TranscriptServicer
from services.transcript.store import PostgresTranscriptStore

MIGRATIONS = Path(__file__).parent / "migrations"
SERVICE_NAME = transcript_service_pb2.DESCRIPTOR.services_by_name["TranscriptService"].full_name


class TranscriptComponent:
    """Hosts TranscriptService in a server process."""

    name = "transcript"
    service_names = (SERVICE_NAME,)

    def __init__(self, limits: TranscriptLimits | None = None) -> None:
        self.limits = limits or TranscriptLimits.from_env()
        self.db: Database | None = None
        self.service: TranscriptService | None = None

    def register(self, server: grpc.aio.Server) -> None:
        assert self.service is not None, "register after start"
        transcript_service_pb2_grpc.add_TranscriptServiceServicer_to_server(
            TranscriptServicer(self.service), server
        )

    async def start(self, ctx: StartContext) -> None:
        self.db = await migrations.open_database(
            ctx.database_url, ctx.settings, self.name, MIGRATIONS
        )
        self.service = TranscriptService(
            PostgresTranscriptStore(self.db),
            self.limits,
            PageTokens(ctx.settings.page_token_secret),
        )

    async def stop(self) -> None:
        if self.db is not None:
            await self.db.close()

    async def healthy(self) -> bool:
        return await migrations.serving_schema(self.db, self.name, MIGRATIONS)

    @property
    def max_request_bytes(self) -> int:
        """The largest request the limits allow (an AppendEntries): the transport cap."""
        return append_request_bytes(self.limits.messages)
