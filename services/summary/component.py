"""SummaryService as a server component: its pool, migrations, peer, summarizer and workers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc

from runifold.summary.v1 import summary_service_pb2, summary_service_pb2_grpc
from services.common import migrations
from services.common.auth import service_identity
from services.common.channels import Peer, open_channel
from services.common.postgres.pool import Database
from services.common.server import StartContext
from services.llm.openai import OpenAIChatModel
from services.summary.config import SummaryConfig
from services.summary.jobs.worker import SummaryWorkers
from services.summary.remote import GrpcTranscripts
from services.summary.service import SummaryService
from services.summary.servicer import SummaryServicer
from services.summary.store import PostgresSummaryStore
from services.summary.summarizers.chat import ChatModelSummarizer
from services.summary.summarizers.offline import OFFLINE_TARGET_BYTES, OfflineSummarizer
from services.summary.summarizers.prompt import Summarizer

MIGRATIONS = Path(__file__).parent / "migrations"
SERVICE_NAME = summary_service_pb2.DESCRIPTOR.services_by_name["SummaryService"].full_name


def build_summarizer(config: SummaryConfig) -> tuple[Summarizer, OpenAIChatModel | None]:
    """The summarizer the configuration names (and the HTTP client to close, if any)."""
    if not config.chat_model.offline:
        model = OpenAIChatModel.from_settings(config.chat_model, purpose="summary")
        summarizer = ChatModelSummarizer(
            model,
            max_entry_chars=config.max_entry_chars,
            max_summary_bytes=config.max_summary_bytes,
        )
        return summarizer, model
    offline = OfflineSummarizer(
        max_entry_chars=config.max_entry_chars,
        target_bytes=min(OFFLINE_TARGET_BYTES, config.max_summary_bytes),
    )
    return offline, None


class SummaryComponent:
    """Hosts SummaryService (and its queue workers) in a server process."""

    name = "summary"
    service_names = (SERVICE_NAME,)

    def __init__(
        self, config: SummaryConfig | None = None, summarizer: Summarizer | None = None
    ) -> None:
        self.config = config or SummaryConfig.from_env()
        self._summarizer = summarizer
        self.db: Database | None = None
        self.peer: Peer | None = None
        self.service: SummaryService | None = None
        self.workers: SummaryWorkers | None = None
        self._model: OpenAIChatModel | None = None

    def register(self, server: grpc.aio.Server) -> None:
        assert self.service is not None, "register after start"
        summary_service_pb2_grpc.add_SummaryServiceServicer_to_server(
            SummaryServicer(self.service), server
        )

    async def start(self, ctx: StartContext) -> None:
        transcript_address = ctx.peer_address("transcript")
        self.db = await migrations.open_database(
            ctx.database_url, ctx.settings, self.name, MIGRATIONS
        )
        self.peer = Peer(
            "transcript",
            open_channel(transcript_address, ctx.auth),
            timeout=self.config.peer_timeout_s,
        )
        summarizer = self._summarizer
        if summarizer is None:
            summarizer, self._model = build_summarizer(self.config)
        store = PostgresSummaryStore(self.db, history_limit=self.config.history_limit)
        self.service = SummaryService(store, GrpcTranscripts(self.peer), summarizer, self.config)
        if self.config.workers:
            service_identity(ctx.auth, "check")  # fails at start if jwt has no service token
        self.workers = SummaryWorkers(
            self.service,
            self.config,
            ready=self._peer_ready,
            identity=lambda namespace: service_identity(ctx.auth, namespace),
        )
        self.service.on_enqueue = self.workers.wake
        await self.workers.start()

    async def _peer_ready(self) -> bool:
        """True when TranscriptService is reachable: workers claim nothing before (in the
        all-in-one server the components start before the port serves)."""
        assert self.peer is not None
        channel = self.peer.channel
        if channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
            return True
        try:
            await asyncio.wait_for(channel.channel_ready(), self.config.poll_interval_s)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        if self.workers is not None:
            await self.workers.stop()
            self.workers = None
        if self._model is not None:
            await self._model.aclose()
            self._model = None
        if self.peer is not None:
            await self.peer.close()
            self.peer = None
        if self.db is not None:
            await self.db.close()

    async def healthy(self) -> bool:
        return await migrations.serving_schema(self.db, self.name, MIGRATIONS)
