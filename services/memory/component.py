"""MemoryService as a server component: pool, migrations, index, embedder, background work."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import grpc

from runifold.memory.v1 import memory_service_pb2, memory_service_pb2_grpc
from services.common import migrations
from services.common.channels import Peer, open_channel
from services.common.pagination import PageTokens
from services.common.postgres.pool import Database
from services.common.server import StartContext
from services.llm.openai import OpenAIChatModel
from services.memory.config import MemoryConfig
from services.memory.embeddings import Embedder, make_embedder
from services.memory.index import IndexUnavailable, VectorIndex, make_index
from services.memory.indexer import Indexer, Sweeper
from services.memory.offline_proposer import OfflineProposer
from services.memory.peers import TranscriptSources
from services.memory.ports import SourceChecker
from services.memory.proposals import ChatModelProposer, Proposer
from services.memory.service import MemoryService
from services.memory.servicer import MemoryServicer
from services.memory.store import PostgresMemoryStore

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"
SERVICE_NAME = memory_service_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name


def build_proposer(config: MemoryConfig) -> tuple[Proposer, OpenAIChatModel | None]:
    """The proposer the configuration names (and the HTTP client to close, if any)."""
    if config.proposer == "openai":
        model = OpenAIChatModel(
            config.proposer_model_url,
            config.proposer_model,
            config.proposer_model_api_key,
            config.proposer_timeout_s,
            config.proposer_max_retries,
            purpose="memory_proposal",
        )
        return ChatModelProposer(model, max_entry_chars=config.propose_max_entry_chars), model
    return OfflineProposer(max_entry_chars=config.propose_max_entry_chars), None


class MemoryComponent:
    """Hosts MemoryService in a server process.

    `index`, `embedder`, `sources` and `proposer` may be given (tests, tools);
    otherwise they come from the configuration.
    """

    name = "memory"
    service_names = (SERVICE_NAME,)

    def __init__(
        self,
        config: MemoryConfig | None = None,
        *,
        index: VectorIndex | None = None,
        embedder: Embedder | None = None,
        sources: SourceChecker | None = None,
        proposer: Proposer | None = None,
        background: bool = True,
    ) -> None:
        self.config = config or MemoryConfig.from_env()
        self.index = index
        self.embedder = embedder
        self.sources = sources
        self.proposer = proposer
        self._model: OpenAIChatModel | None = None
        self.background = background
        self.db: Database | None = None
        self.peer: Peer | None = None
        self.store: PostgresMemoryStore | None = None
        self.service: MemoryService | None = None
        self.indexer: Indexer | None = None
        self.sweeper: Sweeper | None = None

    def register(self, server: grpc.aio.Server) -> None:
        assert self.service is not None, "register after start"
        memory_service_pb2_grpc.add_MemoryServiceServicer_to_server(
            MemoryServicer(self.service), server
        )

    async def start(self, ctx: StartContext) -> None:
        self.db = await migrations.open_database(
            ctx.database_url, ctx.settings, self.name, MIGRATIONS
        )
        self.store = PostgresMemoryStore(self.db)
        if self.embedder is None:
            self.embedder = make_embedder(self.config)
        await self.embedder.start()
        if self.index is None:
            self.index = make_index(
                self.config,
                model=self.embedder.model,
                dimension=self.embedder.dimension,
                edge_dir=ctx.settings.data_dir / "memory-index",
                database_url=self.db.url,
            )
        try:
            # A collection made for another size or distance (IndexMismatch) stops the start.
            await self.index.start()
        except IndexUnavailable as exc:
            # Writes still succeed and search degrades; the indexer keeps retrying.
            log.warning(
                "memory index unavailable at start; search degrades until it returns",
                extra={"index": self.index.name, "detail": exc.detail},
            )
        if self.sources is None:
            self.peer = Peer("transcript", open_channel(ctx.peer_address("transcript"), ctx.auth))
            self.sources = TranscriptSources(self.peer)
        self.indexer = Indexer(self.store, self.index, self.embedder, self.config)
        self.sweeper = Sweeper(self.store, self.config, self.indexer.wake, self.index)
        if self.proposer is None:
            self.proposer, self._model = build_proposer(self.config)
        self.service = MemoryService(
            self.store,
            self.index,
            self.embedder,
            self.sources,
            self.config,
            PageTokens(ctx.settings.page_token_secret),
            on_write=self.indexer.wake,
            proposer=self.proposer,
        )
        if self.background:
            if self.config.indexers:
                self.indexer.start()
            self.sweeper.start()

    async def stop(self) -> None:
        if self.indexer is not None:
            await self.indexer.stop()
        if self.sweeper is not None:
            await self.sweeper.stop()
        if self.index is not None:
            with contextlib.suppress(Exception):
                await self.index.close()
        if self.embedder is not None:
            await self.embedder.close()
        if self._model is not None:
            await self._model.aclose()
        if self.peer is not None:
            await self.peer.close()
        if self.db is not None:
            await self.db.close()

    async def healthy(self) -> bool:
        # The index is not part of health: without it the service degrades but serves.
        return await migrations.serving_schema(self.db, self.name, MIGRATIONS)
