"""Behaviour of the memory domain, run against every MemoryStore.

tests/unit runs these cases on the in-memory store, tests/integration on
PostgreSQL: both stores must give the domain the same guarantees. The index
and embedder here are the deterministic fakes of tests/memory/support.py;
the real engines and model are exercised in tests/integration and tests/e2e.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.common.errors import Code, DomainError
from services.common.pagination import PageTokens
from services.memory.config import MemoryConfig
from services.memory.index.model import IndexPoint
from services.memory.model import MemorySource
from services.memory.outbox.indexer import Indexer, Sweeper, reindex
from services.memory.outbox.model import OutboxClaim
from services.memory.search.service import DEFAULT_SEARCH_LIMIT, HEAD_MARGIN
from services.memory.service import MemoryService
from services.memory.store import MemoryStore
from services.memory.writes.inputs import SourceInput
from services.memory.writes.model import MemoryWrite
from tests.memory.support import BruteForceIndex, FixedSources, HashEmbedder
from tests.support.waiting import wait_for


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


class MemoryCases:
    """Subclasses provide a `store` fixture."""

    @pytest.fixture
    def world(self, store: MemoryStore, namespace: str) -> World:
        return World(store, namespace)

    async def test_create_then_compare_and_swap(self, world: World) -> None:
        ns = world.namespace
        written = await world.service.upsert(
            ns, "", "Likes jazz.", world.source(), {"k": "v"}, None
        )
        memory = written.memory
        assert written.created and memory.revision == 1 and memory.memory_id.version == 7
        assert memory.embedding_model == "test/hash-words" and memory.embedding_dimension == 64
        replaced = await world.service.upsert(
            ns, str(memory.memory_id), "Likes bebop.", world.source(), {}, 1
        )
        updated = replaced.memory
        assert not replaced.created and updated.revision == 2 and updated.metadata == {}
        with pytest.raises(DomainError) as conflict:
            await world.service.upsert(ns, str(memory.memory_id), "x", world.source(), {}, 1)
        assert reason(conflict) == (Code.ABORTED, "REVISION_CONFLICT")
        assert conflict.value.metadata["current_revision"] == "2"
        with pytest.raises(DomainError) as exists:
            await world.service.upsert(ns, str(memory.memory_id), "x", world.source(), {}, None)
        assert reason(exists) == (Code.ALREADY_EXISTS, "MEMORY_ALREADY_EXISTS")
        with pytest.raises(DomainError) as missing:
            await world.service.upsert(ns, str(uuid.uuid4()), "x", world.source(), {}, 1)
        assert reason(missing) == (Code.NOT_FOUND, "MEMORY_NOT_FOUND")

    async def test_racing_writers_one_wins(self, world: World) -> None:
        mid = await world.add("Start.")

        async def write(i: int) -> object:
            try:
                return await world.service.upsert(
                    world.namespace, str(mid), f"v{i}", world.source(), {}, 1
                )
            except DomainError as error:
                return error

        results = await asyncio.gather(*(write(i) for i in range(6)))
        errors = [r for r in results if isinstance(r, DomainError)]
        assert len(errors) == 5 and all(e.reason == "REVISION_CONFLICT" for e in errors)

    async def test_sources_are_checked(self, world: World) -> None:
        ns = world.namespace
        elsewhere = world.sources.add(f"{ns}-other", 10)
        cases = [
            (world.source(5, 11), (Code.INVALID_ARGUMENT, "SOURCE_OUT_OF_RANGE")),
            (world.source(5, 4), (Code.INVALID_ARGUMENT, "INVALID_SOURCE_RANGE")),
            (world.source(cid=elsewhere), (Code.NOT_FOUND, "SOURCE_NOT_FOUND")),
            ([], (Code.INVALID_ARGUMENT, "NO_SOURCES")),
            (world.source() * 33, (Code.INVALID_ARGUMENT, "TOO_MANY_SOURCES")),
        ]
        for sources, expected in cases:
            with pytest.raises(DomainError) as error:
                await world.service.upsert(ns, "", "A fact.", sources, {}, None)
            assert reason(error) == expected
        assert await world.store.list_memories(ns, None, None, 10) == []

    async def test_a_source_beyond_the_transcript_says_where_it_ends(self, world: World) -> None:
        with pytest.raises(DomainError) as error:
            await world.service.upsert(
                world.namespace, "", "A fact.", world.source(5, 11), {}, None
            )
        assert error.value.metadata["last_sequence"] == "10"
        assert "through_sequence 11" in error.value.message
        assert "last sequence is 10" in error.value.message

    async def test_delete_leaves_a_tombstone_and_erases_history_content(self, world: World) -> None:
        ns = world.namespace
        mid = await world.add("Secret 1.")
        await world.service.upsert(ns, str(mid), "Secret 2.", world.source(), {}, 1)
        with pytest.raises(DomainError) as stale:
            await world.service.delete(ns, str(mid), 1)
        assert reason(stale) == (Code.ABORTED, "REVISION_CONFLICT")
        assert await world.service.delete(ns, str(mid), 2)
        assert not await world.service.delete(ns, str(mid), None)
        history = await world.store.history(ns, mid)
        assert [(h.revision, h.kind, h.content) for h in history] == [
            (1, "write", None),
            (2, "write", None),
            (3, "delete", None),
        ]
        with pytest.raises(DomainError) as gone:
            await world.service.get(ns, str(mid))
        assert reason(gone) == (Code.NOT_FOUND, "MEMORY_NOT_FOUND")

    async def test_forget_source_by_range_and_whole(self, world: World) -> None:
        ns = world.namespace
        a = await world.add("A.", sources=world.source(1, 2))
        b = await world.add("B.", sources=world.source(5, 6))
        other = world.sources.add(ns, 3)
        c = await world.add("C.", sources=world.source(1, 1, cid=other))
        assert await world.service.forget_source(ns, world.cid, 2, 4) == 1
        assert await world.store.get(ns, a) is None
        assert await world.service.forget_source(ns, world.cid, 0, 0) == 1
        assert await world.store.get(ns, b) is None
        assert await world.store.get(ns, c) is not None
        with pytest.raises(DomainError) as bad:
            await world.service.forget_source(ns, world.cid, 0, 3)
        assert reason(bad) == (Code.INVALID_ARGUMENT, "INVALID_SOURCE_RANGE")

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

    async def test_expired_memories_are_invisible_swept_and_their_ids_reusable(
        self, world: World
    ) -> None:
        ns = world.namespace
        mid = uuid.uuid4()
        past = datetime.now(UTC) - timedelta(seconds=1)
        origin = [MemorySource(uuid.UUID(world.cid), 1, 1)]
        # Written straight to the store: the service refuses a past expiry.
        await world.store.create(MemoryWrite(ns, mid, "Old.", origin, {}, None, past, "m", 1))
        assert await world.store.get(ns, mid) is None
        assert await world.store.list_memories(ns, None, None, 10) == []
        again = await world.add("New.", memory_id=mid)
        assert again == mid
        assert (await world.service.get(ns, str(mid))).revision == 3  # after the tombstone
        other = uuid.uuid4()
        await world.store.create(
            MemoryWrite(
                ns,
                other,
                "Old.",
                [MemorySource(uuid.UUID(world.cid), 1, 1)],
                {},
                None,
                past,
                "m",
                1,
            )
        )
        swept = await Sweeper(world.store, world.config, lambda: None).run_once()
        assert swept >= 1
        assert [h.reason for h in await world.store.history(ns, other)] == ["create", "expired"]

    async def test_default_ttl_per_namespace(self, world: World) -> None:
        ttl_ns = f"{world.namespace}-ttl"
        cid = world.sources.add(ttl_ns, 2)
        before = datetime.now(UTC)
        memory = (
            await world.service.upsert(
                ttl_ns, "", "Short-lived.", [SourceInput(cid, 1, 1)], {}, None
            )
        ).memory
        after = datetime.now(UTC)
        assert memory.expire_time is not None
        # The namespace's TTL counted from the moment of the write, wherever it fell.
        assert before + timedelta(hours=1) <= memory.expire_time <= after + timedelta(hours=1)
        stored = await world.service.get(ttl_ns, str(memory.memory_id))
        assert stored.expire_time == memory.expire_time
        plain = await world.service.get(world.namespace, str(await world.add("Forever.")))
        assert plain.expire_time is None

    async def test_search_rereads_and_degrades(self, world: World) -> None:
        ns = world.namespace
        keep = await world.add("the cat sleeps on the red sofa", metadata={"room": "living"})
        drop = await world.add("the cat eats fish in the kitchen", metadata={"room": "kitchen"})
        await world.drain()
        found = await world.service.search(ns, "cat sofa", 5)
        assert found.hits[0].memory.memory_id == keep and not found.degraded
        only_kitchen = await world.service.search(ns, "cat", 5, {"room": "kitchen"})
        assert [h.memory.memory_id for h in only_kitchen.hits] == [drop]
        # Deleted but not yet applied to the index: never returned.
        await world.service.delete(ns, str(drop), None)
        assert (ns, drop) in world.index.points
        found = await world.service.search(ns, "cat eats fish kitchen", 5)
        assert drop not in {h.memory.memory_id for h in found.hits}
        # Index down: writes succeed, search degrades to full text.
        world.index.down = True
        await world.add("a dog barks at the postman")
        with pytest.raises(DomainError):
            await world.drain()
        degraded = await world.service.search(ns, "dog postman", 5)
        assert degraded.degraded and len(degraded.hits) == 1
        world.index.down = False
        await world.drain()
        assert (await world.store.backlog()).depth == 0
        live = {(m.namespace, m.memory_id) for m in await world.store.scan(None, 1000)}
        assert {k for k in world.index.points if k[0] == ns} == {k for k in live if k[0] == ns}

    async def _ranked(self, world: World, count: int, word: str) -> list[uuid.UUID]:
        """`count` memories, each scoring higher against `word` than the one before."""
        made = [await world.add(" ".join([word] * i + [f"z{i}q"])) for i in range(1, count + 1)]
        await world.drain()
        return made

    @staticmethod
    def _count_reads(world: World) -> list[int]:
        """The number of ids each of the store's get_many calls re-reads, from now on."""
        reads: list[int] = []
        get_many = world.store.get_many

        async def counted(namespace: str, ids: Sequence[uuid.UUID], *args: Any, **kw: Any) -> Any:
            reads.append(len(ids))
            return await get_many(namespace, ids, *args, **kw)

        world.store.get_many = counted  # type: ignore[method-assign,assignment]
        return reads

    async def test_search_rereads_only_the_head_when_it_settles_the_answer(
        self, world: World
    ) -> None:
        made = await self._ranked(world, 30, "roses")
        reads = self._count_reads(world)
        found = await world.service.search(world.namespace, "roses", 3, mode="dense")
        assert [h.memory.memory_id for h in found.hits] == made[::-1][:3]
        # Not every candidate the index gave (3 * overfetch + 8): the best hits alone.
        assert reads == [3 + HEAD_MARGIN]

    async def test_search_fills_a_head_the_index_lags_behind_from_the_tail(
        self, world: World
    ) -> None:
        made = await self._ranked(world, 20, "tulips")
        # The best four deleted; the index still holds them (the indexer has not run).
        for memory_id in made[-4:]:
            assert await world.service.delete(world.namespace, str(memory_id), None)
        reads = self._count_reads(world)
        found = await world.service.search(world.namespace, "tulips", 3, mode="dense")
        assert [h.memory.memory_id for h in found.hits] == made[-5:-8:-1]
        # The head (3 + 2) kept one live memory; the rest of the 14 candidates was read.
        assert reads == [3 + HEAD_MARGIN, 14 - 3 - HEAD_MARGIN]

    async def test_search_validates_its_request(self, world: World) -> None:
        ns = world.namespace
        for kwargs, expected in (
            ({"limit": -1}, "INVALID_LIMIT"),
            ({"limit": 257}, "INVALID_LIMIT"),
            ({"query": ""}, "INVALID_QUERY"),
            ({"min_score": 1.5}, "INVALID_MIN_SCORE"),
            ({"min_score": float("nan")}, "INVALID_MIN_SCORE"),
        ):
            args: dict[str, object] = {"query": "q", "limit": 5, **kwargs}
            with pytest.raises(DomainError) as error:
                await world.service.search(ns, **args)  # type: ignore[arg-type]
            assert reason(error) == (Code.INVALID_ARGUMENT, expected)

    async def test_search_limit_zero_means_the_default(self, world: World) -> None:
        """AIP-158: 0 is the field's default, not an error."""
        for i in range(DEFAULT_SEARCH_LIMIT + 2):
            await world.add(f"Fact number {i} about the kitchen.")
        await world.drain()
        found = await world.service.search(world.namespace, "kitchen fact", 0)
        assert len(found.hits) == DEFAULT_SEARCH_LIMIT

    async def test_outbox_claims_are_disjoint_and_expire(self, world: World) -> None:
        """Two claims never share a row; an expired claim is claimable again, and the
        old claimant can then no longer complete those rows; a release gives them back."""
        ids = [await world.add(f"Fact {i}.") for i in range(3)]
        first = await world.store.claim_outbox(2, 60)
        second = await world.store.claim_outbox(10, 0.05)
        assert first is not None and second is not None
        assert first.token != second.token
        assert [e.memory_id for e in [*first.entries, *second.entries]] == ids
        assert set(first.current) == {(world.namespace, i) for i in ids[:2]}
        assert await world.store.claim_outbox(10, 60) is None
        # The second claim lapses: its row is claimable again, under a new token.
        third: OutboxClaim | None = None

        async def reclaimed() -> bool:
            nonlocal third
            third = await world.store.claim_outbox(10, 60)
            return third is not None

        await wait_for(reclaimed)
        assert third is not None and [e.memory_id for e in third.entries] == ids[2:]
        assert await world.store.complete_outbox(second, [], "m", 1) == 0  # lost
        assert await world.store.complete_outbox(first, [], "m", 1) == 2
        await world.store.release_outbox(third)
        again = await world.store.claim_outbox(10, 60)
        assert again is not None and [e.memory_id for e in again.entries] == ids[2:]
        assert await world.store.complete_outbox(again, [], "m", 1) == 1
        assert (await world.store.backlog()).depth == 0

    async def test_an_outbox_claim_carries_the_revision_of_a_deletion(self, world: World) -> None:
        ns = world.namespace
        kept = await world.add("Kept.")
        gone = await world.add("Gone.")
        await world.service.upsert(ns, str(gone), "Gone, corrected.", world.source(), {}, 1)
        await world.service.delete(ns, str(gone), 2)
        claim = await world.store.claim_outbox(10, 60)
        assert claim is not None
        assert {k: m.revision for k, m in claim.current.items()} == {(ns, kept): 1}
        assert claim.deleted == {(ns, gone): 3}  # the tombstone of revision 2
        await world.store.release_outbox(claim)
        await world.drain()
        # The indexer left a tombstone at 3: a late write of revision 2 cannot land,
        # the memory's re-creation (revision 4) can.
        assert world.index.tombstones[(ns, gone)][0] == 3
        late = IndexPoint(ns, gone, 2, world.embedder.vector("Gone, corrected."), {})
        await world.index.upsert([late])
        assert (ns, gone) not in world.index.points
        await world.add("Gone, again.", memory_id=gone)
        await world.drain()
        assert world.index.points[(ns, gone)].revision == 4

    async def test_the_sweeper_prunes_index_tombstones_past_their_retention(
        self, world: World
    ) -> None:
        gone = await world.add("Soon gone.")
        await world.drain()
        await world.service.delete(world.namespace, str(gone), None)
        await world.drain()
        key = (world.namespace, gone)
        assert key in world.index.tombstones
        await Sweeper(world.store, world.config, lambda: None, world.index).prune_tombstones()
        assert key in world.index.tombstones  # younger than the default day
        config = replace(world.config, index_tombstone_retention=timedelta(0))
        await Sweeper(world.store, config, lambda: None, world.index).prune_tombstones()
        assert key not in world.index.tombstones

    async def test_reindex_after_a_model_change(self, world: World) -> None:
        ns = world.namespace
        mid = await world.add("the owl hunts at night")
        await world.drain()

        class NewModel(HashEmbedder):
            model = "test/new-model"

        new = NewModel()
        fresh_index = BruteForceIndex(new.dimension)
        indexed, _ = await reindex(world.store, fresh_index, new)
        assert indexed >= 1 and (ns, mid) in fresh_index.points
        memory = await world.service.get(ns, str(mid))
        assert memory.embedding_model == "test/new-model"

    async def test_a_request_id_stores_once_and_replays_the_first_result(
        self, world: World
    ) -> None:
        ns = world.namespace

        async def upsert(
            content: str, request_id: str = "r-1", **kw: object
        ) -> tuple[object, bool]:
            written = await world.service.upsert(
                ns,
                str(kw.pop("memory_id", "")),
                content,
                world.source(),
                {},
                kw.pop("expected_revision", None),  # type: ignore[arg-type]
                ttl=timedelta(hours=1),
                request_id_text=request_id,
            )
            return written.memory, written.created

        first, created = await upsert("The user likes tea.")
        # Racing and sequential retries of the same request: the same memory, one row.
        again = await asyncio.gather(*(upsert("The user likes tea.") for _ in range(5)))
        assert created and all(m == first and c for m, c in again)
        page = await world.service.list_memories(ns, 0, "")
        assert [m.memory_id for m in page.memories] == [first.memory_id]  # type: ignore[attr-defined]
        with pytest.raises(DomainError) as reused:
            await upsert("The user likes coffee.")
        assert reason(reused) == (Code.INVALID_ARGUMENT, "REQUEST_ID_REUSED")
        # A later change does not alter what the first request returns.
        mid = str(first.memory_id)  # type: ignore[attr-defined]
        await upsert("The user likes green tea.", "r-2", memory_id=mid, expected_revision=1)
        replayed, created_again = await upsert("The user likes tea.")
        assert replayed.content == "The user likes tea." and replayed.revision == 1  # type: ignore[attr-defined]
        assert created_again
        # Deleted: the replay finds nothing (and never brings the content back).
        await world.service.delete(ns, mid, None)
        with pytest.raises(DomainError) as gone:
            await upsert("The user likes tea.")
        assert reason(gone) == (Code.NOT_FOUND, "MEMORY_NOT_FOUND")
        assert (await world.service.list_memories(ns, 0, "")).memories == []

    async def test_an_erasure_fences_writes_checked_against_the_erased_incarnation(
        self, world: World
    ) -> None:
        """The source check ran (incarnation 1), then the conversation was erased: the
        write is refused, so nothing derived from the erased conversation survives."""
        ns, cid = world.namespace, uuid.UUID(world.cid)
        write = MemoryWrite(
            ns,
            uuid.uuid4(),
            "Checked before the erasure.",
            [MemorySource(cid, 1, 2)],
            {},
            None,
            None,
            "m",
            1,
            source_incarnations={cid: 1},
        )
        await world.service.forget_source(ns, world.cid, 0, 0, incarnation=1)
        with pytest.raises(DomainError) as fenced:
            await world.store.create(write)
        assert reason(fenced) == (Code.NOT_FOUND, "SOURCE_NOT_FOUND")
        assert await world.store.get(ns, write.memory_id) is None
        # The id made again has another incarnation: its memories are stored.
        made = await world.store.create(replace(write, source_incarnations={cid: 2}))
        assert made.created and made.memory.content == "Checked before the erasure."
        with pytest.raises(DomainError) as range_too:
            await world.service.forget_source(ns, world.cid, 1, 2, incarnation=2)
        assert reason(range_too) == (Code.INVALID_ARGUMENT, "INVALID_INCARNATION")
