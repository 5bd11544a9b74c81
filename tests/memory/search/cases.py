"""SearchMemories (the re-read from the store, the degraded full-text mode, valid time),
run against every MemoryStore.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from services.common.errors import Code, DomainError
from services.memory.index.model import IndexHit, NamespacedQuery, Term, ValidAt
from services.memory.search.service import DEFAULT_SEARCH_LIMIT, HEAD_MARGIN
from services.memory.writes.inputs import ValidityInput
from tests.memory.cases import World, WorldCases, reason
from tests.memory.support import entry_time


class SearchCases(WorldCases):
    """Subclasses provide a `store` fixture."""

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

    async def test_supersede_then_search_now_before_and_after(self, world: World) -> None:
        paris, berlin = await self.supersede_paris(world)
        # Now: only the fact that holds.
        assert await self.found(world) == [berlin]
        # As of before the change: Paris; as of after: Berlin; before either: nothing.
        assert await self.found(world, as_of=entry_time(3)) == [paris]
        assert await self.found(world, as_of=entry_time(5)) == [berlin]
        assert await self.found(world, as_of=entry_time(9)) == [berlin]
        assert await self.found(world, as_of=entry_time(0)) == []
        # The degraded (full-text) search answers for the same times.
        world.index.down = True
        degraded = await world.service.search(world.namespace, "user lives", 5)
        assert degraded.degraded and [h.memory.memory_id for h in degraded.hits] == [berlin]
        earlier = await world.service.search(world.namespace, "user lives", 5, as_of=entry_time(3))
        assert [h.memory.memory_id for h in earlier.hits] == [paris]

    async def test_search_asks_the_index_for_the_facts_valid_at_the_time_asked(
        self, world: World
    ) -> None:
        """Forty facts no longer valid, nearer the query than the one that holds: the index
        is asked once, with the valid-time term, and answers the fact that holds. With the
        filter off the store's re-read alone drops the others: the same answer, after the
        service widened its request to the index twice."""
        ns = world.namespace
        for i in range(40):
            await world.add(
                f"The user lives in Paris {i}.",
                sources=world.source(1, 1),
                validity=ValidityInput(valid_until_time=entry_time(2)),
            )
        holds = await world.add("The user lives in Rome.", sources=world.source(3, 3))
        await world.drain()
        asked: list[NamespacedQuery] = []
        search = world.index.search

        async def counted(query: NamespacedQuery) -> list[IndexHit]:
            asked.append(query)
            return await search(query)

        world.index.search = counted  # type: ignore[method-assign]
        found = await world.service.search(ns, "the user lives in paris", 1)
        assert [h.memory.memory_id for h in found.hits] == [holds]
        assert len(asked) == 1 and isinstance(asked[0].terms[-1], ValidAt)
        assert asked[0].terms[0] == Term("namespace", ns)
        earlier = await world.service.search(ns, "the user lives in paris", 1, as_of=entry_time(1))
        assert earlier.hits[0].memory.memory_id != holds
        assert asked[-1].terms[-1] == ValidAt(entry_time(1).timestamp())
        asked.clear()
        world.service.config = replace(world.config, index_validity_filter=False)
        unfiltered = await world.service.search(ns, "the user lives in paris", 1)
        assert [h.memory.memory_id for h in unfiltered.hits] == [holds]
        assert len(asked) == 3 and not any(isinstance(t, ValidAt) for t in asked[0].terms)
