"""Behaviour of the memory domain, run against every MemoryStore: its World (a service
with the deterministic fakes of tests/memory/support.py), the base of every feature's
contract suite (writes/, search/, outbox/, proposals/: each its cases.py), and the reads
they share. test_*_domain.py runs a suite on the in-memory store, test_*_store.py on
PostgreSQL: both stores must give the domain the same guarantees. The real engines and
model are exercised in tests/memory/index and through the real server.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta

import pytest

from services.common.errors import Code, DomainError
from services.common.pagination import PageTokens
from services.memory.config import MemoryConfig
from services.memory.model import Memory
from services.memory.outbox.indexer import Indexer
from services.memory.service import MemoryService
from services.memory.store import MemoryStore
from services.memory.writes.inputs import SourceInput, SupersedeInput, ValidityInput
from tests.memory.support import BruteForceIndex, FixedSources, HashEmbedder, entry_time


class World:
    """A service with its fakes, and helpers."""

    def __init__(self, store: MemoryStore, namespace: str) -> None:
        self.store = store
        self.namespace = namespace
        self.embedder = HashEmbedder()
        self.index = BruteForceIndex(self.embedder.dimension)
        self.sources = FixedSources()
        self.config = MemoryConfig(namespace_ttls={f"{namespace}-ttl": timedelta(hours=1)})
        self.service = MemoryService(
            store,
            self.index,
            self.embedder,
            self.sources,
            self.config,
            PageTokens(b"secret-for-tests-0123"),
        )
        self.indexer = Indexer(store, self.index, self.embedder, self.config)
        self.cid = self.sources.add(namespace, 10)

    def source(self, low: int = 1, high: int = 2, cid: str | None = None) -> list[SourceInput]:
        return [SourceInput(cid or self.cid, low, high)]

    async def add(self, content: str, **kw: object) -> uuid.UUID:
        written = await self.service.upsert(
            self.namespace,
            str(kw.pop("memory_id", "")),
            content,
            kw.pop("sources", None) or self.source(),  # type: ignore[arg-type]
            kw.pop("metadata", {}),  # type: ignore[arg-type]
            None,
            validity=kw.pop("validity", None),  # type: ignore[arg-type]
        )
        assert written.created
        return written.memory.memory_id

    async def drain(self) -> None:
        while await self.indexer.run_once():
            pass


def reason(error: pytest.ExceptionInfo[DomainError]) -> tuple[Code, str]:
    return error.value.code, error.value.reason


PARIS = "The user lives in Paris."


BERLIN = "The user lives in Berlin."


QUESTION = "where does the user live"


def ids(memories: Sequence[Memory]) -> set[uuid.UUID]:
    return {m.memory_id for m in memories}


class WorldCases:
    """Cases of MemoryService in a World. Subclasses provide a `store` fixture."""

    @pytest.fixture
    def world(self, store: MemoryStore, namespace: str) -> World:
        return World(store, namespace)

    async def supersede_paris(self, world: World) -> tuple[uuid.UUID, uuid.UUID]:
        """Paris (said at entry 1), then Berlin (entry 5) superseding it."""
        paris = await world.add(PARIS, sources=world.source(1, 1))
        written = await world.service.upsert(
            world.namespace,
            "",
            BERLIN,
            world.source(5, 5),
            {},
            None,
            validity=ValidityInput(supersedes=[SupersedeInput(str(paris), 1)]),
        )
        berlin = written.memory.memory_id
        # The superseded memory as stored: validity closed at Berlin's start, a new revision.
        assert [(m.memory_id, m.revision) for m in written.superseded] == [(paris, 2)]
        assert written.superseded[0].valid_until_time == entry_time(5)
        assert written.superseded[0].superseded_by == berlin
        await world.drain()
        return paris, berlin

    async def found(self, world: World, **kw: object) -> list[uuid.UUID]:
        result = await world.service.search(world.namespace, QUESTION, 5, **kw)  # type: ignore[arg-type]
        return [h.memory.memory_id for h in result.hits]


class MemoryCases(WorldCases):
    """Reads every feature shares: listings and revisions."""

    async def test_list_filters_by_conversation_and_pages(self, world: World) -> None:
        ns = world.namespace
        other = world.sources.add(ns, 3)
        mine = {await world.add(f"F{i}.") for i in range(3)}
        await world.add("G.", sources=world.source(1, 1, cid=other))
        page = await world.service.list_memories(ns, 2, "", world.cid)
        rest = await world.service.list_memories(ns, 2, page.next_page_token, world.cid)
        assert {m.memory_id for m in [*page.memories, *rest.memories]} == mine
        assert rest.next_page_token == ""
        with pytest.raises(DomainError) as moved:
            await world.service.list_memories(ns, 2, page.next_page_token, "")
        assert reason(moved) == (Code.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")

    async def test_list_filters_by_metadata_and_pages(self, world: World) -> None:
        ns = world.namespace
        tagged = {await world.add(f"T{i}.", metadata={"k": "v", "n": str(i)}) for i in range(3)}
        await world.add("Other value.", metadata={"k": "w"})
        await world.add("No metadata.")
        page = await world.service.list_memories(ns, 2, "", metadata_filter={"k": "v"})
        rest = await world.service.list_memories(
            ns, 2, page.next_page_token, metadata_filter={"k": "v"}
        )
        assert {m.memory_id for m in [*page.memories, *rest.memories]} == tagged
        assert rest.next_page_token == ""
        both = await world.service.list_memories(ns, 10, "", metadata_filter={"k": "v", "n": "1"})
        assert [m.metadata["n"] for m in both.memories] == ["1"]
        with pytest.raises(DomainError) as moved:  # a token of the listing without the filter
            await world.service.list_memories(ns, 2, page.next_page_token)
        assert reason(moved) == (Code.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")
        with pytest.raises(DomainError) as bad:
            await world.service.list_memories(ns, 2, "", metadata_filter={"": "v"})
        assert reason(bad) == (Code.INVALID_ARGUMENT, "INVALID_METADATA")

    async def test_pages_of_a_listing_answer_for_one_time(self, world: World) -> None:
        ns = world.namespace
        for i in range(3):
            await world.add(f"Fact {i}.")
        first = await world.service.list_memories(ns, 2, "", ignore_validity=True)
        with pytest.raises(DomainError) as moved:  # a token of another listing
            await world.service.list_memories(ns, 2, first.next_page_token)
        assert reason(moved) == (Code.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")
        rest = await world.service.list_memories(ns, 2, first.next_page_token, ignore_validity=True)
        assert len(first.memories) + len(rest.memories) == 3 and not rest.next_page_token

    async def test_history_lists_every_revision(self, world: World) -> None:
        ns = world.namespace
        paris, berlin = await self.supersede_paris(world)
        history = (await world.service.list_revisions(ns, str(paris), 0, "")).revisions
        assert [(h.revision, h.kind, h.reason, h.content) for h in history] == [
            (1, "write", "create", PARIS),
            (2, "write", "superseded", PARIS),
        ]
        assert [(h.valid_from_time, h.valid_until_time, h.superseded_by) for h in history] == [
            (entry_time(1), None, None),
            (entry_time(1), entry_time(5), berlin),
        ]
        assert history[0].recorded_at <= history[1].recorded_at
        # Paginated (AIP-158): one at a time, then the end.
        page = await world.service.list_revisions(ns, str(paris), 1, "")
        assert [h.revision for h in page.revisions] == [1] and page.next_page_token
        last = await world.service.list_revisions(ns, str(paris), 1, page.next_page_token)
        assert [h.revision for h in last.revisions] == [2] and not last.next_page_token
        with pytest.raises(DomainError) as moved:
            await world.service.list_revisions(ns, str(berlin), 1, page.next_page_token)
        assert reason(moved) == (Code.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN")
        # A memory that never existed here, or exists in another namespace: NOT_FOUND alike.
        for where, mid in ((ns, uuid.uuid4()), (f"{ns}-other", paris)):
            with pytest.raises(DomainError) as missing:
                await world.service.list_revisions(where, str(mid), 0, "")
            assert reason(missing) == (Code.NOT_FOUND, "MEMORY_NOT_FOUND")
