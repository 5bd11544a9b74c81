"""Background work: the outbox indexer, the expiry sweeper, and reindex.

An indexer claims a batch of the oldest outbox rows under a short lease (the
claim is written on the rows; no transaction stays open), and for each
memory the batch names makes the index match the memory's state in
PostgreSQL, read after the claim: present -> embed and upsert at its
revision; gone -> a tombstone at the revision of its deletion. Then it
deletes the rows that still carry its claim. On failure the rows are given
back, and the indexer retries with exponential backoff (with jitter), so an
index outage loses nothing and the index catches up when it returns.

Several indexers (RUNIFOLD_MEMORY_INDEXERS loops per process, any number of
processes) take disjoint batches. Two batches may name the same memory, and
an indexer whose lease ended may still write late: the index's revision
guard (services/memory/index) keeps the newest revision whatever the order,
and a tombstone keeps an older write from bringing a deleted memory back.
An indexer whose lease ended before it wrote drops its batch (another
indexer may hold the rows by then).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence

from services.common import metrics as common_metrics
from services.common.background import Background
from services.common.backoff import backoff
from services.common.errors import StoreUnavailable
from services.memory import metrics
from services.memory.config import MemoryConfig
from services.memory.embeddings.protocol import Embedder
from services.memory.index.model import IndexPoint, Tombstone
from services.memory.index.protocol import VectorIndex
from services.memory.model import Key, Memory
from services.memory.outbox.model import OutboxClaim
from services.memory.search import lexical
from services.memory.store import MemoryStore

log = logging.getLogger(__name__)


def to_point(memory: Memory, vector: Sequence[float]) -> IndexPoint:
    """The index form of a memory (its valid time in Unix seconds, its lexical vector)."""
    start = memory.valid_from_time or memory.create_time
    end = memory.valid_until_time
    return IndexPoint(
        memory.namespace,
        memory.memory_id,
        memory.revision,
        vector,
        dict(memory.metadata),
        valid_from=start.timestamp(),
        valid_until=end.timestamp() if end is not None else None,
        lexical=lexical.document(memory.content),
    )


class Indexer(Background):
    """Drains the outbox into the vector index with `config.indexers` loops."""

    task_name = "memory-indexer"

    def __init__(
        self,
        store: MemoryStore,
        index: VectorIndex,
        embedder: Embedder,
        config: MemoryConfig,
    ) -> None:
        self.store = store
        self.index = index
        self.embedder = embedder
        self.config = config
        self._wakeup = asyncio.Event()
        self.failures = 0
        self.index_healthy = True

    def wake(self) -> None:
        """Something was written: look at the outbox now rather than at the next poll."""
        self._wakeup.set()

    async def run_once(self) -> int:
        """Claim one batch of the outbox and apply it; return its size (0: nothing to claim)."""
        # Reopens the index after an outage (a no-op while it is open).
        await self.index.start()
        lease_s = self.config.indexer_claim_s
        # Read before the claim is made, so the claim ends no earlier than this.
        deadline = time.monotonic() + lease_s
        claim = await self._claim(lease_s)
        if claim is None:
            return 0
        try:
            await self._apply(claim, deadline)
        except BaseException:
            # Give the rows back at once (else they wait for the lease to end).
            with contextlib.suppress(Exception):
                await self.store.release_outbox(claim)
            raise
        return len(claim.entries)

    async def _claim(self, lease_s: float) -> OutboxClaim | None:
        """Claim a batch; cancelled meanwhile (a shutdown), the claim, if it was made,
        is given back rather than left to hold its rows until the lease ends."""
        claiming = asyncio.ensure_future(
            self.store.claim_outbox(self.config.indexer_batch, lease_s)
        )
        try:
            return await asyncio.shield(claiming)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                claim = await claiming
                if claim is not None:
                    await self.store.release_outbox(claim)
            raise

    async def _apply(self, claim: OutboxClaim, deadline: float) -> None:
        keys: list[Key] = list(dict.fromkeys((e.namespace, e.memory_id) for e in claim.entries))
        present = [claim.current[k] for k in keys if k in claim.current]
        gone = [Tombstone(k[0], k[1], claim.deleted[k]) for k in keys if k in claim.deleted]
        vectors = await self.embedder.embed([m.content for m in present])
        if time.monotonic() >= deadline:
            # Another indexer may hold these rows now. Writing anyway would be safe
            # (the index refuses older revisions), but it is its batch now.
            log.warning(
                "memory indexer claim expired before the index write; batch dropped",
                extra={"rows": len(claim.entries), "claim_s": self.config.indexer_claim_s},
            )
            return
        await self.index.upsert([to_point(m, v) for m, v in zip(present, vectors, strict=True)])
        await self.index.delete(gone)
        model, dimension = self.embedder.model, self.embedder.dimension
        reembedded = [
            (m.namespace, m.memory_id)
            for m in present
            if (m.embedding_model, m.embedding_dimension) != (model, dimension)
        ]
        await self.store.complete_outbox(claim, reembedded, model, dimension)

    async def update_backlog_metrics(self) -> None:
        """Publish the outbox depth and age."""
        backlog = await self.store.backlog()
        metrics.MEMORY_OUTBOX_DEPTH.set(backlog.depth)
        metrics.MEMORY_INDEX_LAG.set(backlog.depth)
        metrics.MEMORY_INDEX_OLDEST_AGE.set(backlog.oldest_age_s)

    async def run(self) -> None:
        """Run `config.indexers` loops (at least one) until cancelled."""
        loops = max(1, self.config.indexers)
        await asyncio.gather(*(self._loop(publishes=i == 0) for i in range(loops)))

    async def _loop(self, *, publishes: bool) -> None:
        """Drain, then wait for a write or the poll interval; back off on failures."""
        failures = 0
        while True:
            # Cleared before draining: a write during the drain sets it again.
            self._wakeup.clear()
            delay = 0.0
            try:
                while await self.run_once():
                    pass
                if not self.index_healthy:
                    log.info("memory index reachable again; outbox drained")
                self.index_healthy = True
                failures = self.failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self.failures += 1
                store = exc.store if isinstance(exc, StoreUnavailable) else "memory_index"
                common_metrics.STORE_ERRORS.labels(store).inc()
                if self.index_healthy or self.failures % 20 == 0:
                    log.warning(
                        "memory indexer failed; retrying with backoff",
                        extra={
                            "store": store,
                            "failures": self.failures,
                            "error": type(exc).__name__,
                            "detail": getattr(exc, "detail", ""),
                        },
                    )
                self.index_healthy = False
                delay = backoff(
                    failures,
                    base_s=0.05,
                    max_s=self.config.indexer_backoff_max_s,
                    jitter=0.5,
                    max_exponent=20,
                )
            if publishes:
                with contextlib.suppress(Exception):
                    await self.update_backlog_metrics()
            if delay:
                # Backing off: a write must not cut the wait short.
                await asyncio.sleep(delay)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=self.config.indexer_poll_s)


class Sweeper(Background):
    """Erases expired memories, and index tombstones past their retention, in the background."""

    task_name = "memory-sweeper"

    def __init__(
        self,
        store: MemoryStore,
        config: MemoryConfig,
        on_erase: Callable[[], None],
        index: VectorIndex | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.on_erase = on_erase
        self.index = index

    async def run_once(self) -> int:
        """Erase every expired memory, a batch at a time; return how many."""
        total = 0
        while True:
            erased = await self.store.sweep_expired(self.config.sweep_batch)
            total += erased
            if erased < self.config.sweep_batch:
                break
        await self.store.sweep_requests(self.config.request_id_retention_s)
        if total:
            self.on_erase()
            log.info("expired memories erased", extra={"count": total})
        return total

    async def prune_tombstones(self) -> None:
        """Remove the index's tombstones older than RUNIFOLD_MEMORY_INDEX_TOMBSTONE_RETENTION."""
        if self.index is not None:
            await self.index.prune_tombstones(self.config.index_tombstone_retention.total_seconds())

    async def run(self) -> None:
        while True:
            for work, what in (
                (self.run_once, "memory expiry sweep failed"),
                (self.prune_tombstones, "memory index tombstone pruning failed"),
            ):
                try:
                    await work()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning(what, extra={"error": type(exc).__name__})
            await asyncio.sleep(self.config.sweep_interval_s)


async def reindex(
    store: MemoryStore,
    index: VectorIndex,
    embedder: Embedder,
    *,
    batch: int = 256,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, int]:
    """Rebuild the index from PostgreSQL: re-embed and upsert every live memory with the
    configured model, then delete index points that no live memory backs.

    The outbox is left alone: a write committed while the rebuild ran may not
    be in the scan, and replaying a row only re-applies a memory's current
    state. Returns (memories indexed, orphans deleted).
    """
    indexed = 0
    seen: set[Key] = set()
    after: Key | None = None
    while True:
        memories = await store.scan(after, batch)
        if not memories:
            break
        vectors = await embedder.embed([m.content for m in memories])
        await index.upsert([to_point(m, v) for m, v in zip(memories, vectors, strict=True)])
        keys = [(m.namespace, m.memory_id) for m in memories]
        await store.set_embedding(keys, embedder.model, embedder.dimension)
        seen.update(keys)
        indexed += len(memories)
        after = keys[-1]
        if progress is not None:
            progress(len(memories))
    orphans = [key for key in await index.keys() if key not in seen]
    # A memory created during the rebuild is not in `seen` but is live: keep it.
    if orphans:
        by_namespace: defaultdict[str, list[uuid.UUID]] = defaultdict(list)
        for namespace, memory_id in orphans:
            by_namespace[namespace].append(memory_id)
        live = set()
        for namespace, ids in by_namespace.items():
            live |= {(namespace, m.memory_id) for m in await store.get_many(namespace, ids, {})}
        orphans = [key for key in orphans if key not in live]
    await index.purge(orphans)
    await index.optimize()
    return indexed, len(orphans)
