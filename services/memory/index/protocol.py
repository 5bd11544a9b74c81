"""The vector index's interface (VectorIndex) and its errors; the records it takes and
gives are in model.py, its adapters in edge.py, qdrant/ and pgvector/."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from services.common.errors import StoreUnavailable
from services.memory.index.model import IndexHit, IndexPoint, NamespacedQuery, Tombstone
from services.memory.model import Key


class IndexUnavailable(StoreUnavailable):
    """The index cannot be reached or failed; search degrades, the indexer retries."""

    def __init__(self, detail: str = "") -> None:
        super().__init__("memory_index")
        # Logged by the caller; never sent to clients (the message stays generic).
        self.detail = detail


class IndexMismatch(RuntimeError):
    """An existing collection was made for another vector size or distance: refused."""


class VectorIndex(Protocol):
    """The searchable copy. Failures to reach the engine raise IndexUnavailable."""

    @property
    def name(self) -> str:
        """Adapter name for logs ("edge", "qdrant", "pgvector")."""

    async def start(self) -> None:
        """Create the collection or open it; IndexMismatch if its vector size or distance
        differ. May be called again after close() to reopen."""

    async def upsert(self, points: Sequence[IndexPoint]) -> None:
        """Insert or replace points. A point lands only if the index holds nothing of
        its memory at the same or a newer revision (point or tombstone)."""

    async def delete(self, tombstones: Sequence[Tombstone]) -> None:
        """Replace what the index holds of each memory by a tombstone at the deletion's
        revision, unless it holds a newer revision (the memory was re-created)."""

    async def purge(self, keys: Sequence[Key]) -> None:
        """Remove the points and tombstones of these memories, whatever their revision
        (reindex: points that no live memory backs)."""

    async def prune_tombstones(self, older_than_s: float) -> None:
        """Remove the tombstones written more than `older_than_s` seconds ago."""

    async def search(self, query: NamespacedQuery) -> list[IndexHit]:
        """Nearest neighbours inside the query's namespace, best first."""

    async def keys(self) -> set[Key]:
        """Every (namespace, memory id) with a point (tombstones are not memories):
        reindex and consistency checks only."""

    async def optimize(self) -> None:
        """Build search structures after bulk loads (a no-op where the engine does it)."""

    async def close(self) -> None:
        """Release the engine (idempotent)."""
