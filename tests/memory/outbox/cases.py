"""The outbox (claims, the revisions they carry), the sweeper and reindex, run against
every MemoryStore.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from services.memory.index.model import IndexPoint
from services.memory.outbox.indexer import Sweeper, reindex
from services.memory.outbox.model import OutboxClaim
from tests.memory.cases import World, WorldCases
from tests.memory.support import BruteForceIndex, HashEmbedder
from tests.support.waiting import wait_for


class OutboxCases(WorldCases):
    """Subclasses provide a `store` fixture."""

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
