"""MemoryService as a server component: pool, migrations, index, embedder, background work.

The pluggable parts (the embedder, the index back-end, the proposer and its model
client) are chosen and built here, from the configuration: the packages that hold
them import none of their implementations, so no import cycle runs through a factory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import grpc

from runifold.memory.v1 import memory_service_pb2, memory_service_pb2_grpc
from services.common import migrations
from services.common.auth import service_identity
from services.common.channels import Peer, open_channel
from services.common.pagination import PageTokens
from services.common.postgres.notify import PostgresChangeBus
from services.common.postgres.pool import Database
from services.common.server import StartContext
from services.common.settings import SettingsError
from services.llm.openai import OpenAIChatModel
from services.memory.config import MemoryConfig
from services.memory.curation.store import PostgresCurationStore
from services.memory.curation.worker import CurationWorkers
from services.memory.embeddings.local import LocalEmbedder
from services.memory.embeddings.openai import OpenAIEmbedder
from services.memory.embeddings.protocol import Embedder
from services.memory.index.protocol import IndexUnavailable, VectorIndex
from services.memory.outbox.indexer import Indexer, Sweeper
from services.memory.ports import SourceChecker
from services.memory.proposals.offline import OfflineProposer
from services.memory.proposals.proposer import ChatModelProposer, Proposer
from services.memory.remote import TranscriptSources
from services.memory.service import MemoryService
from services.memory.servicer import MemoryServicer
from services.memory.store import PostgresMemoryStore
from services.memory.watch.service import CHANNEL, Feed
from services.memory.watch.store import PostgresFeedStore

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"
SERVICE_NAME = memory_service_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name


# -- the pluggable parts, chosen and built here --------------------------------------


def make_embedder(config: MemoryConfig) -> LocalEmbedder | OpenAIEmbedder:
    """The embedder the configuration names."""
    if config.embeddings == "openai":
        return OpenAIEmbedder(
            config.embeddings_url,
            config.embeddings_model,
            config.embeddings_dimension,
            api_key=config.embeddings_api_key,
            timeout_s=config.embeddings_timeout_s,
            batch_size=config.embeddings_batch,
            max_concurrent=config.embeddings_max_concurrent,
            max_queued=config.embeddings_max_queued,
        )
    return LocalEmbedder(
        config.embeddings_batch,
        config.embeddings_threads,
        batch_tokens=config.embeddings_batch_tokens,
        max_queued=config.embeddings_max_queued,
        namespace_share=config.embeddings_namespace_share,
        cache_dir=config.embeddings_cache_dir,
    )


def make_index(
    config: MemoryConfig, *, model: str, dimension: int, edge_dir: Path, database_url: str
) -> VectorIndex:
    """The adapter named by RUNIFOLD_MEMORY_INDEX (edge, qdrant or pgvector), for one
    embedding model and dimension.

    `edge_dir` is where the Edge shard lives unless RUNIFOLD_MEMORY_INDEX_DIR says;
    pgvector uses `database_url` unless RUNIFOLD_MEMORY_PGVECTOR_URL says. Each back-end
    is imported when chosen: only its own client library loads.
    """
    if config.index == "edge":
        from services.memory.index.edge import EdgeIndex

        return EdgeIndex(config.index_dir or edge_dir, model, dimension)
    if config.index == "qdrant":
        from services.memory.index.qdrant.adapter import QdrantIndex

        return QdrantIndex(
            model,
            dimension,
            url=config.qdrant_url,
            api_key=config.qdrant_api_key,
            timeout_s=config.qdrant_timeout_s,
        )
    if config.index == "pgvector":
        from services.memory.index.pgvector.adapter import PgvectorIndex

        return PgvectorIndex(
            config.pgvector_url or database_url,
            model,
            dimension,
            ef_search=config.pgvector_ef_search,
            exact_below=config.pgvector_exact_below,
            timeout_s=config.pgvector_timeout_s,
        )
    raise ValueError(f"unknown index kind {config.index!r}")


def build_proposer(config: MemoryConfig) -> tuple[Proposer, OpenAIChatModel | None]:
    """The proposer the configuration names (and the HTTP client to close, if any)."""
    if not config.chat_model.offline:
        model = OpenAIChatModel.from_settings(config.chat_model, purpose="memory_proposal")
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
        self.curation_store: PostgresCurationStore | None = None
        self.curators: CurationWorkers | None = None
        self.feed: Feed | None = None

    def register(self, server: grpc.aio.Server) -> None:
        assert self.service is not None and self.feed is not None, "register after start"
        memory_service_pb2_grpc.add_MemoryServiceServicer_to_server(
            MemoryServicer(self.service, self.feed), server
        )

    async def start(self, ctx: StartContext) -> None:
        watch = self.config.watch
        rpcs = ctx.settings.transport.max_concurrent_rpcs
        if rpcs and watch.max_watchers >= rpcs:
            # Every open stream is an RPC in flight: at the limit nothing else is served.
            raise SettingsError(
                f"RUNIFOLD_MEMORY_WATCH_MAX_WATCHERS ({watch.max_watchers}) must be below "
                f"RUNIFOLD_MAX_CONCURRENT_RPCS ({rpcs}): each WatchMemories stream is a "
                "call in flight"
            )
        self.db = await migrations.open_database(
            ctx.database_url, ctx.settings, self.name, MIGRATIONS
        )
        self.store = PostgresMemoryStore(self.db)
        self.feed = Feed(
            PostgresFeedStore(self.db),
            PostgresChangeBus(
                self.db.url, ctx.settings, channel=CHANNEL, feed="memory feed", check_s=watch.poll_s
            ),
            watch,
        )
        # Writes wake the streams of their namespace, here and (by NOTIFY) in the others.
        self.store.changes = self.feed
        await self.feed.start(wait_s=ctx.settings.db_timeout_s)
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
        self.curation_store = PostgresCurationStore(self.db)
        self.service = MemoryService(
            self.store,
            self.index,
            self.embedder,
            self.sources,
            self.config,
            PageTokens(ctx.settings.page_token_secret),
            on_write=self.indexer.wake,
            proposer=self.proposer,
            curation_store=self.curation_store,
        )
        self.curators = CurationWorkers(
            self.service,
            self.curation_store,
            self.config,
            ready=self._peer_ready,
            identity=lambda namespace: service_identity(ctx.auth, namespace),
        )
        self.service.on_curation_request = self.curators.wake
        if self.background:
            if self.config.indexers:
                self.indexer.start()
            self.sweeper.start()
            if self._may_curate(ctx):
                await self.curators.start()

    @staticmethod
    def _may_curate(ctx: StartContext) -> bool:
        """Whether the curation workers can act for a namespace (under RUNIFOLD_AUTH=jwt
        they need the service's own token). Without one they do not start: a deployment
        that never asked for curation keeps starting as before, and the jobs asked for
        wait (GetCurationBacklog shows them)."""
        try:
            service_identity(ctx.auth, "check")
        except SettingsError as exc:
            log.warning("curation workers not started", extra={"detail": str(exc)})
            return False
        return True

    async def _peer_ready(self) -> bool:
        """True when TranscriptService is reachable: workers claim nothing before (in the
        all-in-one server the components start before the port serves)."""
        if self.peer is None:
            return True  # sources given by the caller (tests, tools)
        channel = self.peer.channel
        if channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
            return True
        try:
            await asyncio.wait_for(channel.channel_ready(), self.config.curation_poll_interval_s)
        except TimeoutError:
            return False
        return True

    async def drain(self, timeout_s: float) -> None:
        """End the WatchMemories streams (shutdown): their clients resume elsewhere."""
        if self.feed is not None:
            await self.feed.drain(timeout_s)

    async def stop(self) -> None:
        if self.curators is not None:
            await self.curators.stop()
        if self.feed is not None:
            await self.feed.stop()
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
