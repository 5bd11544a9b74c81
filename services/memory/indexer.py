"""Background work: the outbox indexer, the expiry sweeper, and reindex.

The indexer applies outbox rows in order. For each memory a batch names, it
makes the index match the memory's state in PostgreSQL at that moment:
present -> embed and upsert; gone -> delete. A batch leaves the outbox only
after the index accepted it; on failure it stays, and the indexer retries
with exponential backoff (with jitter), so an index outage loses nothing
and the index catches up when it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence

from services.common import metrics
from services.common.backoff import backoff
from services.common.errors import StoreUnavailable
from services.memory.config import MemoryConfig
from services.memory.embeddings import Embedder
from services.memory.index import IndexPoint, Key, VectorIndex
from services.memory.model import Memory
from services.memory.store import MemoryStore

log = logging.getLogger(__name__)


def to_point(memory: Memory, vector: Sequence[float]) -> IndexPoint:
    """The index form of a memory."""
    return IndexPoint(
        memory.namespace, memory.memory_id, memory.revision, vector, dict(memory.metadata)
    )


class _Background:
    """A `run()` loop started and stopped as one background task."""

    task_name = "memory-background"
    _task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        """Run in the background."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=self.task_name)

    async def stop(self) -> None:
        """Cancel the background loop (idempotent)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class Indexer(_Background):
    """Drains the outbox into the vector index."""

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
        """Apply one batch of the outbox; return how many rows it removed (0: empty or busy)."""
        # Reopens the index after an outage (a no-op while it is open).
        await self.index.start()
        async with self.store.claim_outbox(self.config.indexer_batch) as claim:
            if claim is None or not claim.entries:
                return 0
            keys: list[Key] = list(dict.fromkeys((e.namespace, e.memory_id) for e in claim.entries))
            present = [claim.current[k] for k in keys if k in claim.current]
            gone = [k for k in keys if k not in claim.current]
            vectors = await self.embedder.embed([m.content for m in present])
            await self.index.upsert([to_point(m, v) for m, v in zip(present, vectors, strict=True)])
            await self.index.delete(gone)
            model, dimension = self.embedder.model, self.embedder.dimension
            reembedded = [
                (m.namespace, m.memory_id)
                for m in present
                if (m.embedding_model, m.embedding_dimension) != (model, dimension)
            ]
            await claim.complete(reembedded, model, dimension)
            return len(claim.entries)

    async def update_backlog_metrics(self) -> None:
        """Publish the outbox depth and age."""
        backlog = await self.store.backlog()
        metrics.MEMORY_INDEX_LAG.set(backlog.depth)
        metrics.MEMORY_INDEX_OLDEST_AGE.set(backlog.oldest_age_s)

    async def run(self) -> None:
        """Loop until cancelled: drain, then wait for a write or the poll interval."""
        delay = 0.0
        while True:
            # Cleared before draining: a write during the drain sets it again.
            self._wakeup.clear()
            try:
                while await self.run_once():
                    pass
                if not self.index_healthy:
                    log.info("memory index reachable again; outbox drained")
                self.index_healthy = True
                self.failures = 0
                delay = 0.0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                store = exc.store if isinstance(exc, StoreUnavailable) else "memory_index"
                metrics.STORE_ERRORS.labels(store).inc()
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
                    self.failures,
                    base_s=0.05,
                    max_s=self.config.indexer_backoff_max_s,
                    jitter=0.5,
                    max_exponent=20,
                )
            with contextlib.suppress(Exception):
                await self.update_backlog_metrics()
            if delay:
                # Backing off: a write must not cut the wait short.
                await asyncio.sleep(delay)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=self.config.indexer_poll_s)


class Sweeper(_Background):
    """Erases expired memories in the background."""

    task_name = "memory-sweeper"

    def __init__(
        self, store: MemoryStore, config: MemoryConfig, on_erase: Callable[[], None]
    ) -> None:
        self.store = store
        self.config = config
        self.on_erase = on_erase

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

    async def run(self) -> None:
        while True:
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("memory expiry sweep failed", extra={"error": type(exc).__name__})
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
    await index.delete(orphans)
    await index.optimize()
    return indexed, len(orphans)
